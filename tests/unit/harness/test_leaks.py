"""The credential scan over a run's logs: it names the file and the secret, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.leaks import find_leaks, log_files


def test_a_secret_in_a_task_log_is_found_by_name(tmp_path: Path) -> None:
    task = tmp_path / "logs" / "dag_id=d" / "run_id=r" / "task_id=t"
    task.mkdir(parents=True)
    (task / "attempt=1.log").write_text("connecting with key s3cr3t-value-1234 to S3\n")
    (tmp_path / "airflow.cfg").write_text("secret = s3cr3t-value-1234\n")  # not a log
    (tmp_path / "seaweedfs.out").write_text("GET /bucket 200\n")
    secrets = {"S3 secret key": "s3cr3t-value-1234", "password": "another-long-one"}
    assert [p.name for p in log_files([tmp_path, tmp_path / "absent"])] == [
        "attempt=1.log",
        "seaweedfs.out",
    ]
    assert find_leaks([tmp_path], secrets) == [f"{task / 'attempt=1.log'}: S3 secret key"]
    (task / "attempt=1.log").write_text("connecting to S3\n")
    assert find_leaks([tmp_path], secrets) == []


def test_a_secret_too_short_to_search_for_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"secrets \['pin'\] are too short"):
        find_leaks([tmp_path], {"pin": "1234"})
