"""A pipeline whose keyed function raises ``ValueError("bad row 3")`` on every key: the
epoch task's error must name that cause (``test_epoch_failure_cause.py``).

The topic comes from ``FAILING_TOPIC``. The keyed function is built in a closure so Spark
ships it by value: a Spark Connect server's workers need not import the tests.
"""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import functions as F

from microcheckpoint.engine import KafkaSource, KeyedOperator, Pipeline

__all__ = ["MESSAGE", "NAME", "build", "pipeline"]

NAME = "failing"
MESSAGE = "bad row 3"


def _raising() -> Any:
    def fail(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list, Any]:
        raise ValueError(MESSAGE)

    return fail


def build(topic: str) -> Pipeline:
    """Lines of ``topic`` split into words, keyed by word; the keyed function raises."""
    return (
        Pipeline(NAME, KafkaSource("lines-source", [topic], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(KeyedOperator("fails", key="word", fn=_raising(), output_schema="word string"))
    )


pipeline = build(os.environ.get("FAILING_TOPIC", "lines"))
