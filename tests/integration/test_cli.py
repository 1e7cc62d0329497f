"""The ``microcheckpoint`` command line as a person uses it: the installed console script,
run against the local broker and a checkpoint folder, with the exact output checked."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from examples import wordcount
from tests.integration.cli_support import SCRIPT, cli, cli_env

pytestmark = pytest.mark.integration


def as_json(env: dict[str, str], *args: str) -> dict:
    return json.loads(cli(env, *args, "--json").stdout)


def test_the_cli_lists_shows_savepoints_verifies_exports_restores_and_runs(
    tmp_path: Path, kafka_bootstrap: str, spark_connect_url: str
) -> None:
    assert SCRIPT.is_file(), "pip install -e . installs the console script"
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    lines = wordcount.lines_for(40, seed=3)
    wordcount.produce(kafka_bootstrap, topic, lines)
    storage = (tmp_path / "chk").as_uri()
    env = cli_env(storage, topic, kafka_bootstrap, spark_connect_url)
    run = ["run", "--module", "examples.wordcount:pipeline", "--config"]
    settings = '{"max_records_per_epoch": 12, "retained": 3}'
    first = cli(env, *run, settings)
    assert first.stdout == "checkpoint 1 completed: 24 records (attempt 1)\n"
    second = cli(env, *run, settings)
    assert second.stdout == "checkpoint 2 completed: 16 records (attempt 1)\n"

    # list: the two checkpoints, newest first, and no savepoint yet.
    history = as_json(env, "list")
    assert [(r["id"], r["status"], r["records"]) for r in history["checkpoints"]] == [
        (2, "COMPLETED", 16),
        (1, "COMPLETED", 24),
    ]
    assert history["savepoints"] == []
    table = cli(env, "list").stdout
    assert f"checkpoints of wordcount ({storage})" in table
    assert table.count("COMPLETED") == 2 and "savepoints: 0" in table

    # show: offsets and state files of checkpoint 2.
    shown = as_json(env, "show", "2")
    assert shown["offsets"] == {f"{topic}:0": 20, f"{topic}:1": 20}
    assert {f["task"] for f in shown["state_files"]} == {"word-counts#0", "word-counts#1"}
    assert shown["statistics"]["checkpoint_id"] == 2

    # savepoint, then verify it against Kafka.
    url = cli(env, "savepoint").stdout.strip()
    assert url.startswith(f"{storage}/wordcount/savepoints/savepoint-0000000002-")
    assert as_json(env, "list")["savepoints"] == [url]
    verified = as_json(env, "verify", url)
    assert verified["ok"] is True and verified["point"] == url
    assert [c["check"] for c in verified["checks"] if c["check"].startswith(topic)] == [
        f"{topic}:0",
        f"{topic}:1",
    ]
    assert "VERIFIED" in cli(env, "verify", url).stdout

    # state export: the counts as a table.
    target = tmp_path / "counts.parquet"
    exported = cli(env, "state", "export", "--uid", "word-counts", "--to", str(target))
    truth = wordcount.expected(lines)
    assert exported.stdout == f"wrote {len(truth)} keys of word-counts to {target}\n"
    rows = pq.read_table(target).to_pylist()
    assert {json.loads(r["key"]): json.loads(r["state"]) for r in rows} == dict(truth)

    # restore checkpoint 1 with 3 subtasks; the next run re-reads from its offsets.
    restored = cli(env, "restore", "1", "--parallelism", "3")
    assert restored.stdout == f"restored wordcount from {storage}/wordcount/chk-0000000001\n"
    third = cli(env, *run, '{"retained": 3}')
    assert third.stdout == "checkpoint 3 completed: 16 records (attempt 1)\n"
    tasks = {f["task"] for f in as_json(env, "show", "3")["state_files"]}
    assert tasks == {"word-counts#0", "word-counts#1", "word-counts#2"}

    # A damaged savepoint does not verify; bad input is one line with exit code 2.
    savepoint_dir = Path(url.removeprefix("file://"))
    state_file = next(p for p in savepoint_dir.rglob("*") if p.is_file() and p.name != "_metadata")
    state_file.write_bytes(b"not parquet")
    broken = as_json_code(env, 1, "verify", url)
    assert broken["ok"] is False
    assert [c["check"] for c in broken["checks"] if not c["ok"]] == [state_file.as_uri()]
    for args, message in [
        (["show", "99"], "microcheckpoint: pipeline 'wordcount' has no checkpoint 99 in "),
        (["restore", "nope"], "microcheckpoint: config field 'point' = 'nope' is invalid: "),
        (["restore", "7"], "microcheckpoint: checkpoint 7 of 'wordcount' is not a completed "),
    ]:
        done = cli(env, *args, code=2)
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    shutil.rmtree(savepoint_dir)


def as_json_code(env: dict[str, str], code: int, *args: str) -> dict:
    return json.loads(cli(env, *args, "--json", code=code).stdout)


PHASES = ["waiting to start", "read", "keyed", "snapshot upload", "ack"]


def test_show_names_the_slowest_subtask_and_a_failed_run_names_the_task_and_cause(
    tmp_path: Path, kafka_bootstrap: str, spark_connect_url: str
) -> None:
    """Issue 29, item 5, through the console script on real runs."""
    from microcheckpoint import formatting
    from microcheckpoint.protocol.history import checkpoint_detail
    from microcheckpoint.storage import FileStore

    topic = f"cli-slow-{uuid.uuid4().hex[:6]}"
    wordcount.produce(kafka_bootstrap, topic, wordcount.lines_for(30, seed=4))
    storage = (tmp_path / "chk").as_uri()
    env = {**cli_env(storage, topic, kafka_bootstrap, spark_connect_url), "FAILING_TOPIC": topic}
    cli(env, "run", "--module", "examples.wordcount:pipeline")

    # The subtask that acked last, its five phases adding up to its end to end, and why.
    slowest = as_json(env, "show", "1")["slowest"]
    detail = checkpoint_detail(FileStore(storage), "wordcount", 1)
    assert slowest == detail["slowest"]
    last = max(detail["subtasks"], key=lambda s: s["end_to_end_ms"])
    assert slowest["task"] == last["task"]
    assert slowest["end_to_end_ms"] == last["end_to_end_ms"] > 0
    assert sorted(slowest["phases"]) == sorted(PHASES)  # --json sorts the keys
    assert None not in slowest["phases"].values()
    # They add up to it, within 1 ms: the start and the ack are stamped in whole ms.
    assert sum(slowest["phases"].values()) == pytest.approx(slowest["end_to_end_ms"], abs=1)
    assert slowest["why"] == max(PHASES, key=lambda p: slowest["phases"][p])
    assert slowest["why_ms"] == slowest["phases"][slowest["why"]]
    text = cli(env, "show", "1").stdout.splitlines()
    assert f"slowest: {formatting.slowest(slowest)}" in text
    assert f"  {formatting.phases({p: slowest['phases'][p] for p in PHASES})}" in text

    # A run whose keyed function raises: the checkpoint is declined by the subtask that
    # failed, with the worker's exception, in list and show (the next run re-runs it).
    failing = {**env, "MICROCHECKPOINT_PIPELINE": "failing"}
    failed = cli(failing, "run", "--module", "tests.integration.failing_pipeline:pipeline", code=1)
    assert failed.stderr == "microcheckpoint: checkpoint failed: ValueError: bad row 3\n"
    row = as_json(failing, "list")["checkpoints"][0]
    assert row["failed_task"] in {"fails#0", "fails#1"}
    assert (row["id"], row["status"], row["cause"]) == (1, "PENDING", "ValueError: bad row 3")
    shown = as_json(failing, "show", "1")
    assert (shown["failed_task"], shown["cause"]) == (row["failed_task"], "ValueError: bad row 3")
    line = f"checkpoint 1 failed: task {row['failed_task']}: ValueError: bad row 3"
    assert line in cli(failing, "list").stdout.splitlines()
    assert f"failed: task {row['failed_task']}: ValueError: bad row 3" in (
        cli(failing, "show", "1").stdout.splitlines()
    )
