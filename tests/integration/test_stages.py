"""Two stages joined by an internal topic, on the real broker and Spark.

Stage 1 counts words and writes its running totals to an internal topic with a
``StageSink``; stage 2 reads that topic with a ``StageSource`` and keeps each word's
maximum total. Each stage-2 epoch must hold exactly one stage-1 epoch in every partition
(its range ends at the barrier marker), markers must be written exactly once per epoch and
partition (also when a commit is repeated), and never reach stage 2's rows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
from kafka import KafkaProducer
from pyspark.sql import functions as F

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stage_offsets import StageOffsets
from microcheckpoint.adapters.union_offsets import UnionOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import (
    KafkaSource,
    Pipeline,
    StageSource,
    UnionSource,
    co_keyed,
    running_max,
    running_sum,
)
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.sinkstage import sink_publisher
from microcheckpoint.errors import NotAligned
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.markers import marker_of
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    InflightChannel,
    InputAlignment,
)
from microcheckpoint.sinks.kafka import read_topic
from microcheckpoint.sinks.stage import StageSink
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

LINES = [f"w{i % 7} w{i % 4} z" for i in range(36)]
TRUTH = Counter(w for line in LINES for w in line.split())


def _config(store: FileStore, name: str, cap: int | None) -> CheckpointConfig:
    values = {"pipeline": name, "storage": store.url, "retained": 5}
    if cap is not None:
        values["max_records_per_epoch"] = cap
    return CheckpointConfig.from_mapping(values)


def _internal(bootstrap: str, topic: str) -> dict[int, list[tuple[dict, bytes | None]]]:
    """The internal topic's records per partition: (headers, value)."""
    out: dict[int, list[tuple[dict, bytes | None]]] = {}
    for partition in range(2):
        for headers, _, value in read_topic(bootstrap, topic, [partition]):
            out.setdefault(partition, []).append((headers, value))
    return out


def _markers(records: list[tuple[dict, bytes | None]]) -> list[int]:
    return [
        marker.epoch
        for headers, _ in records
        if (marker := marker_of([(k, v.encode()) for k, v in headers.items()])) is not None
    ]


def _mode(**values) -> CheckpointConfig:
    return CheckpointConfig.from_mapping({"pipeline": "down", "storage": "file:///x", **values})


def _word_stages(bootstrap: str, prefix: str, lines: list[str] = LINES, operator=None):
    """Stage 1 counts the words of ``lines`` (a fresh topic) into an internal topic; stage 2
    keeps each word's largest total (or applies ``operator`` to stage 1's rows). Returns
    both names and pipelines, the sink, the internal topic and the input topic."""
    from examples.wordcount import produce

    tag = uuid.uuid4().hex[:6]
    source_topic, internal = f"{prefix}-in-{tag}", f"{prefix}-mid-{tag}"
    produce(bootstrap, source_topic, lines)
    s1, s2 = f"{prefix}1{tag}", f"{prefix}2{tag}"
    sink = StageSink("to-s2", bootstrap, internal, key="key", partitions=2)
    first = (
        Pipeline(s1, KafkaSource("lines", [source_topic], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(running_sum("counts", key="word"))
        .then(sink)
    )
    second = Pipeline(
        s2,
        StageSource(
            "from-s1",
            [internal],
            value_format="json",
            schema={"key": "string", "total": "long"},
            upstream=s1,
            upstream_uid="to-s2",
        ),
    ).then(operator or running_max("maxes", key="key", value="total"))
    return s1, s2, first, second, sink, internal, source_topic


def test_each_stage_two_epoch_holds_exactly_one_stage_one_epoch(
    spark, kafka_bootstrap, tmp_path
) -> None:
    s1, s2, first, second, sink, internal, _ = _word_stages(kafka_bootstrap, "s")
    store1, store2 = FileStore(f"file://{tmp_path}/s1"), FileStore(f"file://{tmp_path}/s2")
    config1, config2 = _config(store1, s1, 4), _config(store2, s2, None)
    sink.open()

    def cycle(pipeline, config, store):
        return run_cycle(
            spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2, collect=True
        )

    # Stage 1 runs all its epochs first, so the internal topic holds several epochs when
    # stage 2 starts: each stage-2 epoch must still take exactly one of them.
    epochs1 = [cycle(first, config1, store1).checkpoint_id.value for _ in range(5)]
    records = _internal(kafka_bootstrap, internal)
    rows_of = {  # stage 1's rows per epoch
        epoch: [
            json.loads(v)
            for part in records.values()
            for h, v in part
            if h.get("mcp-epoch") == str(epoch) and "mcp-marker" not in h
        ]
        for epoch in epochs1
    }
    assert sum(1 for rows in rows_of.values() if rows) >= 3
    published: list[dict] = []
    for epoch in epochs1:
        done2 = cycle(second, config2, store2)
        assert done2.checkpoint_id.value == epoch
        expected: dict[str, int] = {}
        for row in published + rows_of[epoch]:
            expected[row["key"]] = max(expected.get(row["key"], 0), row["total"])
        touched = {row["key"] for row in rows_of[epoch]}
        got = sorted((r["key"], r["max"]) for r in done2.outputs or [])
        assert got == sorted((k, expected[k]) for k in touched)
        published += rows_of[epoch]

    # Every word's maximum is its final count: stage 2's state is the fold of stage 1's.
    assert read_keyed_state(store2, s2, "maxes") == dict(TRUTH)
    # One marker per stage-1 epoch in every partition, in epoch order, empty epochs included.
    for partition in (0, 1):
        assert _markers(records[partition]) == epochs1
    # A repeated commit (a zombie notifier) writes neither rows nor markers again.
    coordinator = CheckpointCoordinator(store1, config1)
    view = coordinator.view()
    sink_publisher(first, store1, config1.mode)(view.metadata(view.completed[-1]))  # type: ignore[misc]
    assert _internal(kafka_bootstrap, internal) == records
    # Every stage-2 checkpoint records its alignment, with Flink's statistics.
    view2 = CheckpointCoordinator(store2, config2).view()
    for epoch in epochs1:
        alignment = view2.pending_record(view2.completed[epoch - 1]).alignment
        assert isinstance(alignment, InputAlignment)
        assert alignment.epoch == epoch and alignment.channels == 2
        assert alignment.unaligned is False
        assert alignment.alignment_duration_ms is not None
        assert 0 <= alignment.alignment_duration_ms <= (alignment.start_delay_ms or 0)
    # No new stage-1 epoch: stage 2 waits for markers up to its timeout and triggers nothing.
    impatient = CheckpointConfig.from_mapping(
        {"pipeline": s2, "storage": store2.url, "retained": 5, "timeout": 1}
    )
    with pytest.raises(NotAligned, match=rf"no barrier marker of stage '{s1}'"):
        cycle(second, impatient, store2)
    assert CheckpointCoordinator(store2, config2).view().completed == view2.completed
    assert not CheckpointCoordinator(store2, config2).view().pending


def test_a_channel_without_its_marker_is_held_back(kafka_bootstrap) -> None:
    # Stage 1's epoch 7 reached partition 0 only (its commit died half way): partition 0's
    # range ends just after its marker, partition 1 stays at its start until its marker comes.
    tag = uuid.uuid4().hex[:6]
    topic = f"stage-held-{tag}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 2)
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)

        def send(partition: int, value: bytes, marker: bool) -> None:
            headers = [("mcp-pipeline", b"up"), ("mcp-uid", b"to-down"), ("mcp-epoch", b"7")]
            if marker:
                headers.append(("mcp-marker", b"7"))
            producer.send(topic, value=value, partition=partition, headers=headers)

        for partition in (0, 1):
            for i in range(3):
                send(partition, json.dumps({"i": i}).encode(), marker=False)
        send(0, b"", marker=True)
        send(0, b'{"i": 3}', marker=False)  # epoch 8's first row, after the marker
        producer.flush()
        producer.close()
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        offsets = StageOffsets(kafka, "up", "to-down")
        ends = kafka.end_offsets(tps)
        assert ends == {tps[0]: 5, tps[1]: 3}
        markers = offsets.markers(ends, {})
        assert markers[tps[1]] is None
        assert (markers[tps[0]].offset, markers[tps[0]].epoch) == (3, 7)
        assert offsets.limit_ends(ends, {}) == {tps[0]: 4, tps[1]: 0}
        assert offsets.limit_ends(ends, {tps[0]: 4, tps[1]: 1}) == {tps[0]: 4, tps[1]: 1}
        # Another writer's marker is not this stage's.
        assert StageOffsets(kafka, "up", "other").limit_ends(ends, {}) == {tps[0]: 0, tps[1]: 0}
        # Aligning waits for partition 1's marker: not within 1 s, named in the error...
        with pytest.raises(NotAligned, match=rf"channels {topic}:1 have no barrier marker"):
            offsets.align(ends, {}, _mode(timeout=1))
        # ...then it comes, 0.5 s after the first one: both ranges end just after their
        # markers, and the alignment took as long as the markers were apart.
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
        time.sleep(0.5)
        send(1, b"", marker=True)
        producer.flush()
        producer.close()
        cut, stats = offsets.align(ends, {}, _mode(timeout=10))
        assert cut == {tps[0]: 4, tps[1]: 4}
        assert stats.epoch == 7 and stats.channels == 2 and stats.unaligned is False
        assert 500 <= (stats.alignment_duration_ms or 0) <= (stats.start_delay_ms or 0)
        assert stats.inflight == () and stats.mode is AlignmentMode.ALIGNED


class Channels:
    """Writes an internal topic by hand, as stage ``up``'s sink ``to-down`` would: rows of
    ``{"key": k}`` and barrier markers, partition by partition, so a test can make one
    channel slow."""

    def __init__(self, bootstrap: str, partitions: int = 2, upstream: str = "up") -> None:
        self.topic = f"stage-hand-{uuid.uuid4().hex[:6]}"
        self.upstream = upstream
        self.bootstrap = bootstrap
        with KafkaOffsets(bootstrap) as kafka:
            kafka.create_topic(self.topic, partitions)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap)
        self.rows: Counter[str] = Counter()
        self.tps = [TopicPartition(self.topic, p) for p in range(partitions)]

    def _headers(self, epoch: int) -> list[tuple[str, bytes]]:
        writer = self.upstream.encode()
        return [("mcp-pipeline", writer), ("mcp-uid", b"to-down"), ("mcp-epoch", b"%d" % epoch)]

    def rows_to(self, partition: int, epoch: int, keys: list[str]) -> None:
        for key in keys:
            value = json.dumps({"key": key}).encode()
            self.producer.send(
                self.topic, value=value, partition=partition, headers=self._headers(epoch)
            )
            self.rows[key] += 1
        self.producer.flush()

    def marker(self, partition: int, epoch: int) -> None:
        headers = [*self._headers(epoch), ("mcp-marker", b"%d" % epoch)]
        self.producer.send(self.topic, value=b"", partition=partition, headers=headers)
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()


def test_unaligned_aligned_timeout_and_at_least_once_cut_the_channels(kafka_bootstrap) -> None:
    channels = Channels(kafka_bootstrap)
    p0, p1 = channels.tps
    try:
        # Epoch 7: partition 0 delivered its rows and its marker, partition 1 only rows.
        channels.rows_to(0, 7, ["a", "b", "c"])
        channels.marker(0, 7)
        channels.rows_to(1, 7, ["d", "e", "f"])
        with KafkaOffsets(kafka_bootstrap) as kafka:
            offsets = StageOffsets(kafka, "up", "to-down")
            ends = kafka.end_offsets(channels.tps)
            assert ends == {p0: 4, p1: 3}
            # Unaligned: no wait; partition 1 is read as far as it is and owes the rest.
            started = time.monotonic()
            cut, stats = offsets.align(ends, {}, _mode(unaligned=True, timeout=30))
            assert time.monotonic() - started < 5
            assert cut == {p0: 4, p1: 3}
            assert stats.mode is AlignmentMode.UNALIGNED and stats.unaligned is True
            assert stats.epoch == 7 and stats.switched is None
            assert stats.inflight == (InflightChannel(str(p1), 3, 7),)
            assert stats.persisted_inflight_bytes == 0
            # Aligned with aligned_timeout: waits 0.5 s for partition 1, then switches.
            cut, stats = offsets.align(ends, {}, _mode(aligned_timeout="500ms", timeout=30))
            assert cut == {p0: 4, p1: 3} and stats.unaligned is True
            assert stats.switched == "aligned_timeout 0.5 s" and stats.waited_ms >= 500
            # At-least-once: no alignment, everything there is.
            cut, stats = offsets.align(ends, {}, _mode(mode="AT_LEAST_ONCE"))
            assert cut == ends and stats == InputAlignment(AlignmentMode.AT_LEAST_ONCE)
            # Epoch 8 everywhere; partition 1 also delivers the rest of epoch 7 and its
            # marker. The next checkpoint starts where the unaligned one ended: partition 1
            # skips marker 7 and both channels end at marker 8 (aligned again).
            channels.rows_to(1, 7, ["g"])
            channels.marker(1, 7)
            for partition in (0, 1):
                channels.rows_to(partition, 8, ["h"])
                channels.marker(partition, 8)
            ends = kafka.end_offsets(channels.tps)
            cut, stats = offsets.align(ends, {p0: 4, p1: 3}, _mode(timeout=10))
            assert cut == {p0: 6, p1: 7} == ends
            assert (stats.mode, stats.epoch, stats.inflight) == (AlignmentMode.ALIGNED, 8, ())
    finally:
        channels.close()


def test_unaligned_stage_counts_every_row_exactly_once(spark, kafka_bootstrap, tmp_path) -> None:
    # Stage 2 counts rows per key, unaligned, while channel 1 lags a marker behind channel 0
    # in every epoch; its rows arrive after stage 2's checkpoint. Every row is counted once.
    channels = Channels(kafka_bootstrap)
    name = f"unal{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(
        name,
        StageSource(
            "in",
            [channels.topic],
            value_format="json",
            schema={"key": "string"},
            upstream="up",
            upstream_uid="to-down",
        ),
    ).then(running_sum("counts", key="key"))
    store = FileStore(f"file://{tmp_path}/unaligned")
    config = CheckpointConfig.from_mapping(
        {"pipeline": name, "storage": store.url, "unaligned": True, "timeout": 30, "retained": 9}
    )
    try:
        lagging: list[str] = []
        for epoch in range(1, 5):
            keys = [f"k{(epoch * 3 + i) % 5}" for i in range(6)]
            channels.rows_to(0, epoch, keys[:3])
            channels.marker(0, epoch)
            channels.rows_to(1, epoch, keys[3:5])
            if lagging:  # the previous epoch's marker of channel 1 comes late
                channels.marker(1, epoch - 1)
            done = run_cycle(
                spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2
            )
            assert done.checkpoint_id.value == epoch
            channels.rows_to(1, epoch, keys[5:])  # after the checkpoint: in flight
            lagging.append(keys[5])
        channels.marker(1, 4)
        for partition in (0, 1):
            channels.rows_to(partition, 5, ["k9"])
            channels.marker(partition, 5)
        aligned = CheckpointConfig.from_mapping(
            {"pipeline": name, "storage": store.url, "timeout": 30, "retained": 9}
        )
        run_cycle(spark, pipeline, aligned, store, bootstrap=kafka_bootstrap, parallelism=2)
        assert read_keyed_state(store, name, "counts") == dict(channels.rows)
        view = CheckpointCoordinator(store, config).view()
        labels = [view.pending_record(cid).alignment for cid in view.completed]
        assert all(isinstance(a, InputAlignment) for a in labels)
        assert [a.unaligned for a in labels] == [True, True, True, True, False]
        assert [a.epoch for a in labels] == [1, 2, 3, 4, 5]
        # The same statistics go into _metadata, for the stage and each of its subtasks.
        for cid in view.completed:
            statistics = view.metadata(cid).statistics
            assert statistics is not None and statistics.alignment is not None
            assert statistics.alignment == view.pending_record(cid).alignment
            assert set(statistics.subtasks) == {"in#0", "counts#0", "counts#1"}
            for subtask in statistics.subtasks.values():
                assert subtask.unaligned is statistics.alignment.unaligned
                assert subtask.persisted_inflight_bytes == 0
        p1 = str(channels.tps[1])
        assert [[(i.channel, i.until_marker) for i in a.inflight] for a in labels] == [
            [(p1, 1)],
            [(p1, 2)],
            [(p1, 3)],
            [(p1, 4)],
            [],
        ]
    finally:
        channels.close()


def test_at_least_once_stages_write_no_markers_and_lose_nothing(
    spark, kafka_bootstrap, tmp_path
) -> None:
    s1, s2, first, second, sink, internal, _ = _word_stages(kafka_bootstrap, "alo")
    store1, store2 = FileStore(f"file://{tmp_path}/a1"), FileStore(f"file://{tmp_path}/a2")
    sink.open()
    for pipeline, store, name in ((first, store1, s1), (second, store2, s2)):
        config = CheckpointConfig.from_mapping(
            {"pipeline": name, "storage": store.url, "mode": "AT_LEAST_ONCE", "retained": 5}
        )
        for _ in range(2):
            run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2)
    records = _internal(kafka_bootstrap, internal)
    rows = [json.loads(v) for part in records.values() for h, v in part]
    assert all("mcp-marker" not in h for part in records.values() for h, _ in part)
    # One epoch held all the input and nothing was replayed: one row per word, its count.
    assert sorted((r["key"], r["total"]) for r in rows) == sorted(TRUTH.items())
    # Stage 2 read everything there was without aligning: every word's final count.
    assert read_keyed_state(store2, s2, "maxes") == dict(TRUTH)
    view = CheckpointCoordinator(store2, _config(store2, s2, None)).view()
    alignment = view.pending_record(view.completed[-1]).alignment
    assert alignment == InputAlignment(AlignmentMode.AT_LEAST_ONCE)


def _join(auction, auctions, bids, state):
    """Bids joined with their auction: the state keeps the item and the top bid."""
    state = dict(state or {"item": None, "top": None})
    for row in auctions:
        state["item"] = row["item"]
    for row in bids:
        state["top"] = max(state["top"] or 0, row["price"])
    out = []
    if state["item"] is not None and state["top"] is not None:
        out.append({"auction": auction, "item": state["item"], "top": state["top"]})
    return out, state


def test_a_two_input_operator_joins_bids_with_auctions(spark, kafka_bootstrap, tmp_path) -> None:
    from examples.wordcount import produce

    tag = uuid.uuid4().hex[:6]
    auctions_topic, bids_topic = f"auctions-{tag}", f"bids-{tag}"
    auctions = [{"auction": a, "item": f"item-{a}"} for a in range(10)]
    bids = [{"auction": (7 * i) % 12, "price": (i * 37) % 101 + 1} for i in range(60)]
    # Bids of auctions 10 and 11 have no auction; the first bids come before any auction.
    produce(kafka_bootstrap, bids_topic, [json.dumps(b) for b in bids[:20]])
    produce(kafka_bootstrap, auctions_topic, [json.dumps(a) for a in auctions[:5]])
    name = f"join{tag}"
    pipeline = Pipeline(
        name,
        UnionSource(
            "in",
            [
                KafkaSource("auctions", [auctions_topic], "json", {"auction": "long", "item": "string"}),
                KafkaSource("bids", [bids_topic], "json", {"auction": "long", "price": "long"}),
            ],
        ),
    ).then(
        co_keyed("join", "auction", _join, "auction long, item string, top long",
                 left="auctions", right="bids")
    )  # fmt: skip
    store = FileStore(f"file://{tmp_path}/join")
    config = _config(store, name, 8)
    outputs: list[dict] = []

    def cycle():
        done = run_cycle(
            spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2, collect=True
        )
        outputs.extend(done.outputs or [])
        return done

    for _ in range(3):
        cycle()
    produce(kafka_bootstrap, auctions_topic, [json.dumps(a) for a in auctions[5:]], create=False)
    produce(kafka_bootstrap, bids_topic, [json.dumps(b) for b in bids[20:]], create=False)
    while cycle().records:
        pass
    truth: dict[int, dict] = {}
    for a in auctions:
        truth.setdefault(a["auction"], {"item": None, "top": None})["item"] = a["item"]
    for b in bids:
        entry = truth.setdefault(b["auction"], {"item": None, "top": None})
        entry["top"] = max(entry["top"] or 0, b["price"])
    assert read_keyed_state(store, name, "join") == truth
    assert set(truth) == set(range(12)) and truth[10]["item"] is None
    # The last output of each auction is its item and top bid; none without an auction.
    last = {row["auction"]: (row["item"], row["top"]) for row in outputs}
    assert last == {a: (t["item"], t["top"]) for a, t in truth.items() if t["item"] and t["top"]}


def test_a_fan_in_stage_aligns_each_input_on_its_own_upstream(kafka_bootstrap) -> None:
    # Upstream A finished its epoch 3 in both channels; upstream B's epoch 9 reached one
    # channel only. With aligned_timeout, input A is aligned and input B switches.
    a, b = Channels(kafka_bootstrap, upstream="upA"), Channels(kafka_bootstrap, upstream="upB")
    try:
        for partition in (0, 1):
            a.rows_to(partition, 3, ["x"])
            a.marker(partition, 3)
            b.rows_to(partition, 9, ["y", "z"])
        b.marker(0, 9)
        with KafkaOffsets(kafka_bootstrap) as kafka:
            union = UnionOffsets(
                {
                    "a": ((a.topic,), StageOffsets(kafka, "upA", "to-down")),
                    "b": ((b.topic,), StageOffsets(kafka, "upB", "to-down")),
                }
            )
            ends = union.end_offsets([*a.tps, *b.tps])
            cut, stats = union.align(ends, {}, _mode(aligned_timeout="300ms", timeout=30))
        assert cut == {a.tps[0]: 2, a.tps[1]: 2, b.tps[0]: 3, b.tps[1]: 2}
        assert stats.unaligned is True
        assert (stats.inputs["a"].mode, stats.inputs["a"].epoch) == (AlignmentMode.ALIGNED, 3)
        assert (stats.inputs["b"].mode, stats.inputs["b"].epoch) == (AlignmentMode.UNALIGNED, 9)
        assert stats.inputs["b"].inflight == (InflightChannel(str(b.tps[1]), 2, 9),)
    finally:
        a.close()
        b.close()
