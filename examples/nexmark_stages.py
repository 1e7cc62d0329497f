"""A two-stage Nexmark-style pipeline: bids joined with auctions, then bids per item and window.

Auctions are JSON ``{"auction": int, "item": str, "date_time": ms}``, bids
``{"auction": int, "price": long, "date_time": ms}``, on two topics.

1. Stage ``join`` (its own Spark job): a ``UnionSource`` of both topics and a two-input
   keyed operator by auction (``co_keyed``). A bid whose auction is known leaves as
   ``{"item_window": "<item>@<window start>", "item", "window_start", "auction", "price"}``;
   a bid that comes before its auction waits in the auction's state until it arrives. The
   rows go to an internal topic, by key group of ``item_window``, with barrier markers.
2. Stage ``hot-items`` (another Spark job): a ``StageSource`` over the internal topic and a
   running count per ``item_window``: the bids per item per 10 s window. The hot item of a
   window is the item with the most bids in it.

``truth`` computes the same counts from the generated records, independently.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from microcheckpoint.engine import (
    KafkaSource,
    Pipeline,
    StageSource,
    UnionSource,
    co_keyed,
    running_sum,
)
from microcheckpoint.sinks.stage import StageSink

__all__ = [
    "AUCTION_SCHEMA",
    "BID_SCHEMA",
    "WINDOW_MS",
    "build",
    "generate",
    "hot_items",
    "hot_items_stage",
    "join_stage",
    "produce",
    "truth",
]

WINDOW_MS = 10_000
T0_MS = 1_700_000_000_000
AUCTION_SCHEMA = {"auction": "long", "item": "string", "date_time": "long"}
BID_SCHEMA = {"auction": "long", "price": "long", "date_time": "long"}
JOINED_SCHEMA = {
    "item_window": "string",
    "item": "string",
    "window_start": "long",
    "auction": "long",
    "price": "long",
}
JOINED_DDL = "item_window string, item string, window_start long, auction long, price long"


def _joined(auction: int, item: str, bid: dict[str, Any]) -> dict[str, Any]:
    start = bid["date_time"] - bid["date_time"] % WINDOW_MS
    return {
        "item_window": f"{item}@{start}",
        "item": item,
        "window_start": start,
        "auction": auction,
        "price": bid["price"],
    }


def join_bids(auction: int, auctions: list, bids: list, state: Any) -> tuple[list, Any]:
    """Bids of a known auction leave joined with its item; earlier ones wait in the state."""
    item = state["item"] if state else None
    waiting = list(state["waiting"]) if state else []
    for row in auctions:
        item = row["item"]
    waiting += [{"price": b["price"], "date_time": b["date_time"]} for b in bids]
    if item is None:
        return [], {"item": None, "waiting": waiting}
    return [_joined(auction, item, bid) for bid in waiting], {"item": item, "waiting": []}


def build(
    bootstrap: str,
    auctions_topic: str,
    bids_topic: str,
    internal_topic: str,
    names: tuple[str, str] = ("nexmark-join", "nexmark-hot-items"),
    partitions: int = 2,
) -> tuple[Pipeline, Pipeline]:
    """The two stages: ``join`` writes the internal topic, ``hot-items`` reads it."""
    join_name, hot_name = names
    join = (
        Pipeline(
            join_name,
            UnionSource(
                "auctions-and-bids",
                [
                    KafkaSource("auctions", [auctions_topic], "json", AUCTION_SCHEMA),
                    KafkaSource("bids", [bids_topic], "json", BID_SCHEMA),
                ],
            ),
        )
        .then(co_keyed("auction-bids", "auction", join_bids, JOINED_DDL, "auctions", "bids"))
        .then(
            StageSink(
                "to-hot-items", bootstrap, internal_topic, key="item_window", partitions=partitions
            )
        )
    )
    hot = Pipeline(
        hot_name,
        StageSource(
            "from-join",
            [internal_topic],
            "json",
            JOINED_SCHEMA,
            upstream=join_name,
            upstream_uid="to-hot-items",
        ),
    ).then(running_sum("bids-per-item-window", key="item_window"))
    return join, hot


def join_stage(**options: Any) -> Pipeline:
    """Stage 1 alone (``build``'s arguments), for a DAG file's ``PipelineSpec``."""
    return build(**options)[0]


def hot_items_stage(**options: Any) -> Pipeline:
    """Stage 2 alone (``build``'s arguments), for a DAG file's ``PipelineSpec``."""
    return build(**options)[1]


def generate(seed: int, auctions: int, bids: int, first_bid: int = 0) -> tuple[list, list]:
    """``auctions`` auctions (ids from 0) and ``bids`` bids; some bids name auctions that
    come later or never (ids up to ``auctions + 2``)."""
    rng = random.Random(seed)
    items = [f"item-{i}" for i in range(5)]
    made = [
        {"auction": a, "item": rng.choice(items), "date_time": T0_MS + a * 700}
        for a in range(auctions)
    ]
    placed = [
        {
            "auction": rng.randrange(auctions + 2),
            "price": rng.randrange(1, 500),
            "date_time": T0_MS + (first_bid + i) * 90,
        }
        for i in range(bids)
    ]
    return made, placed


def produce(bootstrap: str, topic: str, records: list[dict], partitions: int = 2) -> None:
    """Produce JSON records round-robin, with the Kafka timestamp equal to ``date_time``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    try:
        for i, record in enumerate(records):
            producer.send(
                topic,
                value=json.dumps(record).encode(),
                partition=i % partitions,
                timestamp_ms=record["date_time"],
            )
        producer.flush()
    finally:
        producer.close()


def truth(auctions: list[dict], bids: list[dict]) -> Counter[str]:
    """Bids per ``item_window`` of every bid whose auction exists: the ground truth."""
    items = {a["auction"]: a["item"] for a in auctions}
    return Counter(
        _joined(b["auction"], items[b["auction"]], b)["item_window"]
        for b in bids
        if b["auction"] in items
    )


def hot_items(counts: dict[str, int]) -> dict[int, tuple[str, int]]:
    """Per window start, the item with the most bids (ties: the smaller name)."""
    best: dict[int, tuple[str, int]] = {}
    for key, count in counts.items():
        item, start = key.rsplit("@", 1)
        window = int(start)
        if window not in best or (-count, item) < (-best[window][1], best[window][0]):
            best[window] = (item, count)
    return dict(sorted(best.items()))
