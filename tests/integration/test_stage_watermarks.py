"""Watermarks cross stages with the barrier markers, on the real broker and Spark.

Stage 1 is stateless with event time: it reads a two-partition topic and writes the rows
to an internal topic with a ``StageSink``. Stage 2 reads it with a ``StageSource`` and runs
a process function with event-time timers. Each of stage 1's markers carries its watermark,
so stage 2's watermark after each epoch is exactly stage 1's, and stage 2's timers fire at
the same epochs as a single-stage run of the same function on the input topic. The rows
are chosen so that stage 2's own rows would give another watermark (the rule of a source:
highest event time minus the bound), and other timers.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import (
    EventTime,
    KafkaSource,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    StageSource,
    UnionSource,
    value_state,
)
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.event_time import restored_watermarks
from microcheckpoint.engine.watermarks import WatermarkState, advance
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.markers import marker_of
from microcheckpoint.protocol.view import scan
from microcheckpoint.sinks.kafka import read_topic
from microcheckpoint.sinks.stage import StageSink
from microcheckpoint.state.keygroups import spark_key_group
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

BOUND = 5  # ms of out-of-orderness: a watermark is the highest event time - 6
EVENT_TIME = EventTime("ts", max_out_of_orderness_ms=BOUND)
SCHEMA = {"k": "string", "ts": "long"}
OUTPUT = "k string, at long, count long, wm long"
# Keys by the internal topic's partition that holds them: a, b in 0; c, e in 1.
A, C, B, D = "a", "b", "c", "e"
# Per epoch, the rows of the input topic's partitions 0 and 1.
EPOCHS = [
    {0: [(A, 100), (B, 104)], 1: []},
    {0: [(A, 120)], 1: [(C, 130), (D, 140)]},
    {0: [], 1: [(D, 170), (A, 112)]},  # (a, 112) is late: at or below 114
    {0: [(B, 200)], 1: []},
    {0: [(A, 300)], 1: [(C, 305)]},
]
# min over the input's partitions of (highest event time - BOUND - 1); None while
# partition 1 has carried no row.
WATERMARKS = [None, 114, 114, 164, 294]
# Timers fire at ts <= the epoch's watermark, in (timestamp, key) order.
FIRED = [
    [],
    [(A, 110, 2, 114), (B, 114, 1, 114)],
    [],
    [(A, 130, 2, 164), (C, 140, 1, 164), (D, 150, 2, 164)],
    [(D, 180, 2, 294), (B, 210, 2, 294)],
]
# What stage 2's own rows would give (its partition 0 holds a and b, 1 holds c and e).
OWN_RULE = [94, 124, 124, 124, 194]


class Reminder(KeyedProcessFunction):
    """Counts each key's on-time rows; an event-time timer 10 ms after its latest row of
    an epoch reports the count and the watermark."""

    states = (value_state("count", default=0),)

    def process(self, key, rows, ctx):
        count = ctx.state("count")
        count.update(count.value() + len(rows))
        ctx.timers.register_event_time(max(r["ts"] for r in rows) + 10)
        return []

    def on_timer(self, key, timestamp, ctx):
        return [
            {"k": key, "at": timestamp, "count": ctx.state("count").value(), "wm": ctx.watermark}
        ]


def _process() -> KeyedProcess:
    return KeyedProcess("reminders", key="k", function=Reminder(), output_schema=OUTPUT)


def _produce(bootstrap: str, topic: str, rows: dict[int, list[tuple[str, int]]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for partition, part in rows.items():
        for k, ts in part:
            producer.send(topic, json.dumps({"k": k, "ts": ts}).encode(), partition=partition)
    producer.flush()
    producer.close()


def _watermarks(store: FileStore, name: str, source: str) -> list[int | None]:
    """The watermark in each completed checkpoint's source state file, in id order."""
    view = scan(store, Layout(name))
    out = []
    for cid in view.completed:
        ack = view.metadata(cid).acks
        handles = [h for t, a in ack.items() if t.uid.value == source for h in a.handles]
        assert handles, f"checkpoint {cid} of {name} has no watermark file"
        out.append(restored_watermarks(store, handles).watermark)
    return out


def _fired(outputs: list[dict] | None) -> list[tuple[str, int, int, int]]:
    """An epoch's timer reports in (timestamp, key) order."""
    return sorted(
        ((r["k"], r["at"], r["count"], r["wm"]) for r in outputs or []), key=lambda r: (r[1], r[0])
    )


def _own_rule() -> list[int | None]:
    """The watermarks stage 2's rows would give by the source rule (``advance``), each
    row in the internal topic's partition that holds its key."""
    state, out = WatermarkState(), []
    for n, rows in enumerate(EPOCHS, 1):
        highs: dict[str, int] = {}
        for k, ts in rows[0] + rows[1]:
            part = "mid:0" if k in (A, C) else "mid:1"
            highs[part] = max(highs.get(part, ts), ts)
        state = advance(state, highs, ["mid:0", "mid:1"], EventTime("ts", BOUND), n)
        out.append(state.watermark)
    return out


def _stage_one(bootstrap: str, tag: str) -> tuple[Pipeline, str, str]:
    """Stage 1: stateless, with event time, from a fresh two-partition topic to an internal
    topic. Returns it, the input topic and the internal topic."""
    topic, internal = f"wm-in-{tag}", f"wm-mid-{tag}"
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, 2)
    sink = StageSink("to-s2", bootstrap, internal, key="k", partitions=2)
    sink.open()
    first = (
        Pipeline(f"wm1{tag}", KafkaSource("in", [topic], "json", SCHEMA, event_time=EVENT_TIME))
        .then(lambda df: df.select("k", "ts"))
        .then(sink)
    )
    return first, topic, internal


def _from_stage_one(first: Pipeline, internal: str) -> StageSource:
    return StageSource(
        "from-s1",
        [internal],
        "json",
        SCHEMA,
        event_time=EVENT_TIME,
        upstream=first.name,
        upstream_uid="to-s2",
    )


def _cycler(spark, bootstrap: str, tmp_path: Path):
    """``cycle(pipeline, epoch)``: one local cycle, checkpoints kept, a clock per epoch."""
    stores: dict[str, FileStore] = {}

    def cycle(pipeline: Pipeline, epoch: int):
        store = stores.setdefault(pipeline.name, FileStore((tmp_path / pipeline.name).as_uri()))
        values = {"pipeline": pipeline.name, "storage": store.url, "retained": len(EPOCHS)}
        config = CheckpointConfig.from_mapping(values)
        return run_cycle(
            spark,
            pipeline,
            config,
            store,
            bootstrap=bootstrap,
            parallelism=2,
            collect=True,
            clock=lambda: 1_700_000_000.0 + epoch,
        )

    return cycle, stores


def test_stage_two_watermark_is_stage_one_s_and_timers_fire_as_in_one_stage(
    spark, kafka_bootstrap, tmp_path
) -> None:
    # Both keyed subtasks hold keys (Spark's hash: a, c, e in subtask 0, b in 1).
    owner = {k: spark_key_group(k, 128) % 2 for k in (A, B, C, D)}
    assert owner == {A: 0, B: 0, C: 1, D: 0}
    tag = uuid.uuid4().hex[:6]
    first, topic, internal = _stage_one(kafka_bootstrap, tag)
    s1, s2, single = first.name, f"wm2{tag}", f"wm0{tag}"
    second = Pipeline(s2, _from_stage_one(first, internal)).then(_process())
    alone = Pipeline(
        single, KafkaSource("in", [topic], "json", SCHEMA, event_time=EVENT_TIME)
    ).then(_process())
    cycle, stores = _cycler(spark, kafka_bootstrap, tmp_path)

    fired2, fired1 = [], []
    for epoch, rows in enumerate(EPOCHS, 1):
        _produce(kafka_bootstrap, topic, rows)
        assert cycle(first, epoch).checkpoint_id.value == epoch
        done2 = cycle(second, epoch)
        assert done2.checkpoint_id.value == epoch
        fired2.append(_fired(done2.outputs))
        fired1.append(_fired(cycle(alone, epoch).outputs))

    # Every marker of stage 1's epoch n, in both partitions, carries its watermark after n.
    for partition in (0, 1):
        marks = [
            (m.epoch, m.watermark, m.event_time)
            for headers, _, _ in read_topic(kafka_bootstrap, internal, [partition])
            if (m := marker_of([(n, v.encode()) for n, v in headers.items()])) is not None
        ]
        assert marks == [(n, mark, True) for n, mark in enumerate(WATERMARKS, 1)]
    # The checkpoints' source state files: stage 2's watermark is stage 1's, exactly, and
    # the single-stage run's; stage 2's own rows would have given another.
    assert _watermarks(stores[s1], s1, "in") == WATERMARKS
    assert _watermarks(stores[s2], s2, "from-s1") == WATERMARKS
    assert _watermarks(stores[single], single, "in") == WATERMARKS
    assert _own_rule() == OWN_RULE != WATERMARKS
    # Timers fire in stage 2 at the same epochs, with the same state, as in one stage.
    assert fired1 == FIRED
    assert fired2 == FIRED


def test_a_union_s_watermark_is_the_minimum_of_its_upstream_s_and_its_kafka_input_s(
    spark, kafka_bootstrap, tmp_path
) -> None:
    # A fan-in stage: stage 1's internal topic (its watermark on the markers) and a plain
    # Kafka topic (the source rule: its highest event time - 6).
    tag = uuid.uuid4().hex[:6]
    first, topic, internal = _stage_one(kafka_bootstrap, tag)
    other = f"wm-other-{tag}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(other, 1)
    fan_in = Pipeline(
        f"wm3{tag}",
        UnionSource(
            "both",
            [
                _from_stage_one(first, internal),
                KafkaSource("other", [other], "json", SCHEMA, event_time=EVENT_TIME),
            ],
        ),
    ).then(lambda df: df.select("input", "k", "ts"))
    cycle, stores = _cycler(spark, kafka_bootstrap, tmp_path)
    others = [[("x", 50)], [], [("x", 400)], [], [("x", 250)]]  # the other topic: 44, 394
    for epoch, (rows, more) in enumerate(zip(EPOCHS, others, strict=True), 1):
        _produce(kafka_bootstrap, topic, rows)
        _produce(kafka_bootstrap, other, {0: more})
        assert cycle(first, epoch).checkpoint_id.value == epoch
        assert cycle(fan_in, epoch).records == len(rows[0]) + len(rows[1]) + len(more) + 2
    # Stage 1: None, 114, 114, 164, 294; the other topic: 44, 44, 394, 394, 394.
    assert _watermarks(stores[first.name], first.name, "in") == WATERMARKS
    assert _watermarks(stores[fan_in.name], fan_in.name, "both") == [None, 44, 114, 164, 294]
