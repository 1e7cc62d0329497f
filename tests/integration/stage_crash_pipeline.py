"""The two stages the stage crash tests run in ``spark_jobs/run_epoch.py`` subprocesses.

Records are ``{"k": key, "seq": n}``. Stage ``stage-a`` passes every record on to an internal
topic (a stage sink keyed by ``k``); stage ``stage-b`` reads it (a stage source) and keeps,
per key, the sorted list of every ``seq`` it saw. After any crashes, an exactly-once run ends
with each key's list equal to ``1..M``: a record lost leaves a gap, one counted twice a
repeat, whatever order the internal topic holds them in.

Topics and the broker come from ``STAGE_SOURCE_TOPIC``, ``STAGE_INTERNAL_TOPIC`` and
``STAGE_BOOTSTRAP``, read at import by the driver.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline, StageSource
from microcheckpoint.sinks.stage import StageSink

__all__ = ["STAGE_A", "STAGE_B", "collect", "forward", "stage_a", "stage_b"]

STAGE_A, STAGE_B = "stage-a", "stage-b"
SOURCE = os.environ.get("STAGE_SOURCE_TOPIC", "stage-crash-in")
INTERNAL = os.environ.get("STAGE_INTERNAL_TOPIC", "stage-crash-mid")
BOOTSTRAP = os.environ.get("STAGE_BOOTSTRAP", "127.0.0.1:9092")
SCHEMA = {"k": "string", "seq": "long"}


def forward(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict], int]:
    """Pass every record on; the state counts them."""
    return [{"k": key, "seq": int(r["seq"])} for r in rows], (state or 0) + len(rows)


def collect(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict], list[int]]:
    """Keep every seq seen, sorted (repeats kept)."""
    seen = list(state or [])
    for row in rows:
        bisect.insort(seen, int(row["seq"]))
    return [{"k": key, "n": len(seen)}], seen


stage_a = (
    Pipeline(STAGE_A, KafkaSource("src", [SOURCE], value_format="json", schema=SCHEMA))
    .then(KeyedOperator("forward", key="k", fn=forward, output_schema="k string, seq long"))
    .then(StageSink("to-b", BOOTSTRAP, INTERNAL, key="k", partitions=2))
)
stage_b = Pipeline(
    STAGE_B,
    StageSource(
        "from-a", [INTERNAL], value_format="json", schema=SCHEMA,
        upstream=STAGE_A, upstream_uid="to-b",
    ),
).then(KeyedOperator("collect", key="k", fn=collect, output_schema="k string, n long"))  # fmt: skip
