"""File sink: exactly-once publishing under per-epoch manifests, on the file store and S3,
alone and driven by the engine (with a kill -9 between _metadata and commit), and
AT_LEAST_ONCE mode (duplicates only from replayed epochs, nothing lost)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from harness.faults import crash_env
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan
from microcheckpoint.sinks.base import EpochInfo
from microcheckpoint.sinks.files import FileSink, read_committed
from microcheckpoint.storage import FileStore

ROOT = Path(__file__).resolve().parents[2]
PARTS = [[{"w": "a", "n": 1}, {"w": "b", "n": 2}], [{"w": "c", "n": 3}]]


@pytest.fixture(params=["file", "s3"])
def target(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/out", {}
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    options = {
        "endpoint_url": endpoint.url,
        "region": endpoint.region,
        "access_key": endpoint.access_key,
        "secret_key": endpoint.secret_key,
    }
    return f"s3://{bucket}/out", options


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_commit_is_idempotent_and_only_manifested_files_are_visible(target, fmt):
    url, options = target
    sink = FileSink("totals", url, format=fmt, store_options=options)
    sink.commit(EpochInfo("p", "totals", 1), PARTS)
    sink.commit(EpochInfo("p", "totals", 2), [[{"w": "d", "n": 4}], []])
    sink.commit(EpochInfo("p", "totals", 1), PARTS)  # a retried or zombie notify
    rows = read_committed(url, "p", "totals", options)
    assert rows == [*PARTS[0], *PARTS[1], {"w": "d", "n": 4}]


def test_crash_halfway_through_publishing_leaves_nothing_visible_twice(target):
    url, options = target
    sink = FileSink("totals", url, store_options=options)
    real_put = type(sink.store).put
    calls = {"n": 0}

    def dying_put(store, key, data):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("process died while publishing")
        real_put(store, key, data)

    type(sink.store).put = dying_put
    try:
        with pytest.raises(RuntimeError):
            sink.commit(EpochInfo("p", "totals", 1), PARTS)
    finally:
        type(sink.store).put = real_put
    assert read_committed(url, "p", "totals", options) == []  # part 0 written, not visible
    sink.commit(EpochInfo("p", "totals", 1), PARTS)
    assert read_committed(url, "p", "totals", options) == [*PARTS[0], *PARTS[1]]


def test_at_least_once_replay_duplicates_only_the_replayed_part(tmp_path):
    sink = FileSink("totals", f"file://{tmp_path}/out")
    epoch = EpochInfo("p", "totals", 1)
    sink.write_at_least_once(epoch, 0, PARTS[0])
    sink.write_at_least_once(epoch, 1, PARTS[1])
    sink.write_at_least_once(epoch, 0, PARTS[0])  # the epoch is replayed after a crash
    rows = read_committed(f"file://{tmp_path}/out", "p", "totals")
    canon = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert Counter(map(canon, rows)) == Counter(map(canon, [*PARTS[0], *PARTS[0], *PARTS[1]]))


# ---- driven by the engine ---------------------------------------------------------------


def _produce(bootstrap, topic, lines):
    from examples.wordcount import produce

    produce(bootstrap, topic, lines)


def _env(topic, target, name, **extra):
    return {
        **os.environ,
        "SINK_TOPIC": topic,
        "SINK_TARGET": target,
        "SINK_NAME": name,
        "PYTHONPATH": str(ROOT),  # the Connect server's workers import the pipeline by package
        "PYSPARK_PYTHON": sys.executable,
        **extra,
    }


def _run_job(store, bootstrap, config_json, env, remote):
    """One cycle as its own spark_jobs/run_epoch.py process, a client of the Connect server
    ``remote`` (killed by the crash point in env)."""
    argv = [
        sys.executable,
        str(ROOT / "spark_jobs" / "run_epoch.py"),
        "--pipeline",
        "tests.integration.sink_pipeline:pipeline",
        "--remote",
        remote,
        "--storage",
        store.url,
        "--bootstrap",
        bootstrap,
        "--parallelism",
        "2",
        "--config",
        config_json,
    ]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, start_new_session=True)


def _pipeline(monkeypatch, topic, target, name):
    for key, value in {"SINK_TOPIC": topic, "SINK_TARGET": target, "SINK_NAME": name}.items():
        monkeypatch.setenv(key, value)
    import sink_pipeline

    return importlib.reload(sink_pipeline).pipeline


def _run_all(spark, pipeline, store, bootstrap, mode="EXACTLY_ONCE"):
    config = CheckpointConfig.from_mapping(
        {"pipeline": pipeline.name, "storage": store.url, "max_records_per_epoch": 10, "mode": mode}
    )
    for _ in range(10):
        result = run_cycle(spark, pipeline, config, store, bootstrap=bootstrap, parallelism=2)
        if result.records == 0:
            return
    raise AssertionError("input not consumed within 10 epochs")


LINES = [f"w{i % 5} w{i % 3} x" for i in range(40)]


def test_engine_output_equals_a_failure_free_run_after_kill_between_metadata_and_commit(
    spark, spark_connect_url, kafka_bootstrap, tmp_path, monkeypatch
):
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    topic = f"sink-{uuid.uuid4().hex[:8]}"
    _produce(kafka_bootstrap, topic, LINES)
    # A failure-free run.
    clean_target = f"file://{tmp_path}/clean-out"
    clean_store = FileStore(f"file://{tmp_path}/clean-chk")
    _run_all(
        spark, _pipeline(monkeypatch, topic, clean_target, "clean"), clean_store, kafka_bootstrap
    )
    clean = read_committed(clean_target, "clean", "totals")
    # The same input, with the Spark job killed after _metadata, before the sinks commit.
    target = f"file://{tmp_path}/out"
    store = FileStore(f"file://{tmp_path}/chk")
    done = _run_job(
        store,
        kafka_bootstrap,
        '{"max_records_per_epoch": 10}',
        _env(topic, target, "crashed", **crash_env("after_metadata")),
        spark_connect_url,
    )
    assert done.returncode == -signal.SIGKILL
    view = scan(store, Layout("crashed"))
    assert [c.value for c in view.completed] == [1]
    assert not view.records[view.completed[0]].notified
    assert read_committed(target, "crashed", "totals") == []  # completed, not yet published
    _run_all(spark, _pipeline(monkeypatch, topic, target, "crashed"), store, kafka_bootstrap)
    crashed = read_committed(target, "crashed", "totals")
    key = lambda r: (r["key"], r["total"])  # noqa: E731
    assert sorted(map(key, crashed)) == sorted(map(key, clean))  # I3: equal, no duplicates
    assert len(crashed) == len(set(map(key, crashed)))
    finals = {}
    for row in crashed:
        finals[row["key"]] = max(finals.get(row["key"], 0), row["total"])
    assert finals == dict(Counter(w for line in LINES for w in line.split()))


def test_at_least_once_mode_loses_nothing_and_duplicates_only_replayed_epochs(
    spark, spark_connect_url, kafka_bootstrap, tmp_path, monkeypatch
):
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    topic = f"alo-{uuid.uuid4().hex[:8]}"
    _produce(kafka_bootstrap, topic, LINES)
    target = f"file://{tmp_path}/out"
    store = FileStore(f"file://{tmp_path}/chk")
    done = _run_job(
        store,
        kafka_bootstrap,
        '{"max_records_per_epoch": 10, "mode": "AT_LEAST_ONCE"}',
        _env(topic, target, "alo", **crash_env("after_acks")),
        spark_connect_url,
    )
    assert done.returncode == -signal.SIGKILL
    written_before_crash = read_committed(target, "alo", "totals")
    assert written_before_crash  # at least once: published during processing
    _run_all(
        spark,
        _pipeline(monkeypatch, topic, target, "alo"),
        store,
        kafka_bootstrap,
        mode="AT_LEAST_ONCE",
    )
    rows = read_committed(target, "alo", "totals")
    counts = Counter((r["key"], r["total"]) for r in rows)
    duplicated = {k for k, n in counts.items() if n > 1}
    assert duplicated == {(r["key"], r["total"]) for r in written_before_crash}  # epoch 1 replayed
    finals = {}
    for key, total in counts:
        finals[key] = max(finals.get(key, 0), total)
    assert finals == dict(Counter(w for line in LINES for w in line.split()))  # nothing lost
