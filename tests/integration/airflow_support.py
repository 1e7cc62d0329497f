"""Helpers for the Airflow tests: the metadata database and dag.test() in a process."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.airflow_stack import PROJECT_ROOT, airflow_environment
from harness.services import S3Endpoint, free_port

DRIVER = Path(__file__).with_name("dagtest_driver.py")


def migrate(home: Path, bootstrap: str, s3: S3Endpoint) -> None:
    """Create the Airflow metadata database (SQLite) in ``home``: a copy of one migrated
    database per test run, made by the first test worker that needs it (`airflow db
    migrate` is 15-20 s of CPU, and the suite is bound by its CPU)."""
    home.mkdir(parents=True, exist_ok=True)
    run_root = next(
        (
            p
            for p in home.parents
            if p.name.startswith("pytest-") and p.parent.name.startswith("pytest-of-")
        ),
        None,
    )
    if run_root is None:  # not under pytest's temporary folder: migrate in place
        _migrate(home, bootstrap, s3)
        return
    template = run_root / "airflow-db-template"
    template.mkdir(exist_ok=True)
    with open(template / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other test workers wait for the first
        if not (template / "airflow.db").exists():
            _migrate(template, bootstrap, s3)
    shutil.copy(template / "airflow.db", home / "airflow.db")


def _migrate(home: Path, bootstrap: str, s3: S3Endpoint) -> None:
    env = airflow_environment(home, free_port(), bootstrap, s3, "unused")
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def dag_test(
    home: Path,
    bootstrap: str,
    s3: S3Endpoint,
    dag_file: str,
    runs: list[dict[str, Any]],
    env: dict[str, str],
    timeout: float = 600,
    output: list[str] | None = None,
    spark_connect: str | None = None,
) -> list[dict[str, Any]]:
    """Run ``runs`` (dag_id, conf, logical_date, touch) with dag.test(); their results.

    The API connection points at a closed port: there is no API server under dag.test().
    With ``output``, the process's stdout and stderr (the task logs) are appended to it.
    ``spark_connect`` (``sc://host:port``) becomes connection ``spark_connect_default``.
    """
    environment = airflow_environment(
        home, free_port(), bootstrap, s3, "unused", env, spark_connect=spark_connect
    )
    request = {"dag_file": str(PROJECT_ROOT / "dags" / dag_file), "runs": runs}
    done = subprocess.run(
        [sys.executable, str(DRIVER), json.dumps(request)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if output is not None:
        output.append(done.stdout + done.stderr)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-6000:]
    return json.loads(lines[-1][len("RESULT ") :])
