"""Every sink driven by the engine on the real broker and Spark, in both modes.

Story per sink: a failure-free run gives the reference output. A second pipeline over the
same input completes epoch 1 but "dies" before notify (no commit); a task of epoch 2 is
retried (staged again: same bytes, duplicate ack); recovery commits epoch 1 before anything
new runs; a zombie notify of an old epoch publishes nothing. Committed output equals the
failure-free run exactly (no duplicates). AT_LEAST_ONCE: a replayed epoch duplicates, nothing
is lost.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from pyspark.sql import functions as F

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import KafkaSource, Pipeline, running_sum
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.runner import expected_tasks, run_epoch
from microcheckpoint.engine.sinkstage import SinkContext, sink_publisher, stage_part
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.storage import FileStore

LINES = [f"w{i % 7} w{i % 4} z" for i in range(36)]
TRUTH = Counter(w for line in LINES for w in line.split())


def _topic(bootstrap):
    from examples.wordcount import produce

    topic = f"sinks-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, LINES)
    return topic


def _make_sink(kind, tmp_path, bootstrap, name):
    if kind == "file":
        from microcheckpoint.sinks.files import FileSink, read_committed

        target = f"file://{tmp_path}/{name}-out"
        sink = FileSink("totals", target)
        return sink, lambda: [
            (r["key"], r["total"]) for r in read_committed(target, name, "totals")
        ]
    if kind == "iceberg":
        from microcheckpoint.sinks.iceberg import IcebergSink

        sink = IcebergSink(
            "totals",
            f"demo.{name}",
            {"key": "string", "total": "long"},
            catalog_path=str(tmp_path / f"{name}-catalog"),
        )
        return sink, lambda: [(r["key"], r["total"]) for r in sink.read_table()]
    from microcheckpoint.sinks.kafka import KafkaSink, read_topic

    out_topic = f"{name}-out"
    sink = KafkaSink("totals", bootstrap, out_topic, key_column="key", partitions=2)

    def read():
        return [
            (json.loads(v)["key"], json.loads(v)["total"])
            for _, _, v in read_topic(bootstrap, out_topic)
        ]

    return sink, read


def _pipeline(name, topic, sink):
    return (
        Pipeline(name, KafkaSource("lines", [topic], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(running_sum("counts", key="word"))
        .then(sink)
    )


def _process_first_epoch(spark, pipeline, coordinator, topic, bootstrap):
    """Trigger epoch 1 over everything produced and run its Spark job (no complete, no notify)."""
    with KafkaOffsets(bootstrap) as kafka:
        tps = kafka.partitions(topic)
        pending = coordinator.trigger(
            expected_tasks(pipeline, 2), kafka.end_offsets(tps), lambda new: dict.fromkeys(new, 0)
        )
    plan = coordinator.plan(pending.checkpoint_id)
    run_epoch(spark, pipeline, plan, coordinator.store, bootstrap=bootstrap)
    return pending


def _config(store, name, mode="EXACTLY_ONCE"):
    return CheckpointConfig.from_mapping(
        {
            "pipeline": name,
            "storage": store.url,
            "max_records_per_epoch": 6,
            "mode": mode,
            "retained": 5,
        }
    )


def _drain(spark, pipeline, config, store, bootstrap):
    for _ in range(12):
        if (
            run_cycle(spark, pipeline, config, store, bootstrap=bootstrap, parallelism=2).records
            == 0
        ):
            return
    raise AssertionError("input not consumed")


def _finals(rows):
    finals = {}
    for key, total in rows:
        finals[key] = max(finals.get(key, 0), total)
    return finals


@pytest.mark.parametrize("kind", ["file", "iceberg", "kafka"])
def test_exactly_once_output_after_crash_retry_and_zombie(spark, kafka_bootstrap, tmp_path, kind):
    topic = _topic(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    # The failure-free reference.
    clean_name = f"clean{tag}"
    clean_sink, read_clean = _make_sink(kind, tmp_path, kafka_bootstrap, clean_name)
    clean_store = FileStore(f"file://{tmp_path}/clean")
    _drain(
        spark,
        _pipeline(clean_name, topic, clean_sink),
        _config(clean_store, clean_name),
        clean_store,
        kafka_bootstrap,
    )
    reference = read_clean()
    assert _finals(reference) == dict(TRUTH)

    name = f"crash{tag}"
    sink, read = _make_sink(kind, tmp_path, kafka_bootstrap, name)
    pipeline = _pipeline(name, topic, sink)
    store = FileStore(f"file://{tmp_path}/crash")
    config = _config(store, name)
    coordinator = CheckpointCoordinator(store, config)
    sink.open()
    # Epoch 1 completes, then the process dies before notify: nothing is published.
    pending = _process_first_epoch(spark, pipeline, coordinator, topic, kafka_bootstrap)
    first = coordinator.complete(pending.checkpoint_id)
    assert read() == []
    # A retried task of the staged epoch writes the same bytes and acks as a duplicate.
    staged = first.acks[next(t for t in first.acks if t.uid.value == "totals")].handles[0]
    before = store.get(staged.key).data
    rows = [json.loads(line) for line in before.splitlines()]
    part = int(staged.key.rsplit("part-", 1)[1][:5])
    ctx = SinkContext(store.url, {}, name, first.checkpoint_id.value, first.attempt, "EXACTLY_ONCE")
    list(stage_part(ctx, sink, part, reversed(rows)))
    assert store.get(staged.key).data == before
    # Recovery: epoch 1 is committed before anything new runs, then the rest.
    _drain(spark, pipeline, config, store, kafka_bootstrap)
    # A zombie notifier commits epoch 1 again: nothing is published twice.
    sink_publisher(pipeline, store, config.mode)(first)  # type: ignore[misc]
    output = read()
    assert sorted(output) == sorted(reference)
    assert len(output) == len(set(output))
    assert _finals(output) == dict(TRUTH)


@pytest.mark.parametrize("kind", ["file", "iceberg", "kafka"])
def test_at_least_once_duplicates_only_replayed_epochs(spark, kafka_bootstrap, tmp_path, kind):
    topic = _topic(kafka_bootstrap)
    name = f"alo{uuid.uuid4().hex[:6]}"
    sink, read = _make_sink(kind, tmp_path, kafka_bootstrap, name)
    pipeline = _pipeline(name, topic, sink)
    store = FileStore(f"file://{tmp_path}/alo")
    config = _config(store, name, mode="AT_LEAST_ONCE")
    coordinator = CheckpointCoordinator(store, config)
    sink.open()
    # Epoch 1 publishes during processing, then dies before _metadata: it is replayed.
    pending = _process_first_epoch(spark, pipeline, coordinator, topic, kafka_bootstrap)
    published_once = read()
    assert published_once
    _drain(spark, pipeline, config, store, kafka_bootstrap)
    counts = Counter(read())
    assert {row for row, n in counts.items() if n > 1} == set(published_once)
    assert all(n <= 2 for n in counts.values())
    assert _finals(counts) == dict(TRUTH)  # nothing lost
    assert coordinator.view().records[pending.checkpoint_id].attempt >= 3  # replayed attempt
