"""Nexmark event streams (persons, auctions, bids) with bounded out-of-orderness.

Deterministic for a seed: the same :class:`NexmarkConfig` gives the same events, in the
same arrival order. Event time ``date_time`` is epoch milliseconds from ``T0_MS``.

- persons ``{"id", "name", "email", "city", "state", "date_time"}``;
- auctions ``{"id", "seller", "category", "initial_bid", "reserve", "expires", "date_time"}``;
- bids ``{"auction", "bidder", "price", "date_time"}``.

As in Nexmark's generator, out of every 50 events 1 is a person, 3 are auctions and 46 are
bids; event time moves forward by ``gap_ms`` on average per event. An auction's seller is
the newest person half of the time (so new persons often sell in the window they joined:
query 8), otherwise one of the ``active_persons`` newest; a bid goes to one of the
``active_auctions`` newest auctions (half of the bids to the 10 newest: hot items) from
one of the ``active_persons`` newest persons.

Arrival order (the order of the lists, of the Parquet files and of the Kafka values) is
event time plus a random delay in ``[0, max_delay_ms)``, so an event arrives less than
``max_delay_ms`` after any event with a later ``date_time``: with a watermark bound of
``max_delay_ms`` (late = ``date_time <= max seen before - bound``) no event is late.
:func:`late_events` says which events a smaller bound would make late. The ground truths
of queries 5, 7, 8 and 11 are in :mod:`examples.nexmark_truth` (re-exported here).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.nexmark_truth import (
    T0_MS,
    q5_hot_items,
    q7_highest_bid,
    q8_new_users,
    q11_user_sessions,
)

__all__ = [
    "AUCTION_SCHEMA",
    "BID_SCHEMA",
    "PERSON_SCHEMA",
    "T0_MS",
    "NexmarkConfig",
    "NexmarkEvents",
    "generate",
    "kafka_values",
    "late_events",
    "max_out_of_orderness",
    "q11_user_sessions",
    "q5_hot_items",
    "q7_highest_bid",
    "q8_new_users",
    "read_parquet",
    "watermarks_at_arrival",
    "write_parquet",
]

PERSON_SCHEMA = {
    "id": "long",
    "name": "string",
    "email": "string",
    "city": "string",
    "state": "string",
    "date_time": "long",
}
AUCTION_SCHEMA = {
    "id": "long",
    "seller": "long",
    "category": "long",
    "initial_bid": "long",
    "reserve": "long",
    "expires": "long",
    "date_time": "long",
}
BID_SCHEMA = {"auction": "long", "bidder": "long", "price": "long", "date_time": "long"}
_SCHEMAS = {"persons": PERSON_SCHEMA, "auctions": AUCTION_SCHEMA, "bids": BID_SCHEMA}
_CITIES = [("Phoenix", "AZ"), ("Portland", "OR"), ("Boise", "ID"), ("Kent", "WA"), ("Bend", "OR")]
_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter"]


@dataclass(frozen=True)
class NexmarkConfig:
    """What to generate.

    Attributes:
        bids: how many bids (persons and auctions follow from Nexmark's 1:3:46 mix).
        seed: the random seed; the same config gives the same events.
        gap_ms: mean event-time step between consecutive events (each step in ``[0, 2*gap]``).
        max_delay_ms: arrival delay bound; 0 gives events in event-time order.
        active_auctions: how many of the newest auctions a bid may go to (the auction keys).
        active_persons: how many of the newest persons sell and bid (the bidder keys).
    """

    bids: int = 200_000
    seed: int = 0
    gap_ms: int = 10
    max_delay_ms: int = 2_000
    active_auctions: int = 200
    active_persons: int = 1_000

    def __post_init__(self) -> None:
        for name in ("bids", "gap_ms", "active_auctions", "active_persons"):
            if getattr(self, name) < 1:
                raise ValueError(f"NexmarkConfig.{name} = {getattr(self, name)!r}: give >= 1")
        if self.max_delay_ms < 0:
            raise ValueError(f"NexmarkConfig.max_delay_ms = {self.max_delay_ms!r}: give >= 0")


@dataclass(frozen=True)
class NexmarkEvents:
    """The three streams, each in arrival order."""

    persons: list[dict[str, Any]]
    auctions: list[dict[str, Any]]
    bids: list[dict[str, Any]]

    def stream(self, kind: str) -> list[dict[str, Any]]:
        """``persons``, ``auctions`` or ``bids``."""
        if kind not in _SCHEMAS:
            raise ValueError(f"Nexmark stream {kind!r}: give one of {sorted(_SCHEMAS)}")
        return getattr(self, kind)


def generate(config: NexmarkConfig | None = None) -> NexmarkEvents:
    """The events of ``config`` (defaults: 200,000 bids, seed 0).

    Steps:
        1. walk event time forward, making a person, 3 auctions, 46 bids per 50 events;
        2. give every event an arrival key ``date_time + delay`` (delay < ``max_delay_ms``)
           and sort each stream by it (ties: generation order).
    """
    cfg = config or NexmarkConfig()
    rng = random.Random(cfg.seed)
    made: dict[str, list[tuple[int, int, dict[str, Any]]]] = {k: [] for k in _SCHEMAS}
    t, persons, auctions, seq = T0_MS, 0, 0, 0
    # Step 1
    while len(made["bids"]) < cfg.bids:
        t += rng.randint(0, 2 * cfg.gap_ms)
        slot = seq % 50
        if slot == 0:
            kind, event = "persons", _person(rng, persons, t)
            persons += 1
        elif slot <= 3:
            seller = (
                persons - 1 if rng.random() < 0.5 else _recent(rng, persons, cfg.active_persons)
            )
            kind, event = "auctions", _auction(rng, auctions, seller, t)
            auctions += 1
        else:
            hot = 10 if rng.random() < 0.5 else cfg.active_auctions
            event = {
                "auction": _recent(rng, auctions, min(hot, cfg.active_auctions)),
                "bidder": _recent(rng, persons, cfg.active_persons),
                "price": rng.randint(100, 10**7),
                "date_time": t,
            }
            kind = "bids"
        # Step 2
        delay = rng.randrange(cfg.max_delay_ms) if cfg.max_delay_ms else 0
        made[kind].append((t + delay, seq, event))
        seq += 1
    streams = {k: [e for _, _, e in sorted(v, key=lambda x: x[:2])] for k, v in made.items()}
    return NexmarkEvents(**streams)


def _recent(rng: random.Random, count: int, window: int) -> int:
    """One of the ``window`` newest ids of ``count`` ids so far."""
    return rng.randrange(max(0, count - window), count)


def _person(rng: random.Random, pid: int, t: int) -> dict[str, Any]:
    first, last = rng.choice(_NAMES), rng.choice(_NAMES)
    city, state = rng.choice(_CITIES)
    email = f"{first.lower()}.{last.lower()}{pid}@example.com"
    return {
        "id": pid,
        "name": f"{first} {last}",
        "email": email,
        "city": city,
        "state": state,
        "date_time": t,
    }


def _auction(rng: random.Random, aid: int, seller: int, t: int) -> dict[str, Any]:
    initial = rng.randint(100, 10**6)
    return {
        "id": aid,
        "seller": seller,
        "category": 10 + rng.randrange(5),
        "initial_bid": initial,
        "reserve": initial + rng.randint(0, 10**6),
        "expires": t + rng.randint(10_000, 120_000),
        "date_time": t,
    }


# -- lateness ---------------------------------------------------------------------------------


def watermarks_at_arrival(
    events: list[dict[str, Any]], bound_ms: int, epoch_sizes: list[int] | None = None
) -> list[int | None]:
    """The watermark each event meets on arrival: max ``date_time`` before it minus ``bound_ms``.

    Without ``epoch_sizes`` the watermark moves after every event (None for the first).
    With them (consecutive epochs of that many events, summing to ``len(events)``), every
    event of an epoch meets the watermark of the epoch's start: the max over the earlier
    epochs minus the bound (None in the first epoch), as the engine advances it per epoch.
    """
    sizes = epoch_sizes if epoch_sizes is not None else [1] * len(events)
    if sum(sizes) != len(events) or any(s < 0 for s in sizes):
        raise ValueError(
            f"epoch_sizes sum to {sum(sizes)} for {len(events)} events: give sizes >= 0 "
            "that sum to the number of events"
        )
    out: list[int | None] = []
    high: int | None = None
    start = 0
    for size in sizes:
        mark = None if high is None else high - bound_ms
        out.extend([mark] * size)
        for event in events[start : start + size]:
            high = event["date_time"] if high is None else max(high, event["date_time"])
        start += size
    return out


def late_events(
    events: list[dict[str, Any]], bound_ms: int, epoch_sizes: list[int] | None = None
) -> list[int]:
    """Indices of the late events: ``date_time <=`` the watermark met on arrival.

    An event exactly ``bound_ms`` older than the newest before it is late (``<=``).
    """
    marks = watermarks_at_arrival(events, bound_ms, epoch_sizes)
    pairs = enumerate(zip(events, marks, strict=True))
    return [i for i, (e, w) in pairs if w is not None and e["date_time"] <= w]


def max_out_of_orderness(events: list[dict[str, Any]]) -> int:
    """The largest ``max seen before - date_time`` over the events (0 if in order)."""
    worst, high = 0, None
    for event in events:
        if high is not None:
            worst = max(worst, high - event["date_time"])
        high = event["date_time"] if high is None else max(high, event["date_time"])
    return worst


# -- files and Kafka --------------------------------------------------------------------------

_ARROW = {"long": "int64", "string": "string"}


def write_parquet(events: NexmarkEvents, root: Path | str, files: int = 10) -> dict[str, Path]:
    """Write each stream to ``root/<kind>/part-NNNNN.parquet``: ``files`` files in arrival order.

    The files split the stream into consecutive, near-equal slices, so a ``FileSource``
    reading them in name order reads the events in arrival order, some files per epoch.
    Columns are the stream's fields (``long`` as int64). Returns ``{kind: folder}``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if files < 1:
        raise ValueError(f"write_parquet files = {files!r}: give >= 1")
    folders = {}
    for kind, schema in _SCHEMAS.items():
        rows = events.stream(kind)
        folder = Path(root) / kind
        folder.mkdir(parents=True, exist_ok=True)
        arrow = pa.schema([(name, _ARROW[t]) for name, t in schema.items()])
        for i in range(files):
            part = rows[len(rows) * i // files : len(rows) * (i + 1) // files]
            table = pa.Table.from_pylist(part, schema=arrow)
            pq.write_table(table, folder / f"part-{i:05d}.parquet")
        folders[kind] = folder
    return folders


def read_parquet(folder: Path | str) -> list[dict[str, Any]]:
    """The rows of a folder written by :func:`write_parquet`, files in name order."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


def kafka_values(
    rows: list[dict[str, Any]], key_field: str | None = None
) -> list[tuple[bytes | None, bytes, int]]:
    """``(key, value, timestamp_ms)`` per row, in arrival order, for a JSON Kafka topic.

    The value is the row as compact JSON (sorted keys), the record timestamp its
    ``date_time``, the key ``str(row[key_field])`` (None without ``key_field``).
    """
    return [
        (
            None if key_field is None else str(row[key_field]).encode(),
            json.dumps(row, sort_keys=True, separators=(",", ":")).encode(),
            row["date_time"],
        )
        for row in rows
    ]
