"""The pipelines tests/integration/test_audit.py replays with ``microcheckpoint audit``, on
the topic (``AUDIT_TOPIC``) and file-sink folder (``AUDIT_SINK``) the test puts in the
script's environment.

| attribute | what it is |
|---|---|
| ``wordcount`` | examples/wordcount.py: the built-in running sum and the file sink |
| ``counted`` | a word count by a user's function (``KeyedOperator(fn=...)``) and the file sink |
| ``stamped`` | ``counted``, except that the state of the word ``NOISY`` also keeps a fresh UUID: a function that is not deterministic, for that key only |
| ``echoed`` | ``counted``, except that the output row of ``NOISY`` has a random count (its state is right): output that is not deterministic |
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from pyspark.sql import functions as F

from examples import wordcount
from microcheckpoint.engine import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.sinks.files import FileSink

__all__ = ["NOISY", "counted", "echoed", "stamped", "wordcount_pipeline"]

NOISY = "question"  # a word of examples.wordcount.HAMLET

_TOPIC = os.environ.get("AUDIT_TOPIC", "none")
_SINK = os.environ.get("AUDIT_SINK", "file:///nonexistent/audit-sink")


def _count(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[Any], Any]:
    total = (state or {}).get("n", 0) + len(rows)
    return [{"word": key, "count": total}], {"n": total}


def _count_stamped(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[Any], Any]:
    outputs, new = _count(key, rows, state)
    if key == NOISY:
        new["seen"] = uuid.uuid4().hex  # differs on every run
    return outputs, new


def _count_echoed(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[Any], Any]:
    outputs, new = _count(key, rows, state)
    if key == NOISY:
        outputs = [{"word": key, "count": uuid.uuid4().int % 10**12}]
    return outputs, new


def _build(name: str, fn: Any) -> Pipeline:
    return (
        Pipeline(name, KafkaSource("lines-source", [_TOPIC], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(
            KeyedOperator("word-state", key="word", fn=fn, output_schema="word string, count long")
        )
        .then(FileSink("word-totals", _SINK))
    )


wordcount_pipeline = wordcount.build(_TOPIC, "wordcount", _SINK)
counted = _build("counted", _count)
stamped = _build("stamped", _count_stamped)
echoed = _build("echoed", _count_echoed)
