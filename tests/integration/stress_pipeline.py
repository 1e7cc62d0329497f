"""The crash tests' sequence pipeline with an exactly-once sink, for the stress and zombie tests.

The keyed operator ``seq-check`` keeps the crash pipeline's state (``check_sequence``: per
key ``{"last", "count", "bad"}``) and also emits one row ``{k, seq}`` per record, which a
``FileSink`` publishes after the checkpoint completes. So the sink's committed output can
be compared with the records of every published epoch's barrier ranges.

It keeps the crash pipeline's name, so the crash tests' checks (``History``, the group
``microcheckpoint-crashy``) apply as they are. The topic comes from ``CRASH_TOPIC`` and the
sink's folder from ``STRESS_SINK`` (both read at import by the driver and the executors).
"""

from __future__ import annotations

import os
from typing import Any

from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.sinks.files import FileSink
from tests.integration.crash_pipeline import NAME, OPERATOR, TOPIC, check_sequence

__all__ = ["SINK", "build", "check_and_emit", "pipeline"]

SINK = "seqs"


def check_and_emit(
    key: Any, rows: list[dict[str, Any]], state: dict[str, int] | None
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """``check_sequence``'s state, and one output row per record (in source order)."""
    _, new_state = check_sequence(key, rows, state)
    return [{"k": key, "seq": int(row["seq"])} for row in rows], new_state


def build(topic: str, sink: str) -> Pipeline:
    """The pipeline over ``topic``, publishing to the folder ``sink`` (a URL)."""
    return (
        Pipeline(
            NAME,
            KafkaSource("src", [topic], value_format="json", schema={"k": "string", "seq": "long"}),
        )
        .then(
            KeyedOperator(OPERATOR, key="k", fn=check_and_emit, output_schema="k string, seq long")
        )
        .then(FileSink(SINK, sink))
    )


pipeline = build(TOPIC, os.environ.get("STRESS_SINK", "file:///tmp/stress-sink"))
