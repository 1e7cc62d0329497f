"""Nexmark q5, q7, q8 and q11 on the real engine equal their ground truths exactly.

Bids come from ``examples.nexmark_data.generate`` as Parquet files in arrival order, one
file per epoch (local Spark, parallelism 2, file checkpoints); q8 reads persons and auctions
from two topics of the real broker. The last file (or the last record of each topic) adds a
sentinel a minute after every event, so the final watermark passes every real window; the
windows compared are those the final watermark closed (``window_end - 1 <= W``), every real
one. The output is read back from the exactly-once ``FileSink``.

- Out-of-orderness below the bound (no event late): every window fires exactly once, and
  the rows of all epochs together equal the complete ground truth.
- Late events (arrival delay up to 10 s, bound 1 s, allowed lateness 3 s): some events are
  behind the watermark; a kept window takes them and fires again, the others are dropped.
  Each window's last firing equals the ground truth given the watermark each event met
  (the engine's: highest event time of the earlier epochs - bound - 1), which differs from
  the complete one.
- q8 over two topics, its watermark the minimum over both, with and without late events.
- q5 and q7 in two stages over an internal topic give the single stage's rows; stage 2's
  watermark comes from stage 1's barrier markers (``engine.stage_watermarks``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples import nexmark_queries as nq
from examples.nexmark_data import (
    NexmarkConfig,
    NexmarkEvents,
    generate,
    kafka_values,
    late_events,
    q5_hot_items,
    q7_highest_bid,
    q8_new_users,
    q11_user_sessions,
    watermarks_at_arrival,
    write_parquet,
)
from examples.nexmark_query_stages import build as build_stages
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.event_time import restored_watermarks
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

BIDS = 3_000
FILES = 4
WINDOW = {"q5": ("window_start",), "q7": ("window_start",), "q11": ("bidder", "window_start", "window_end")}  # fmt: skip
TRUTH = {"q5": q5_hot_items, "q7": q7_highest_bid, "q11": q11_user_sessions}
LATE = {"bound": 1_000, "delay": 10_000, "lateness": 3_000, "seed": 6}


def _key(row: dict[str, Any]) -> list:
    return sorted(row.items())


class Bids:
    """Bids of ``config`` plus the sentinel, as ``FILES`` Parquet files under ``root``."""

    def __init__(self, root: Path, config: NexmarkConfig) -> None:
        events = generate(config)
        last = max(b["date_time"] for b in events.bids)
        self.sentinel = {"auction": -1, "bidder": -1, "price": 0, "date_time": last + 60_000}
        self.rows = [*events.bids, self.sentinel]
        folders = write_parquet(NexmarkEvents([], [], self.rows), root, files=FILES)
        self.url = folders["bids"].as_uri()
        n = len(self.rows)
        self.epoch_sizes = [n * (i + 1) // FILES - n * i // FILES for i in range(FILES)]

    def expected(self, query: str, bound: int, lateness: int = 0, marks=None) -> list[dict]:
        """The ground truth's rows of the windows the final watermark closed."""
        final = self.sentinel["date_time"] - bound - 1
        options = {} if marks is None else {"watermarks": marks, "allowed_lateness_ms": lateness}
        rows = TRUTH[query](self.rows, **options)
        return sorted((r for r in rows if r["window_end"] - 1 <= final), key=_key)

    def marks(self, bound: int) -> list[int | None]:
        """The engine's watermark at each bid's epoch start (highest before - bound - 1)."""
        return watermarks_at_arrival(self.rows, bound + 1, self.epoch_sizes)


def _run(spark, pipelines, store, epochs: int, bootstrap: str = "") -> None:
    for _ in range(epochs):
        for pipeline in pipelines:
            config = CheckpointConfig.from_mapping(
                {"pipeline": pipeline.name, "storage": store.url}
            )
            run_cycle(spark, pipeline, config, store, bootstrap=bootstrap, parallelism=2)


def _single(query: str, bids: Bids, sink: str, **options: Any):
    return getattr(nq, query)(bids.url, sink, **options)


@pytest.mark.parametrize("query", ["q5", "q7", "q11"])
def test_in_order_within_the_bound_every_window_fires_once_as_the_truth(
    spark, tmp_path, query
) -> None:
    bids = Bids(tmp_path / "in", NexmarkConfig(bids=BIDS, gap_ms=50, max_delay_ms=2_000))
    assert late_events(bids.rows, 2_001, bids.epoch_sizes) == []
    sink = (tmp_path / "out").as_uri()
    pipeline = _single(query, bids, sink, bound_ms=2_000)
    _run(spark, [pipeline], FileStore((tmp_path / "chk").as_uri()), FILES)
    epochs = nq.read_epochs(sink, pipeline.name)
    every = sorted((r for rows in epochs.values() for r in rows), key=_key)
    expected = bids.expected(query, 2_000)
    assert every == expected  # each window once, none missing, none extra
    assert nq.final_rows(epochs, WINDOW[query]) == expected
    assert len({tuple(r[c] for c in WINDOW[query]) for r in expected}) == SHAPES[query]


# distinct windows (q5, q7) or sessions (q11) of the data above
SHAPES = {"q5": 86, "q7": 17, "q11": 97}


@pytest.mark.parametrize("query", ["q5", "q7", "q11"])
def test_late_events_within_the_allowed_lateness_update_their_windows(
    spark, tmp_path, query
) -> None:
    config = NexmarkConfig(bids=BIDS, gap_ms=50, max_delay_ms=LATE["delay"], seed=LATE["seed"])
    bids = Bids(tmp_path / "in", config)
    bound, lateness = LATE["bound"], LATE["lateness"]
    late = late_events(bids.rows, bound + 1, bids.epoch_sizes)
    sink = (tmp_path / "out").as_uri()
    pipeline = _single(query, bids, sink, bound_ms=bound, allowed_lateness_ms=lateness)
    _run(spark, [pipeline], FileStore((tmp_path / "chk").as_uri()), FILES)
    epochs = nq.read_epochs(sink, pipeline.name)
    expected = bids.expected(query, bound, lateness, bids.marks(bound))
    assert nq.final_rows(epochs, WINDOW[query]) == expected
    # the late events changed the answer, and some windows fired again (a session that
    # grew fires as a longer session)
    assert expected != bids.expected(query, bound)
    ids = WINDOW[query]
    fired = Counter(w for rows in epochs.values() for w in {tuple(r[c] for c in ids) for r in rows})
    again = sum(fired.values()) - len({tuple(r[c] for c in ids) for r in expected})
    assert (len(late), again > 0) == (LATE_EVENTS, True)


LATE_EVENTS = 160  # behind the watermark their epoch started with


def _produce(bootstrap: str, topic: str, rows: list[dict], key: str) -> None:
    from kafka import KafkaProducer

    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for k, value, ts in kafka_values(rows, key):
            producer.send(topic, key=k, value=value, partition=0, timestamp_ms=ts)
        producer.flush()
    finally:
        producer.close()


# (seed, arrival delay, bound, allowed lateness, records per partition and epoch) ->
# (records per epoch, rows, rows of the complete truth)
Q8 = {
    (1, 2_000, 2_000, 0, 60): ([120, 67, 60, 19], 54, 54),
    (2, 20_000, 1_000, 2_000, 40): ([80, 67, 40, 40, 39], 56, 59),
}


@pytest.mark.parametrize("case", list(Q8), ids=["in-order", "late"])
def test_q8_new_users_over_two_topics_equal_the_truth(
    kafka_bootstrap, spark, tmp_path, case
) -> None:
    seed, delay, bound, lateness, per_epoch = case
    events = generate(NexmarkConfig(bids=BIDS, gap_ms=50, max_delay_ms=delay, seed=seed))
    end = max(e["date_time"] for e in [*events.persons, *events.auctions]) + 60_000
    person = {**events.persons[0], "id": -1, "name": "sentinel", "date_time": end}
    auction = {**events.auctions[0], "id": -1, "seller": -1, "date_time": end}
    persons, auctions = [*events.persons, person], [*events.auctions, auction]
    tag = uuid.uuid4().hex[:6]
    topics = (f"q8-persons-{tag}", f"q8-auctions-{tag}")
    _produce(kafka_bootstrap, topics[0], persons, "id")
    _produce(kafka_bootstrap, topics[1], auctions, "seller")
    sink = (tmp_path / "out").as_uri()
    pipeline = nq.q8(*topics, sink, bound_ms=bound, allowed_lateness_ms=lateness)
    store = FileStore((tmp_path / "chk").as_uri())
    config = CheckpointConfig.from_mapping(
        {"pipeline": pipeline.name, "storage": store.url, "max_records_per_epoch": per_epoch}
    )
    records, rows, complete = Q8[case]
    got = [
        run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2).records
        for _ in records
    ]
    assert got == records
    epochs = nq.read_epochs(sink, pipeline.name)
    every = sorted((r for rows in epochs.values() for r in rows), key=_key)
    marks = _q8_marks(persons, auctions, per_epoch, bound) if lateness else {}
    truth = q8_new_users(persons, auctions, allowed_lateness_ms=lateness, **marks)
    expected = sorted((r for r in truth if r["window_end"] - 1 <= end - bound - 1), key=_key)
    assert every == expected  # each (window, person) once
    assert (len(expected), len(q8_new_users(persons, auctions)) - 1) == (rows, complete)


def _q8_marks(persons: list, auctions: list, per_epoch: int, bound: int) -> dict[str, list]:
    """The engine's watermark at each event's epoch start: the minimum over the two topics'
    (one partition each) highest event time so far, minus the bound and 1; epochs of
    ``per_epoch`` records per partition."""
    marks: dict[str, list] = {"person_watermarks": [], "auction_watermarks": []}
    highs: list[int | None] = [None, None]
    mark = None
    for start in range(0, max(len(persons), len(auctions)), per_epoch):
        for i, (rows, name) in enumerate(((persons, "person"), (auctions, "auction"))):
            epoch = rows[start : start + per_epoch]
            marks[f"{name}_watermarks"] += [mark] * len(epoch)
            highs[i] = max(
                [h for h in (highs[i],) if h is not None] + [r["date_time"] for r in epoch],
                default=None,
            )
        if None not in highs:
            low = min(highs) - bound - 1  # type: ignore[type-var]
            mark = low if mark is None else max(mark, low)
    return marks


@pytest.mark.parametrize("query", ["q5", "q7"])
def test_two_stages_give_the_single_stage_rows(kafka_bootstrap, spark, tmp_path, query) -> None:
    bids = Bids(tmp_path / "in", NexmarkConfig(bids=BIDS, gap_ms=50, max_delay_ms=2_000))
    sink = (tmp_path / "out").as_uri()
    internal = f"nexmark-{query}-firings-{uuid.uuid4().hex[:6]}"
    stages = build_stages(query, bids.url, sink, kafka_bootstrap, internal, bound_ms=2_000)
    store = FileStore((tmp_path / "chk").as_uri())
    _run(spark, stages, store, FILES, bootstrap=kafka_bootstrap)
    epochs = nq.read_epochs(sink, stages[1].name)
    every = sorted((r for rows in epochs.values() for r in rows), key=_key)
    assert every == bids.expected(query, 2_000)
    assert len(epochs) == FILES
    # stage 2's watermark is stage 1's (from its markers), not its rows' own
    final = bids.sentinel["date_time"] - 2_001
    marks = [
        _watermark(store, stages[0].name, "bids"),
        _watermark(store, stages[1].name, "from-auctions"),
    ]
    assert marks == [final, final]


def _watermark(store: FileStore, name: str, source: str) -> int | None:
    """The watermark in the source state of ``name``'s latest completed checkpoint."""
    view = scan(store, Layout(name))
    acks = view.metadata(view.latest_completed).acks
    handles = [h for t, a in acks.items() if t.uid.value == source for h in a.handles]
    return restored_watermarks(store, handles).watermark
