"""Keyed process functions on the real engine (local Spark, a file source, file storage):
timers pending across a savepoint restore and a rescale, the watermark restored exactly, TTL
across a restore, processing-time timers and late rows, all against exact expectations.

Epochs read one Parquet file each; the coordinator's clock is given (``run_cycle(clock=)``),
so trigger times, hence TTL and processing time, are exact.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import (
    EventTime,
    FileSource,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    StateTtl,
    list_state,
    value_state,
)
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.event_time import restored_watermarks
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.savepoints import (
    ClaimMode,
    choose_restore,
    create_savepoint,
    list_savepoints,
    restore,
)
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.kinds import LATE_KEY
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0  # the clock of epoch 0, seconds
GAP = 50  # an event-time timer fires this long after a key's latest row
KEYS = [f"k{i}" for i in range(12)]
SCHEMA = "k string, at long, n long, rows string"


class Gaps(KeyedProcessFunction):
    """Per key: the rows seen since its last report (a list), and an event-time timer
    ``GAP`` ms after its latest row; the timer reports them and clears the list. Late rows
    go to the side output."""

    states = (list_state("pending"), value_state("latest", default=0))

    def process(self, key, rows, ctx):
        ctx.state("pending").add_all([r["ts"] for r in rows])
        latest = ctx.state("latest")
        old = latest.value()
        latest.update(max(old, *(r["ts"] for r in rows)))
        if latest.value() != old:
            if old:
                ctx.timers.delete_event_time(old + GAP)
            ctx.timers.register_event_time(latest.value() + GAP)
        return []

    def on_timer(self, key, timestamp, ctx):
        seen = ctx.state("pending").get()
        ctx.state("pending").clear()
        return [{"k": key, "at": timestamp, "n": len(seen), "rows": ",".join(map(str, seen))}]

    def on_late(self, key, rows, ctx):
        return [{"k": key, "at": -1, "n": len(rows), "rows": ",".join(str(r["ts"]) for r in rows)}]


def _files(folder: Path, epochs: int) -> list[list[tuple[str, int]]]:
    """File i holds, for a rotating third of the keys, rows at event times ~100 ms per epoch
    apart, one key's row arriving 30 ms out of order and one 500 ms late."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(epochs):
        base = 1_000 + i * 100
        rows = [(k, base + j) for j, k in enumerate(KEYS) if (j + i) % 3 != 0]
        rows.append((KEYS[i % len(KEYS)], base - 30))  # out of order, within the bound
        if i >= 2:
            rows.append((KEYS[(i + 5) % len(KEYS)], base - 500))  # late
        pq.write_table(
            pa.table({"k": [k for k, _ in rows], "ts": [t for _, t in rows]}),
            folder / f"part-{i:05d}.parquet",
        )
        written.append(rows)
    return written


def _pipeline(name: str, folder: Path) -> Pipeline:
    source = FileSource(
        "files", folder.as_uri(), max_files_per_epoch=1, event_time=EventTime("ts", 40)
    )
    return Pipeline(name, source).then(
        KeyedProcess("gaps", "k", Gaps(), SCHEMA, late="side_output")
    )


def _config(store, name: str) -> CheckpointConfig:
    return CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url, "retained": 2})


def _epoch(spark, pipeline, store, parallelism: int, epoch: int):
    return run_cycle(
        spark, pipeline, _config(store, pipeline.name), store, bootstrap="",
        parallelism=parallelism, collect=True, clock=lambda: T0 + 60 * epoch,
    )  # fmt: skip


def _sorted(outputs) -> list[tuple]:
    return sorted((r["k"], r["at"], r["n"], r["rows"]) for r in outputs)


def _expected(files: list[list[tuple[str, int]]]) -> list[list[tuple]]:
    """Per epoch, the outputs by the rules, computed in plain Python."""
    mark, latest, pending, timers = None, {}, {}, {}
    out = []
    for rows in files:
        epoch = []
        for k, ts in rows:
            if mark is not None and ts <= mark:
                epoch.append((k, -1, 1, str(ts)))
                continue
            pending.setdefault(k, []).append(ts)
            latest[k] = max(latest.get(k, 0), ts)
            timers[k] = latest[k] + GAP
        highs = [t for k, t in rows]
        new = max(highs) - 40 - 1
        mark = new if mark is None else max(mark, new)
        for k in sorted(k for k, t in timers.items() if t <= mark):
            seen = pending.pop(k)
            epoch.append((k, timers.pop(k), len(seen), ",".join(map(str, seen))))
        out.append(sorted(epoch))
    return out


def _watermark(store, name: str, source: str = "files"):
    view = scan(store, Layout(name))
    meta = view.metadata(view.latest_completed)
    handles = [h for t, a in meta.acks.items() if t.uid.value == source for h in a.handles]
    return restored_watermarks(store, handles)


def test_pending_timers_survive_a_savepoint_restore_and_rescales(spark, tmp_path) -> None:
    files = _files(tmp_path / "in", 8)
    expected = _expected(files)
    assert sum(1 for epoch in expected for r in epoch if r[1] == -1) == 6  # late rows
    store = FileStore((tmp_path / "chk").as_uri())
    reference = _pipeline(f"ref-{uuid.uuid4().hex[:6]}", tmp_path / "in")
    ref = [_sorted(_epoch(spark, reference, store, 2, e).outputs) for e in range(8)]
    assert ref == expected

    name = f"moved-{uuid.uuid4().hex[:6]}"
    moved = _pipeline(name, tmp_path / "in")
    got = [_sorted(_epoch(spark, moved, store, 2, e).outputs) for e in range(3)]
    got += [_sorted(_epoch(spark, moved, store, 3, e).outputs) for e in range(3, 5)]  # rescale
    create_savepoint(store, name, CheckpointId(5))
    saved = _watermark(store, name)
    _epoch(spark, moved, store, 3, 5)  # an epoch whose output the restore discards
    (prefix,) = list_savepoints(store, name)
    restore(store, name, choose_restore(store, name, savepoint=(store, prefix)), ClaimMode.NO_CLAIM)
    first = _epoch(spark, moved, store, 1, 5)  # rescaled again, to 1
    got.append(_sorted(first.outputs))
    got += [_sorted(_epoch(spark, moved, store, 1, e).outputs) for e in range(6, 8)]
    assert got == expected
    assert saved.watermark == max(t for rows in files[:5] for _, t in rows) - 40 - 1
    assert _watermark(store, name) == _watermark(store, reference.name)
    # every key still waiting holds exactly its unreported rows
    state = read_keyed_state(store, name, "gaps")
    assert state == read_keyed_state(store, reference.name, "gaps")


class Expiring(KeyedProcessFunction):
    """A value with a 90 s TTL (on create) and a processing-time timer 100 s after a key's
    first row; the timer reports whether the value is still visible."""

    states = (value_state("first", ttl=StateTtl(90, update="on_create")),)

    def process(self, key, rows, ctx):
        first = ctx.state("first")
        if first.value() is None:
            first.update(min(r["ts"] for r in rows))
            ctx.timers.register_processing_time(ctx.processing_time + 100_000)
        else:
            first.update(first.value())  # a write: on_create keeps the first timestamp
        return []

    def on_timer(self, key, timestamp, ctx):
        return [{"k": key, "at": timestamp, "n": ctx.state("first").value() or 0, "rows": ""}]


def test_ttl_and_processing_time_timers_across_a_restore(spark, tmp_path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        pq.write_table(
            pa.table({"k": ["a", "b"] if i == 0 else ["a"], "ts": [10 + i, 20 + i][: 2 - (i > 0)]}),
            folder / f"part-{i:05d}.parquet",
        )
    name = f"ttl-{uuid.uuid4().hex[:6]}"
    store = FileStore((tmp_path / "chk").as_uri())
    pipeline = Pipeline(name, FileSource("files", folder.as_uri(), max_files_per_epoch=1)).then(
        KeyedProcess("expiring", "k", Expiring(), SCHEMA)
    )
    trigger_ms = lambda e: int((T0 + 60 * e) * 1000)  # noqa: E731
    outs = [_sorted(_epoch(spark, pipeline, store, 2, 0).outputs)]
    create_savepoint(store, name, CheckpointId(1))
    outs.append(_sorted(_epoch(spark, pipeline, store, 2, 1).outputs))  # t = 60 s: alive
    assert read_keyed_state(store, name, "expiring")["a"]["s"]["first"] == [10, trigger_ms(0)]
    (prefix,) = list_savepoints(store, name)
    restore(store, name, choose_restore(store, name, savepoint=(store, prefix)), ClaimMode.NO_CLAIM)
    # after the restore: epoch 1 again at t = 60 s, then t = 120 s: a's value, created at
    # 0 s with a 90 s TTL, has expired, so its row creates it again (12) before the timers
    # due at 100 s fire; b's has expired; then t = 180 s
    outs += [_sorted(_epoch(spark, pipeline, store, 3, e).outputs) for e in (1, 2, 3)]
    assert outs == [
        [],
        [],
        [],
        [("a", trigger_ms(0) + 100_000, 12, ""), ("b", trigger_ms(0) + 100_000, 0, "")],
        [],
    ]
    state = read_keyed_state(store, name, "expiring")
    assert state["a"]["s"]["first"] == [12, trigger_ms(2)]  # on_create: epoch 3 kept it
    assert "b" in state  # b was not written since: its expired entry is still in the files


def test_late_rows_are_counted_per_key_group(spark, tmp_path) -> None:
    files = _files(tmp_path / "in", 4)
    name = f"late-{uuid.uuid4().hex[:6]}"
    store = FileStore((tmp_path / "chk").as_uri())
    pipeline = _pipeline(name, tmp_path / "in")
    for e in range(4):
        _epoch(spark, pipeline, store, 2, e)
    view = scan(store, Layout(name))
    meta = view.metadata(view.latest_completed)
    from microcheckpoint.state.chains import key_group_chains, load_key_group
    from microcheckpoint.state.files import read_rows

    handles = [h for t, a in meta.acks.items() if t.uid.value == "gaps" for h in a.handles]
    late = 0
    for kg, chain in key_group_chains(handles).items():
        group = load_key_group(chain, kg, lambda h: read_rows(store, h))
        late += group.get(LATE_KEY, (0, 0))[0]
    assert late == len(files) - 2  # one late row in each file after the second


class Echo(KeyedProcessFunction):
    """An event-time timer at every row's time; each firing is one output row."""

    def process(self, key, rows, ctx):
        for row in rows:
            ctx.timers.register_event_time(row["ts"])

    def on_timer(self, key, timestamp, ctx):
        return [{"k": key, "at": timestamp, "n": ctx.watermark, "rows": ""}]


def test_an_idle_kafka_partition_stops_holding_the_watermark_back(
    spark, kafka_bootstrap, tmp_path
) -> None:
    import json

    from kafka import KafkaProducer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine import KafkaSource

    topic = f"idle-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")

    def send(partition: int, key: str, ts: int) -> None:
        value = json.dumps({"k": key, "ts": ts}).encode()
        producer.send(topic, value=value, partition=partition).get(timeout=30)

    source = KafkaSource(
        "events", [topic], value_format="json", schema={"k": "string", "ts": "long"},
        event_time=EventTime("ts", 0, idle_timeout_s=100),
    )  # fmt: skip
    name = f"idle-{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(name, source).then(KeyedProcess("echo", "k", Echo(), SCHEMA))
    store = FileStore((tmp_path / "chk").as_uri())
    config = CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url})
    outs, marks = [], []
    for epoch, sends in enumerate(
        [[(0, "a", 1_000), (1, "b", 500)], [(0, "a", 2_000)], [(0, "a", 3_000)], []]
    ):
        for partition, key, ts in sends:
            send(partition, key, ts)
        result = run_cycle(
            spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2,
            collect=True, clock=lambda e=epoch: T0 + 60 * e,
        )  # fmt: skip
        outs.append(_sorted(result.outputs))
        marks.append(_watermark(store, name, "events").watermark)
    producer.close()
    # partition 1 last carried a record at t = 0 s; from t = 120 s on it is idle
    assert marks == [499, 499, 2_999, 2_999]
    assert outs == [  # a timer at t fires once the watermark is >= t
        [],
        [],
        [("a", 1_000, 2_999, ""), ("a", 2_000, 2_999, ""), ("b", 500, 2_999, "")],
        [],
    ]
