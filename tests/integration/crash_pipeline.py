"""The pipeline the crash tests run in ``spark_jobs/run_epoch.py`` subprocesses.

Every record is ``{"k": key, "seq": n}`` and every key's ``seq`` counts 1, 2, 3, ... within
one partition. The keyed operator ``seq-check`` keeps per key ``{"last", "count", "bad"}``,
where ``bad`` counts the steps whose ``next - previous != 1`` (Flink's sequence checker): after
any crashes, an exactly-once run ends with ``last == count == M`` and ``bad == 0``.

The topic comes from ``CRASH_TOPIC`` (read at import by the driver, which plans the ranges),
so each test can use a topic of its own.
"""

from __future__ import annotations

import os
from typing import Any

from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline

__all__ = ["NAME", "OPERATOR", "TOPIC", "check_sequence", "pipeline"]

NAME = "crashy"
OPERATOR = "seq-check"
TOPIC = os.environ.get("CRASH_TOPIC", "crash-events")


def check_sequence(
    key: Any, rows: list[dict[str, Any]], state: dict[str, int] | None
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Fold this epoch's rows of ``key`` (in source order) into the key's sequence state."""
    last, count, bad = (0, 0, 0) if state is None else (state["last"], state["count"], state["bad"])
    for row in rows:
        seq = int(row["seq"])
        if seq - last != 1:
            bad += 1
        last, count = seq, count + 1
    return [{"k": key, "last": last}], {"last": last, "count": count, "bad": bad}


pipeline = Pipeline(
    NAME,
    KafkaSource("src", [TOPIC], value_format="json", schema={"k": "string", "seq": "long"}),
).then(KeyedOperator(OPERATOR, key="k", fn=check_sequence, output_schema="k string, last long"))
