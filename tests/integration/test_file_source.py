"""The file source, tested like the Kafka source: exact counts over epochs of arriving files,
JSON lines on S3, kill -9 at every crash point, a restore from a savepoint, files then Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka import KafkaProducer

from harness.faults import crash_env
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import FileSource, HybridSource, KafkaSource, Pipeline, running_sum
from microcheckpoint.engine.api import KeyedOperator
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.faults import POINTS
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"key-{i}" for i in range(6)]


def _write(folder: Path, index: int, seqs: range) -> list[tuple[str, int]]:
    """File ``part-<index>`` with every key's ``seq`` in ``seqs``; returns its rows."""
    rows = [(k, s) for s in seqs for k in KEYS]
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"k": [k for k, _ in rows], "seq": [s for _, s in rows]})
    pq.write_table(table, folder / f"part-{index:05d}.parquet")
    return rows


def _seq_fn(key, rows, state):
    last, count, bad = (0, 0, 0) if state is None else (state["last"], state["count"], state["bad"])
    for row in rows:
        bad += int(row["seq"] - last != 1)
        last, count = row["seq"], count + 1
    return [{"k": key, "last": last}], {"last": last, "count": count, "bad": bad}


def _sequence_pipeline(name: str, url: str, **options) -> Pipeline:
    return Pipeline(name, FileSource("files", url, **options)).then(
        KeyedOperator("seq", key="k", fn=_seq_fn, output_schema="k string, last long")
    )


def _config(store, name: str, **extra) -> CheckpointConfig:
    return CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url, **extra})


def test_arriving_files_are_read_once_in_order_with_exact_sequences(spark, tmp_path) -> None:
    folder = tmp_path / "in"
    for i in range(3):
        _write(folder, i, range(i * 10 + 1, i * 10 + 11))
    pipeline = _sequence_pipeline("files", folder.as_uri(), max_files_per_epoch=2)
    store = FileStore((tmp_path / "chk").as_uri())
    config = _config(store, "files", retained=3)
    records = []
    for epoch in range(4):
        if epoch == 2:  # a file arrives while the pipeline runs
            _write(folder, 3, range(31, 41))
        records.append(
            run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=2).records
        )
    assert records == [2, 1, 1, 0]  # file positions: 2 files, then 1, then the new one
    state = read_keyed_state(store, "files", "seq")
    assert state == {k: {"last": 40, "count": 40, "bad": 0} for k in KEYS}
    view = scan(store, Layout("files"))
    files = [view.pending_record(c).files for c in view.completed]
    assert [next(iter(f.values())) for f in files] == [
        ("part-00002.parquet",),
        ("part-00003.parquet",),
        (),
    ]


def test_json_lines_on_s3_are_read_through_the_object_store(
    spark, s3_endpoint, s3_client, s3_bucket
):
    from microcheckpoint.adapters.s3 import S3Store

    folder = S3Store(s3_client, s3_bucket, "archive")
    lines = []
    for i in range(4):
        rows = [{"word": w, "n": i} for w in ("to", "be", "or", "not", "to", "be")]
        lines += rows
        folder.put(f"day-{i}.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    folder.put("_SUCCESS", b"")
    options = {
        "endpoint_url": s3_endpoint.url,
        "region": s3_endpoint.region,
        "access_key": s3_endpoint.access_key,
        "secret_key": s3_endpoint.secret_key,
    }
    source = FileSource(
        "days", f"s3://{s3_bucket}/archive", "jsonl", {"word": "string", "n": "long"}, 3
    )
    pipeline = Pipeline("days", source).then(running_sum("words", key="word"))
    store = S3Store(s3_client, s3_bucket, "chk")
    config = _config(store, "days")
    runs = [
        run_cycle(
            spark, pipeline, config, store, bootstrap="", parallelism=2, store_options=options
        )
        for _ in range(3)
    ]
    assert [r.records for r in runs] == [3, 1, 0]
    assert read_keyed_state(store, "days", "words") == dict(Counter(r["word"] for r in lines))


def _job(tmp: Path, url: str, storage: str, connect: str, crash_at: str | None = None):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # the Connect server's workers import the pipeline by package
        "PYSPARK_PYTHON": sys.executable,
        "FILE_SOURCE_URL": url,
    }
    env.update(crash_env(crash_at) if crash_at else {})
    argv = [
        sys.executable,
        "spark_jobs/run_epoch.py",
        "--pipeline",
        "tests.integration.file_pipeline:pipeline",
        "--storage",
        storage,
        "--bootstrap",
        "",
        "--remote",
        connect,
    ]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("crash_at", POINTS)
def test_a_killed_file_epoch_recovers_exactly_once(tmp_path, spark_connect_url, crash_at) -> None:
    folder = tmp_path / "in"
    for i in range(5):
        _write(folder, i, range(i * 5 + 1, i * 5 + 6))
    storage = (tmp_path / "chk").as_uri()
    first = _job(tmp_path, folder.as_uri(), storage, spark_connect_url)
    assert first.returncode == 0, first.stderr[-3000:]
    killed = _job(tmp_path, folder.as_uri(), storage, spark_connect_url, crash_at)
    assert killed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), killed.stderr[-3000:]
    for _ in range(3):  # two files per epoch: 5 files need 3 epochs, one of them re-run
        done = _job(tmp_path, folder.as_uri(), storage, spark_connect_url)
        assert done.returncode == 0, done.stderr[-3000:]
    state = read_keyed_state(FileStore(storage), "filecrash", "seq-check")
    assert state == {k: {"last": 25, "count": 25, "bad": 0} for k in KEYS}


def test_restore_from_a_savepoint_reads_the_later_files_again_once(spark, tmp_path) -> None:
    folder = tmp_path / "in"
    for i in range(4):
        _write(folder, i, range(i * 10 + 1, i * 10 + 11))
    pipeline = _sequence_pipeline("replay", folder.as_uri(), max_files_per_epoch=1)
    store = FileStore((tmp_path / "chk").as_uri())
    config = _config(store, "replay", retained=2)
    for _ in range(2):
        run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=2)
    savepoint = savepoints.create_savepoint(store, "replay")
    for _ in range(3):
        run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=2)
    prefix = savepoint[len(store.url) + 1 :]
    point = savepoints.choose_restore(store, "replay", savepoint=(store, prefix))
    savepoints.restore(store, "replay", point, savepoints.ClaimMode.NO_CLAIM, parallelism=3)
    records = [
        run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=2).records
        for _ in range(3)
    ]
    assert records == [1, 1, 0]
    state = read_keyed_state(store, "replay", "seq")
    assert state == {k: {"last": 40, "count": 40, "bad": 0} for k in KEYS}


def test_hybrid_reads_the_archive_then_kafka_from_its_end(spark, kafka_bootstrap, tmp_path):
    folder = tmp_path / "archive"
    for i in range(2):
        _write(folder, i, range(i * 10 + 1, i * 10 + 11))
    topic = f"live-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for seq in range(21, 31):
        for k in KEYS:
            producer.send(topic, json.dumps({"k": k, "seq": seq}).encode(), partition=0)
    producer.flush()
    producer.close()
    source = HybridSource(
        "hybrid",
        FileSource("archive", folder.as_uri()),
        KafkaSource("live", [topic], value_format="json", schema={"k": "string", "seq": "long"}),
    )
    pipeline = Pipeline("hybrid", source).then(
        KeyedOperator("seq", key="k", fn=_seq_fn, output_schema="k string, last long")
    )
    store = FileStore((tmp_path / "chk").as_uri())
    config = _config(store, "hybrid", startup_mode="earliest")
    records = [
        run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2).records
        for _ in range(3)
    ]
    assert records == [2, 60, 0]  # 2 files, then 60 Kafka records, then nothing new
    state = read_keyed_state(store, "hybrid", "seq")
    assert state == {k: {"last": 30, "count": 30, "bad": 0} for k in KEYS}


# Names Spark's reader must map back to their keys: a space, '+', '%', '#', a non-ASCII
# letter, a subfolder; and one with glob syntax, which goes through the object-store reader.
ODD_NAMES = ["a b.parquet", "c+d.parquet", "e%20f.parquet", "g#ü.parquet", "sub/h i.parquet"]


def _frame_rows(
    spark, folder: Path, names: list[str], python: bool = False, decoded: bool | None = None
) -> list[tuple]:
    """The rows of ``names`` as the file source reads them; ``python``: whether the plan
    must read through the object-store reader (a Python ``mapInArrow``) or must not;
    ``decoded``: whether Spark's reader must decode each row's file URI or must not."""
    from microcheckpoint.engine.filescan import file_frame
    from microcheckpoint.faults import Faults

    source = FileSource("odd", folder.as_uri())
    frame = file_frame(spark, source, names, {}, Faults())
    plan = frame._jdf.queryExecution().analyzed().toString()
    assert ("MapInArrow" in plan) == python, plan
    if decoded is not None:
        assert ("url_decode" in plan) == decoded, plan
    return sorted((r.source_file, r.source_row, r.k, r.seq) for r in frame.collect())


def test_spark_reads_local_parquet_with_each_rows_file_name_and_index(spark, tmp_path) -> None:
    from microcheckpoint.engine.sources import FileReader

    folder = tmp_path / "in dir+%"
    expected = []
    for i, name in enumerate([*ODD_NAMES, "j[1].parquet"]):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {"k": [f"{name}-{r}" for r in range(3)], "seq": [i * 10 + r for r in range(3)]}
        )
        pq.write_table(table, folder / name)
        expected += [(name, r, f"{name}-{r}", i * 10 + r) for r in range(3)]
    names = [*ODD_NAMES, "j[1].parquet"]
    odd = sorted(e for e in expected if e[0] in ODD_NAMES)
    assert _frame_rows(spark, folder, ODD_NAMES, decoded=True) == odd
    assert _frame_rows(spark, folder, names, python=True) == sorted(expected)  # for '['
    # The object-store reader gives the same rows for the same files.
    schema = pa.schema([("k", pa.string()), ("seq", pa.int64())])
    reader = FileReader(folder.as_uri(), {}, tuple(ODD_NAMES), "parquet", schema)
    rows = [
        (r["source_file"], r["source_row"], r["k"], r["seq"])
        for b in reader(iter([pa.record_batch({"id": list(range(len(ODD_NAMES)))})]))
        for r in b.to_pylist()
    ]
    assert sorted(rows) == sorted(e for e in expected if e[0] in ODD_NAMES)


def test_plain_paths_are_looked_up_without_decoding_each_row(spark, tmp_path) -> None:
    """A path of URI-unreserved characters is Spark's URI as it is: each row's file is
    looked up without a URL decode, and every row still gets its file's name and index."""
    folder = tmp_path / "plain_in-1.x"
    names = ["part-0.parquet", "sub/p_1~x.parquet", "sub/deeper/Z9.parquet"]
    expected = []
    for i, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.table({"k": [f"{name}-{r}" for r in range(4)], "seq": [i] * 4}), folder / name
        )
        expected += [(name, r, f"{name}-{r}", i) for r in range(4)]
    assert _frame_rows(spark, folder, names, decoded=False) == sorted(expected)
    # One odd name among them: every row's URI is decoded, with the same rows.
    odd = folder / "a b.parquet"
    pq.write_table(pa.table({"k": ["x"], "seq": [9]}), odd)
    rows = _frame_rows(spark, folder, [*names, "a b.parquet"], decoded=True)
    assert rows == sorted([*expected, ("a b.parquet", 0, "x", 9)])


def test_a_file_of_the_barrier_that_is_gone_is_named(spark, tmp_path) -> None:
    from microcheckpoint.errors import KafkaSourceError

    folder = tmp_path / "in"
    _write(folder, 0, range(1, 3))
    _write(folder, 1, range(3, 5))
    (folder / "part-00001.parquet").unlink()
    with pytest.raises(KafkaSourceError, match=r"part-00001\.parquet of the barrier is gone"):
        _frame_rows(spark, folder, ["part-00000.parquet", "part-00001.parquet"])
