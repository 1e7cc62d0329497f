"""The word count of Flink's documentation, as a checkpointed pipeline.

``pipeline`` reads the topic ``lines``; ``build(topic)`` makes the same pipeline for
another topic (tests use a fresh topic per run).
"""

from __future__ import annotations

import os
import random
from collections import Counter

from pyspark.sql import functions as F

from microcheckpoint.engine import KafkaSource, Pipeline, running_sum
from microcheckpoint.sinks.files import FileSink

__all__ = ["HAMLET", "WORDS", "build", "expected", "generate", "lines_for", "pipeline"]


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
    from kafka import KafkaProducer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    text = lines_for(lines, seed)
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, line in enumerate(text):
            producer.send(topic, value=line.encode(), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()
    return text


def expected(lines: list[str]) -> Counter[str]:
    """Ground truth: word -> count, by ``str.split`` (no Spark, no engine)."""
    return Counter(word for line in lines for word in line.split())
