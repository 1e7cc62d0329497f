"""A Nexmark-style bid stream: highest bid per auction per tumbling window, bids per bidder.

Bids are JSON ``{"auction": int, "bidder": int, "price": long, "date_time": ms}`` with the
Kafka record timestamp equal to ``date_time``. Two keyed operators in a chain:

1. ``highest-bid`` keyed by ``auction_window`` (``"<auction>@<window start ms>"``, built with
   stateless DataFrame code): state = the highest price seen in that 10 s tumbling window.
   It passes every bid on (with the running maximum), so the next operator sees all bids.
2. ``bids-per-bidder``: a running count keyed by ``bidder``.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from pyspark.sql import functions as F

from microcheckpoint.engine import KafkaSource, KeyedOperator, Pipeline, running_sum

__all__ = [
    "SCHEMA",
    "T0_MS",
    "WINDOW_MS",
    "bids_for",
    "bids_per_bidder",
    "build",
    "generate_bids",
    "highest_bids",
    "pipeline",
    "window_key",
    "with_auction_window",
]

WINDOW_MS = 10_000
T0_MS = 1_700_000_000_000
SCHEMA = {"auction": "long", "bidder": "long", "price": "long", "date_time": "long"}


def window_key(auction: int, date_time: int) -> str:
    """The key of (auction, tumbling window start): ``"<auction>@<window start ms>"``."""
    return f"{auction}@{date_time - date_time % WINDOW_MS}"


def _highest(key: Any, rows: list[dict[str, Any]], state: Any):
    """Keep the highest price of the key's window; pass each bid on with the maximum so far."""
    best = state
    out = []
    for row in rows:  # rows come in source order (partition, offset)
        best = row["price"] if best is None else max(best, row["price"])
        out.append(
            {
                "auction_window": key,
                "bidder": row["bidder"],
                "price": row["price"],
                "max_price": best,
                "topic": row["topic"],
                "partition": row["partition"],
                "offset": row["offset"],
            }
        )
    return out, best


def with_auction_window(df: Any) -> Any:
    """Stateless: add ``auction_window`` = ``"<auction>@<date_time rounded down to 10 s>"``."""
    window_start = F.col("date_time") - F.col("date_time") % F.lit(WINDOW_MS)
    return df.withColumn("auction_window", F.concat_ws("@", "auction", window_start))


def build(topic: str = "bids", name: str = "nexmark") -> Pipeline:
    """The bid pipeline on ``topic``."""
    return (
        Pipeline(name, KafkaSource("bids-source", [topic], value_format="json", schema=SCHEMA))
        .then(with_auction_window)
        .then(
            KeyedOperator(
                "highest-bid",
                key="auction_window",
                fn=_highest,
                output_schema="auction_window string, bidder long, price long, max_price long, "
                "topic string, partition int, offset bigint",
            )
        )
        .then(running_sum("bids-per-bidder", key="bidder"))
    )


pipeline = build()

# -- data and ground truth ---------------------------------------------------------------------


def bids_for(n: int, seed: int, auctions: int = 20, bidders: int = 50) -> list[dict[str, int]]:
    """``n`` bids over about ``n * 50 ms`` of event time; the same for the same seed."""
    rng = random.Random(seed)
    t = T0_MS
    bids = []
    for _ in range(n):
        t += rng.randint(0, 100)
        bids.append(
            {
                "auction": rng.randrange(auctions),
                "bidder": rng.randrange(bidders),
                "price": rng.randint(1, 10**9) * 1000,  # beyond 32 bits: a long
                "date_time": t,
            }
        )
    return bids


def generate_bids(
    bootstrap: str, topic: str, n: int, seed: int, partitions: int = 2
) -> list[dict[str, int]]:
    """Create ``topic`` and produce ``n`` bids (timestamp = ``date_time``), keyed by auction.

    Returns:
        The bids produced, in production order.
    """
    from kafka import KafkaProducer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    bids = bids_for(n, seed)
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for bid in bids:
            producer.send(
                topic,
                key=str(bid["auction"]).encode(),
                value=json.dumps(bid).encode(),
                partition=bid["auction"] % partitions,
                timestamp_ms=bid["date_time"],
            )
        producer.flush()
    finally:
        producer.close()
    return bids


def highest_bids(bids: list[dict[str, int]]) -> dict[str, int]:
    """Ground truth: ``window_key(auction, date_time)`` -> highest price."""
    out: dict[str, int] = {}
    for bid in bids:
        k = window_key(bid["auction"], bid["date_time"])
        out[k] = max(out.get(k, bid["price"]), bid["price"])
    return out


def bids_per_bidder(bids: list[dict[str, int]]) -> dict[int, int]:
    """Ground truth: bidder -> number of bids."""
    return dict(Counter(bid["bidder"] for bid in bids))
