"""Nexmark queries 5, 7, 8 and 11 on the engine: windows and process functions, one stage.

The input is :mod:`examples.nexmark_data` (Parquet files in arrival order, or Kafka topics
for q8), read with event time ``date_time`` and a bounded out-of-orderness; the output goes
to an exactly-once ``FileSink`` (uid ``out``), read back whole with :func:`read_epochs`.

- q5, hot items: ``sliding_window`` of 10 s every 2 s counts the bids per auction; a
  ``WindowTop`` keyed by ``window_start`` keeps, per window, the auctions with the top count.
  Rows ``window_start, window_end, auction, num``.
- q7, highest bid: ``tumbling_window`` of 10 s keyed by the window keeps its top-priced
  bids (``top_bids``); in two stages, per auction first, then a ``WindowTop`` per window.
  Rows ``window_start, window_end, auction, bidder, price``.
- q8, new users: a ``UnionSource`` of persons and auctions keyed by person id (= seller),
  ``NewUsers`` (a two-input process function with event-time timers) emits each person who
  joined and opened an auction in the same 10 s tumbling window. Rows ``window_start,
  window_end, person, name``.
- q11, user sessions: ``session_window`` with a gap of 10 s counts the bids per bidder.
  Rows ``bidder, window_start, window_end, bids``.

A window's rows leave once the watermark reaches ``window_end - 1``. With an allowed
lateness ``L``, a late row that a kept window accepts makes the window fire again with its
updated result (a session may grow into a longer one): the answer is each window's last
firing (:func:`final_rows`), which equals the ground truth given the watermark each event met
(:func:`examples.nexmark_data.watermarks_at_arrival` with the bound + 1: the engine's
watermark is ``max - bound - 1``). ``examples.nexmark_query_stages`` splits q5 and q7 in two.
"""

from __future__ import annotations

import json
from typing import Any

from microcheckpoint.engine import (
    Aggregator,
    EventTime,
    FileSource,
    KafkaSource,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    ProcessContext,
    UnionSource,
    count_rows,
    map_state,
    session_window,
    sliding_window,
    tumbling_window,
)
from microcheckpoint.engine.api import KeyedOperator
from microcheckpoint.sinks.files import FileSink

__all__ = [
    "SINK",
    "bids_source",
    "NewUsers",
    "WindowTop",
    "final_rows",
    "q11",
    "q5",
    "q5_counts",
    "q5_top",
    "q7",
    "q7_auction_top",
    "q7_top",
    "q8",
    "read_epochs",
    "top_bids",
    "window_time",
]

SINK = "out"
SIZE_MS, SLIDE_MS, GAP_MS = 10_000, 2_000, 10_000
Q5_DDL = "window_start long, window_end long, auction long, num long"
Q7_DDL = "window_start long, window_end long, auction long, bidder long, price long"
Q8_DDL = "window_start long, window_end long, person long, name string"
BID_SCHEMA = {"auction": "long", "bidder": "long", "price": "long", "date_time": "long"}


def bids_source(url: str, bound_ms: int, files_per_epoch: int) -> FileSource:
    """The bids folder, ``files_per_epoch`` Parquet files per epoch, event time ``date_time``."""
    return FileSource(
        "bids",
        url,
        max_files_per_epoch=files_per_epoch,
        event_time=EventTime("date_time", bound_ms),
    )


class WindowTop(KeyedProcessFunction):
    """Per window (keyed by ``window_start``), the members with the top ``measure``.

    Its input is a window operator's firings (``window_time``): each firing of a
    member carries the member's whole current result (one row, or one row per tie). A
    member's rows replace its earlier ones; every epoch with rows for the window emits the
    window's rows whose ``measure`` equals the top over all members (ties: every row). The
    window is forgotten once the watermark reaches ``window_end - 1 + allowed_lateness_ms``
    (after that no firing can come).

    Args:
        member: the output column the input's ``member`` (the window operator's key, JSON)
            becomes, JSON-decoded.
        measure: the column compared.
        fields: the input columns kept, next to ``member`` and ``measure``.
        allowed_lateness_ms: the window operator's allowed lateness.
    """

    states = (map_state("members"),)

    def __init__(
        self, member: str, measure: str, fields: tuple[str, ...] = (), allowed_lateness_ms: int = 0
    ) -> None:
        self.member, self.measure, self.fields = member, measure, fields
        self.lateness = allowed_lateness_ms

    def process(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        """Steps: 1. the members' new rows replace their old ones; 2. the top rows leave;
        3. a timer forgets the window when no firing can come any more."""
        # Step 1
        members = ctx.state("members")
        fresh: dict[str, list[dict]] = {}
        for row in rows:
            kept = {f: row[f] for f in (self.measure, *self.fields)}
            fresh.setdefault(row["member"], []).append(kept)
        for member, kept in sorted(fresh.items()):
            members.put(member, kept)
        # Step 2
        end = rows[0]["window_end"]
        every = [(json.loads(m), r) for m, rs in members.items() for r in rs]
        top = max(r[self.measure] for _, r in every)
        out = [
            {"window_start": key, "window_end": end, self.member: m, **r}
            for m, r in sorted(every, key=lambda mr: (mr[0], sorted(mr[1].items())))
            if r[self.measure] == top
        ]
        # Step 3
        ctx.timers.register_event_time(end - 1 + self.lateness)
        return out

    def on_late(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        """A firing again (stamped ``window_end - 1``, behind the watermark): the same."""
        return self.process(key, rows, ctx)

    def on_timer(self, key: Any, timestamp: int, ctx: ProcessContext) -> None:
        ctx.state("members").clear()


def window_time(df: Any) -> Any:
    """A window operator's firings for ``WindowTop``: ``key`` renamed ``member`` (a Kafka
    row's ``key`` is its record key), stamped with event time ``window_end - 1`` (Flink's
    ``maxTimestamp``) in ``date_time``, the source's event-time column."""
    from pyspark.sql import functions as F

    firings = df.withColumnRenamed("key", "member")
    return firings.withColumn("date_time", F.col("window_end") - 1)


def top_bids(fields: tuple[str, ...] = ("bidder",)) -> Aggregator:
    """The bids with the top price (``[[price, *fields], ...]``; ties: every bid, the same
    bid twice gives two); the result is ``[{"price", *fields}, ...]``."""

    def add(acc: list, row: dict) -> list:
        bid = [row["price"], *(row[f] for f in fields)]
        if not acc or bid[0] > acc[0][0]:
            return [bid]
        return [*acc, bid] if bid[0] == acc[0][0] else acc

    def result(acc: list) -> list[dict]:
        return [{"price": b[0], **dict(zip(fields, b[1:], strict=True))} for b in acc]

    return Aggregator(list, add, result)


def q5_counts(allowed_lateness_ms: int = 0) -> KeyedOperator:
    """q5's first step: bids per auction per sliding window (10 s every 2 s)."""
    return sliding_window(
        "q5-counts",
        "auction",
        SIZE_MS,
        SLIDE_MS,
        count_rows("num long"),
        allowed_lateness_ms=allowed_lateness_ms,
    )


def q5_top(allowed_lateness_ms: int = 0) -> KeyedOperator:
    """q5's second step: per window, the auctions with the top count."""
    top = WindowTop("auction", "num", allowed_lateness_ms=allowed_lateness_ms)
    return KeyedProcess("q5-top", "window_start", top, Q5_DDL, late="side_output")


def q7_auction_top(allowed_lateness_ms: int = 0) -> KeyedOperator:
    """q7's first step: per auction per tumbling window (10 s), its top-priced bids."""
    return tumbling_window(
        "q7-auction-top",
        "auction",
        SIZE_MS,
        top_bids(),
        output="bidder long, price long",
        allowed_lateness_ms=allowed_lateness_ms,
    )


def q7_top(allowed_lateness_ms: int = 0) -> KeyedOperator:
    """q7's second step: per window, the bids with the top price over all auctions."""
    top = WindowTop("auction", "price", ("bidder",), allowed_lateness_ms)
    return KeyedProcess("q7-top", "window_start", top, Q7_DDL, late="side_output")


def q5(
    bids_url: str,
    sink: str,
    *,
    name: str = "nexmark-q5",
    bound_ms: int = 2_000,
    allowed_lateness_ms: int = 0,
    files_per_epoch: int = 1,
) -> Pipeline:
    """q5 in one stage over the bids folder ``bids_url``, output to ``FileSink(SINK, sink)``."""
    return (
        Pipeline(name, bids_source(bids_url, bound_ms, files_per_epoch))
        .then(q5_counts(allowed_lateness_ms))
        .then(window_time)
        .then(q5_top(allowed_lateness_ms))
        .then(FileSink(SINK, sink))
    )


def _tumble(df: Any) -> Any:
    """The bid's 10 s tumbling window start, ``window``: q7's key."""
    from pyspark.sql import functions as F

    return df.withColumn("window", F.col("date_time") - F.col("date_time") % SIZE_MS)


def _q7_rows(df: Any) -> Any:
    return df.select("window_start", "window_end", "auction", "bidder", "price")


def q7(
    bids_url: str,
    sink: str,
    *,
    name: str = "nexmark-q7",
    bound_ms: int = 2_000,
    allowed_lateness_ms: int = 0,
    files_per_epoch: int = 1,
) -> Pipeline:
    """q7 in one stage (arguments as ``q5``): one ``tumbling_window`` keyed by the window
    itself keeps its top-priced bids (as Spark's ``groupBy(window)``; the two stages split
    it by auction first: ``q7_auction_top``, ``q7_top``)."""
    top = tumbling_window(
        "q7-top",
        "window",
        SIZE_MS,
        top_bids(("auction", "bidder")),
        output="price long, auction long, bidder long",
        allowed_lateness_ms=allowed_lateness_ms,
    )
    return (
        Pipeline(name, bids_source(bids_url, bound_ms, files_per_epoch))
        .then(_tumble)
        .then(top)
        .then(_q7_rows)
        .then(FileSink(SINK, sink))
    )


def _session_rows(df: Any) -> Any:
    """The session window's rows as q11's: ``bidder`` (the key as a long) first."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("key").cast("long").alias("bidder"), "window_start", "window_end", "bids"
    )


def q11(
    bids_url: str,
    sink: str,
    *,
    name: str = "nexmark-q11",
    bound_ms: int = 2_000,
    allowed_lateness_ms: int = 0,
    files_per_epoch: int = 1,
) -> Pipeline:
    """q11 in one stage (arguments as ``q5``): bids per bidder per session (gap 10 s)."""
    sessions = session_window(
        "q11-sessions",
        "bidder",
        GAP_MS,
        count_rows("bids long"),
        allowed_lateness_ms=allowed_lateness_ms,
    )
    return (
        Pipeline(name, bids_source(bids_url, bound_ms, files_per_epoch))
        .then(sessions)
        .then(_session_rows)
        .then(FileSink(SINK, sink))
    )


class NewUsers(KeyedProcessFunction):
    """q8 per person (keyed by person id = seller): the windows they joined and sold in.

    State ``windows``: window start -> ``[name or None, opened an auction, emitted]``. A
    person row sets the name, an auction row the flag; a window whose end is behind the
    watermark plus the allowed lateness is gone (the row is dropped, as Flink drops a row
    for a late window). The window's timer at ``end - 1`` emits the person once both are
    there; a late row that completes a fired window emits it then; the timer at
    ``end - 1 + allowed_lateness_ms`` forgets it.
    """

    states = (map_state("windows"),)

    def __init__(self, persons: str, size_ms: int = SIZE_MS, allowed_lateness_ms: int = 0):
        self.persons, self.size, self.lateness = persons, size_ms, allowed_lateness_ms

    def process(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        windows, out = ctx.state("windows"), []
        for row in rows:
            ts = ctx.event_time(row)
            start = ts - ts % self.size
            end = start + self.size
            if ctx.watermark is not None and end - 1 + self.lateness <= ctx.watermark:
                continue  # its window is gone
            name, opened, emitted = windows.get(start, [None, False, False])
            if row["input"] == self.persons:
                name = row["name"]
            else:
                opened = True
            fired = ctx.watermark is not None and end - 1 <= ctx.watermark
            if fired and name is not None and opened and not emitted:
                out.append(_new_user(key, start, end, name))
                emitted = True
            windows.put(start, [name, opened, emitted])
            ctx.timers.register_event_time(end - 1)
            ctx.timers.register_event_time(end - 1 + self.lateness)
        return out

    def on_late(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        return self.process(key, rows, ctx)

    def on_timer(self, key: Any, timestamp: int, ctx: ProcessContext) -> list[dict]:
        windows, out = ctx.state("windows"), []
        for start, (name, opened, emitted) in sorted(windows.items()):
            end = start + self.size
            if end - 1 == timestamp and name is not None and opened and not emitted:
                out.append(_new_user(key, start, end, name))
                windows.put(start, [name, opened, True])
            if end - 1 + self.lateness <= timestamp:
                windows.remove(start)
        return out


def _new_user(person: Any, start: int, end: int, name: str) -> dict[str, Any]:
    return {"window_start": start, "window_end": end, "person": person, "name": name}


def _by_person(df: Any) -> Any:
    """Persons keyed by ``id``, auctions by ``seller``: the column ``person``."""
    from pyspark.sql import functions as F

    person = F.when(F.col("input") == "persons", F.col("id")).otherwise(F.col("seller"))
    return df.withColumn("person", person)


def q8(
    persons_topic: str,
    auctions_topic: str,
    sink: str,
    *,
    name: str = "nexmark-q8",
    bound_ms: int = 2_000,
    allowed_lateness_ms: int = 0,
) -> Pipeline:
    """q8 in one stage over two JSON Kafka topics (``kafka_values`` of persons, auctions)."""
    from examples.nexmark_data import AUCTION_SCHEMA, PERSON_SCHEMA

    when = EventTime("date_time", bound_ms)
    source = UnionSource(
        "persons-and-auctions",
        [
            KafkaSource("persons", [persons_topic], "json", PERSON_SCHEMA, event_time=when),
            KafkaSource("auctions", [auctions_topic], "json", AUCTION_SCHEMA, event_time=when),
        ],
    )
    users = NewUsers("persons", allowed_lateness_ms=allowed_lateness_ms)
    return (
        Pipeline(name, source)
        .then(_by_person)
        .then(KeyedProcess("q8-new-users", "person", users, Q8_DDL, late="side_output"))
        .then(FileSink(SINK, sink))
    )


# -- reading the output back -------------------------------------------------------------------


def read_epochs(target: str, pipeline: str, uid: str = SINK) -> dict[int, list[dict]]:
    """The sink's published rows per epoch (only files an epoch's manifest lists)."""
    from microcheckpoint.adapters.stores import open_store

    store = open_store(target)
    out: dict[int, list[dict]] = {}
    for key in store.list(f"{pipeline}/{uid}/_manifests/"):
        epoch = int(key.rsplit("epoch-", 1)[1].split(".")[0])
        body = json.loads(store.get(key).data)
        rows = out.setdefault(epoch, [])
        for entry in body["files"]:
            data = store.get(entry["key"]).data
            rows.extend(json.loads(line) for line in data.splitlines() if line)
    return dict(sorted(out.items()))


def final_rows(epochs: dict[int, list[dict]], window: tuple[str, ...]) -> list[dict]:
    """Each window's rows of its last firing, sorted: the answer when windows fire again.

    ``window`` names the columns that identify a window (``("window_start",)``, or
    ``("bidder", "window_start", "window_end")`` for sessions). For sessions a later
    session of the bidder that contains an earlier one (it grew from late rows) replaces it.
    """
    last: dict[tuple, list[dict]] = {}
    for _, rows in sorted(epochs.items()):
        fresh: dict[tuple, list[dict]] = {}
        for row in rows:
            fresh.setdefault(tuple(row[c] for c in window), []).append(row)
        last.update(fresh)
    if "bidder" in window:
        spans = list(last)
        last = {
            w: rows
            for w, rows in last.items()
            if not any(o != w and o[0] == w[0] and o[1] <= w[1] and w[2] <= o[2] for o in spans)
        }
    return sorted((r for rows in last.values() for r in rows), key=lambda r: sorted(r.items()))
