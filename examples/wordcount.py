"""The word count of Flink's documentation, as a checkpointed pipeline.

``pipeline`` reads the topic ``lines``; ``build(topic)`` makes the same pipeline for
another topic (tests use a fresh topic per run).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from datetime import datetime, timedelta

from pyspark.sql import functions as F

from microcheckpoint.engine import KafkaSource, Pipeline, running_sum
from microcheckpoint.sinks.files import FileSink

__all__ = [
    "HAMLET",
    "WORDS",
    "build",
    "expected",
    "generate",
    "hourly_lines",
    "lines_for",
    "pipeline",
    "produce",
]


def build(
    topic: str = "lines", name: str = "wordcount", sink_target: str | None = None
) -> Pipeline:
    """Lines of text in, a running count per word in keyed state ``word-counts``.

    With ``sink_target`` (a ``file://`` or ``s3://`` URL) every epoch's updated totals are
    also published exactly once as JSON-lines files (``FileSink`` uid ``word-totals``).
    """
    pipeline = (
        Pipeline(name, KafkaSource("lines-source", [topic], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(running_sum("word-counts", key="word"))
    )
    if sink_target:
        pipeline.then(FileSink("word-totals", sink_target))
    return pipeline


# The demo's Spark job processes and the example DAGs build this from WORDCOUNT_TOPIC and
# WORDCOUNT_SINK.
pipeline = build(
    topic=os.environ.get("WORDCOUNT_TOPIC", "lines"),
    sink_target=os.environ.get("WORDCOUNT_SINK") or None,
)

# -- data and ground truth ---------------------------------------------------------------------

HAMLET = (
    "to be or not to be that is the question whether tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune or to take arms against a sea of troubles"
)
WORDS = tuple(sorted(set(HAMLET.split())))


def lines_for(n: int, seed: int) -> list[str]:
    """``n`` lines of 1-12 words drawn from ``WORDS``; the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def generate(bootstrap: str, topic: str, lines: int, seed: int, partitions: int = 2) -> list[str]:
    """Create ``topic`` and produce ``lines`` text lines round-robin over its partitions.

    Returns:
        The lines produced, in production order (line ``i`` goes to partition ``i % partitions``).
    """
    text = lines_for(lines, seed)
    produce(bootstrap, topic, text, partitions)
    return text


def produce(
    bootstrap: str,
    topic: str,
    lines: list[str],
    partitions: int = 2,
    timestamps_ms: list[int] | None = None,
    create: bool = True,
) -> None:
    """Produce ``lines`` round-robin (line ``i`` to partition ``i % partitions``).

    Args:
        timestamps_ms: a Kafka timestamp per line (default: the producer's clock).
        create: create the topic first (with ``partitions`` partitions).
    """
    from kafka import KafkaProducer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    if create:
        with KafkaOffsets(bootstrap) as kafka:
            kafka.create_topic(topic, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, line in enumerate(lines):
            stamp = None if timestamps_ms is None else timestamps_ms[i]
            producer.send(topic, value=line.encode(), partition=i % partitions, timestamp_ms=stamp)
        producer.flush()
    finally:
        producer.close()


def hourly_lines(start: datetime, per_hour: list[int], seed: int) -> tuple[list[str], list[int]]:
    """Lines for consecutive hours from ``start`` and their timestamps (1 s apart within an hour).

    Hour ``h`` gets ``per_hour[h]`` lines; the timestamps increase, so each partition's
    records are in time order, as a time-partitioned replay needs.
    """
    lines: list[str] = []
    stamps: list[int] = []
    for hour, count in enumerate(per_hour):
        base = int((start + timedelta(hours=hour)).timestamp() * 1000)
        for i, line in enumerate(lines_for(count, seed + hour)):
            lines.append(line)
            stamps.append(base + 1000 * i)
    return lines, stamps


def expected(lines: list[str]) -> Counter[str]:
    """Ground truth: word -> count, by ``str.split`` (no Spark, no engine)."""
    return Counter(word for line in lines for word in line.split())
