"""The edges of the command line that let a new user down, through the console script: each
bad input is one line with exit code 2 and storage byte-identical, and each operation does
what Flink's CLI does (cancel, dispose, checkpoint now, restore without copies)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from examples import wordcount
from microcheckpoint.sinks.files import read_committed
from tests.integration.cli_support import REPO, cli, cli_env

pytestmark = pytest.mark.integration
MODULE = ["--module", "examples.wordcount:pipeline"]
SETTINGS = ["--config", '{"max_records_per_epoch": 12, "retained": 3}']


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def one_line(done: subprocess.CompletedProcess[str], start: str) -> None:
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(start), done.stderr


def as_json(env: dict[str, str], *args: str, code: int = 0) -> dict:
    return json.loads(cli(env, *args, "--json", code=code).stdout)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, spark_connect_url: str):
    """Two completed checkpoints of the word count, made once for the module."""
    topic = f"edges-{uuid.uuid4().hex[:6]}"
    lines = wordcount.lines_for(40, seed=5)
    wordcount.produce(kafka_bootstrap, topic, lines)
    root = tmp_path_factory.mktemp("made") / "chk"
    env = cli_env(root.as_uri(), topic, kafka_bootstrap, spark_connect_url)
    assert cli(env, "checkpoint", *MODULE, *SETTINGS).stdout == (
        "checkpoint 1 completed: 24 records (attempt 1)\n"
    )
    assert cli(env, "checkpoint", "--full", *MODULE, *SETTINGS).stdout == (
        "checkpoint 2 completed (full): 16 records (attempt 1)\n"
    )
    return topic, lines, root


@pytest.fixture
def world(made, tmp_path: Path, kafka_bootstrap: str, spark_connect_url: str):
    """A copy of those checkpoints for one test (the checkpoint folder is the whole state)."""
    topic, lines, made_root = made
    root = tmp_path / "chk"
    shutil.copytree(made_root, root)
    env = cli_env(root.as_uri(), topic, kafka_bootstrap, spark_connect_url)
    return env, root, MODULE, SETTINGS, lines


def test_bad_input_at_the_cli_is_one_line_and_changes_nothing(world, tmp_path: Path) -> None:
    env, root, _, _, _ = world
    before = snapshot(root)
    outside = (tmp_path / "elsewhere").as_uri()
    cases = [
        (
            ["-p", "wordcont", "list"],
            "microcheckpoint: pipeline 'wordcont' has nothing stored in "
            f"{root.as_uri()}; did you mean 'wordcount'? pipelines there: wordcount",
        ),
        (
            ["restore", "latest", "--parallelism", "999"],
            "microcheckpoint: config field 'parallelism' = 999 is invalid: an integer in "
            "1..128 (the pipeline's max_parallelism)",
        ),
        (
            ["savepoint", "--target", outside + "/sp"],
            f"microcheckpoint: config field 'target' = '{outside}/sp' is invalid: a location "
            f"under one of the configured roots ({root.as_uri()})",
        ),
        (
            ["savepoint", "--stop", "--target", outside + "/sp"],
            f"microcheckpoint: config field 'target' = '{outside}/sp' is invalid",
        ),
        (
            ["restore", outside + "/sp"],
            f"microcheckpoint: config field 'point' = '{outside}/sp' is invalid",
        ),
        (
            ["cancel", "--cleanup", "KEEP"],
            "microcheckpoint: config field 'externalized_cleanup' = 'KEEP' is invalid: one of "
            "RETAIN_ON_CANCELLATION, DELETE_ON_CANCELLATION, NO_EXTERNALIZED_CHECKPOINTS",
        ),
        (
            ["savepoint", "--dispose", f"{root.as_uri()}/wordcount/chk-0000000002"],
            f"microcheckpoint: config field 'savepoint' = '{root.as_uri()}/wordcount/"
            "chk-0000000002' is invalid: a savepoint folder; checkpoints are deleted by retention",
        ),
        (
            ["restore", "latest", "--module", "examples.wordcount:nope"],
            "microcheckpoint: config field 'pipeline module' = 'examples.wordcount:nope' is "
            "invalid: module 'examples.wordcount' has no attribute 'nope'",
        ),
    ]
    for args, start in cases:
        one_line(cli(env, *args, code=2), start)
        assert snapshot(root) == before, args
    assert not (tmp_path / "elsewhere").exists()
    no_pipeline = {k: v for k, v in env.items() if k != "MICROCHECKPOINT_PIPELINE"}
    one_line(cli(no_pipeline, "list", code=2), "microcheckpoint: config field 'pipeline' = None")


def test_pipelines_list_show_and_unreadable_rows(world) -> None:
    env, root, _, _, _ = world
    assert as_json(env, "pipelines") == ["wordcount"]
    assert "wordcount" in cli(env, "pipelines").stdout
    # show: the key groups of the 128 each subtask owns, whole: the word count's built-in
    # aggregation groups keys by Spark's hash, every second group to each of its 2 subtasks.
    files = as_json(env, "show", "2")["state_files"]
    assert sorted(f["key_groups"] for f in files) == ["0-126 step 2", "1-127 step 2"]
    # A corrupt and an empty _metadata: UNREADABLE rows, never COMPLETED.
    (root / "wordcount/chk-0000000001/_metadata").write_bytes(b"{not json")
    table = cli(env, "list").stdout
    rows = [line for line in table.splitlines() if "│" in line and line.split("│")[1].strip()]
    statuses = {r.split("│")[1].strip(): r.split("│")[2].strip() for r in rows}
    assert statuses == {"2": "COMPLETED", "1": "UNREADABLE"}, table
    assert "UNREADABLE checkpoint 1: MetadataFormatError" in table
    (root / "wordcount/chk-0000000002/_metadata").write_bytes(b"")
    assert cli(env, "list").stdout.count("UNREADABLE checkpoint") == 2


def test_savepoints_restore_in_place_dispose_and_allow_non_restored_state(world) -> None:
    env, root, module, settings, _ = world
    url = cli(env, "savepoint").stdout.strip()
    for _ in range(2):
        assert cli(env, "restore", url).stdout == f"restored wordcount from {url}\n"
    # Restored twice where it lies: no copies under savepoints/.
    listed = as_json(env, "list")["savepoints"]
    assert [s["url"] if isinstance(s, dict) else s for s in listed] == [url]
    assert sorted(p.name for p in (root / "wordcount/savepoints").iterdir()) == [
        url.rsplit("/", 1)[1]
    ]
    one_line(
        cli(env, "savepoint", "--dispose", url, code=2),
        f"microcheckpoint: {url} is the point 'wordcount' was restored from",
    )
    assert cli(env, "checkpoint", *module, *settings).stdout.startswith("checkpoint 3 completed")
    assert cli(env, "savepoint", "--dispose", url).stdout.startswith(f"disposed {url} (")
    assert not (root / "wordcount/savepoints").exists() or not any(
        (root / "wordcount/savepoints").iterdir()
    )
    # A point with an operator the pipeline no longer has: refused, then dropped on request.
    other = cli(env, "savepoint").stdout.strip()
    meta_path = Path(other.removeprefix("file://")) / "_metadata"
    body = json.loads(meta_path.read_text())
    text = json.dumps(body).replace("word-counts", "old-counts")
    meta_path.write_text(text)
    one_line(
        cli(env, "restore", other, "--module", "examples.wordcount:pipeline", code=2),
        f"microcheckpoint: {other} holds state of operator(s) old-counts",
    )
    done = cli(
        env,
        "restore",
        other,
        "--module",
        "examples.wordcount:pipeline",
        "--allow-non-restored-state",
    )
    assert done.stdout == f"restored wordcount from {other}\n"


def test_cancel_retains_or_deletes_and_a_restore_starts_again(world) -> None:
    env, root, module, settings, lines = world
    url = cli(env, "savepoint").stdout.strip()
    done = cli(env, "cancel")
    assert done.stdout == (
        "cancelled wordcount (RETAIN_ON_CANCELLATION): aborted [], kept checkpoints: 1, 2, "
        "deleted 0 objects\n"
    )
    history = as_json(env, "list")
    assert "cancelled" in history["stopped"]["reason"]
    # While cancelled, a cycle is refused (triggering is stopped).
    refused = cli(env, "checkpoint", *module, *settings, code=1)
    assert "stopped" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert cli(env, "restore", "latest").stdout == (
        f"restored wordcount from {root.as_uri()}/wordcount/chk-0000000002\n"
    )
    assert cli(env, "checkpoint", *module, *settings).stdout.startswith("checkpoint 3 completed")
    savepoints = snapshot(root / "wordcount/savepoints")
    done = cli(env, "cancel", "--cleanup", "DELETE_ON_CANCELLATION", "--json")
    record = json.loads(done.stdout)
    assert (record["cleanup"], record["retained"], record["after_id"]) == (
        "DELETE_ON_CANCELLATION",
        [],
        3,
    )
    assert not list(root.glob("wordcount/chk-*/*"))
    assert snapshot(root / "wordcount/savepoints") == savepoints
    assert cli(env, "restore", url).stdout == f"restored wordcount from {url}\n"
    # Ids go on after the deleted ones; the state is the savepoint's plus what follows.
    fourth = cli(env, "checkpoint", *module, *settings).stdout
    assert fourth == "checkpoint 4 completed: 0 records (attempt 1)\n", fourth
    exported = root.parent / "counts.parquet"
    cli(env, "state", "export", "--uid", "word-counts", "--to", str(exported))
    import pyarrow.parquet as pq

    rows = pq.read_table(exported).to_pylist()
    assert {json.loads(r["key"]): json.loads(r["state"]) for r in rows} == dict(
        wordcount.expected(lines)
    )


def test_verify_takes_bootstrap_after_the_command(world, kafka_bootstrap: str) -> None:
    env, _, _, _, _ = world
    without = {k: v for k, v in env.items() if k != "MICROCHECKPOINT_KAFKA_BOOTSTRAP"}
    checked = as_json(without, "verify", "latest", "--bootstrap", kafka_bootstrap)
    assert [c["ok"] for c in checked["checks"] if ":" in c["check"] and "://" not in c["check"]]
    assert all(c["ok"] for c in checked["checks"])


def test_no_credentials_is_one_line_not_a_traceback(s3_endpoint, s3_bucket: str) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") and not k.startswith("MICROCHECKPOINT_")
    }
    env.update(
        PYTHONPATH=str(REPO),
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_EC2_METADATA_DISABLED="true",
        MICROCHECKPOINT_S3_ENDPOINT=s3_endpoint.url,
        MICROCHECKPOINT_STORAGE=f"s3://{s3_bucket}/chk",
        MICROCHECKPOINT_PIPELINE="wordcount",
    )
    done = cli(env, "list", code=1)
    one_line(
        done,
        f"microcheckpoint: listing s3://{s3_bucket}/chk/wordcount/ needs S3 credentials and "
        "found none",
    )


def test_run_epoch_s3_endpoint_reaches_the_file_sink(
    s3_endpoint, s3_bucket: str, kafka_bootstrap: str
) -> None:
    topic = f"sink-{uuid.uuid4().hex[:6]}"
    lines = wordcount.lines_for(20, seed=9)
    wordcount.produce(kafka_bootstrap, topic, lines)
    env = {k: v for k, v in os.environ.items() if k != "MICROCHECKPOINT_S3_ENDPOINT"}
    env.update(
        s3_endpoint.environment(),
        PYTHONPATH=str(REPO),
        WORDCOUNT_TOPIC=topic,
        WORDCOUNT_SINK=f"s3://{s3_bucket}/out",
    )
    env.pop("MICROCHECKPOINT_S3_ENDPOINT", None)
    cmd = [sys.executable, "spark_jobs/run_epoch.py", "--pipeline", "examples.wordcount:pipeline"]
    cmd += ["--storage", f"s3://{s3_bucket}/chk", "--bootstrap", kafka_bootstrap]
    # Local Spark in the job's own process: its executors see only this environment, where
    # MICROCHECKPOINT_S3_ENDPOINT is not set; --s3-endpoint alone must reach every client.
    cmd += ["--s3-endpoint", s3_endpoint.url]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["records"] == 20
    rows = read_committed(
        f"s3://{s3_bucket}/out",
        "wordcount",
        "word-totals",
        {
            "endpoint_url": s3_endpoint.url,
            "access_key": s3_endpoint.access_key,
            "secret_key": s3_endpoint.secret_key,
        },
    )
    assert {r["key"]: r["total"] for r in rows} == dict(wordcount.expected(lines))
