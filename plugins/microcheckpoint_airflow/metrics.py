"""Checkpoint metrics through Airflow's own metrics (StatsD, Datadog or OpenTelemetry, as
Airflow's ``[metrics]`` section configures them; nothing is sent when it is off).

Names (``<p>``: the pipeline name), as Flink's checkpoint metrics:

- ``microcheckpoint.<p>.checkpoint_completed`` (counter) and ``.checkpoint_failed``
  (counter; also ``.checkpoint_failed.<reason>``, e.g. ``EXPIRED``, ``DECLINED``);
- ``microcheckpoint.<p>.checkpoint_duration`` (timer, ms: trigger to global ack);
- ``microcheckpoint.<p>.checkpointed_size`` and ``.full_size`` (gauges, bytes: written by
  this checkpoint, and referenced by it), ``.checkpoint_records`` (gauge);
- for a stage: ``microcheckpoint.<p>.alignment_duration`` and ``.alignment_wait`` (timers,
  ms), ``.checkpoint_unaligned`` (counter).

Every metric also carries the tag ``pipeline`` for backends with tags.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

__all__ = ["checkpoint_completed", "checkpoint_failed"]

log = logging.getLogger(__name__)
PREFIX = "microcheckpoint"


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def _name(pipeline: str, metric: str) -> str:
    return f"{PREFIX}.{pipeline}.{metric}"


def checkpoint_completed(pipeline: str, statistics: Mapping[str, Any], records: int) -> None:
    """The metrics of one completed checkpoint (its ``_metadata`` statistics)."""
    stats, tags = _stats(), {"pipeline": pipeline}
    try:
        stats.incr(_name(pipeline, "checkpoint_completed"), tags=tags)
        duration = statistics.get("end_to_end_duration_ms")
        if duration is not None:
            stats.timing(
                _name(pipeline, "checkpoint_duration"), timedelta(milliseconds=duration), tags=tags
            )
        for size in ("checkpointed_size", "full_size"):
            if size in statistics:
                stats.gauge(_name(pipeline, size), statistics[size], tags=tags)
        stats.gauge(_name(pipeline, "checkpoint_records"), records, tags=tags)
        alignment = statistics.get("alignment") or {}
        parts = list(alignment["inputs"].values()) if "inputs" in alignment else [alignment]
        for part in (p for p in parts if p and "alignment_duration_ms" in p):
            stats.timing(
                _name(pipeline, "alignment_duration"),
                timedelta(milliseconds=part["alignment_duration_ms"]),
                tags=tags,
            )
            stats.timing(
                _name(pipeline, "alignment_wait"),
                timedelta(milliseconds=part.get("waited_ms", 0)),
                tags=tags,
            )
        if alignment.get("unaligned"):
            stats.incr(_name(pipeline, "checkpoint_unaligned"), tags=tags)
    except Exception as exc:  # a metrics backend must never fail a checkpoint
        log.warning("checkpoint metrics of %s not sent: %s", pipeline, exc)


def checkpoint_failed(pipeline: str, reason: str) -> None:
    """One failed (aborted) checkpoint and its reason."""
    stats, tags = _stats(), {"pipeline": pipeline, "reason": reason}
    try:
        stats.incr(_name(pipeline, "checkpoint_failed"), tags=tags)
        stats.incr(_name(pipeline, f"checkpoint_failed.{reason}"), tags=tags)
    except Exception as exc:  # a metrics backend must never fail a checkpoint
        log.warning("checkpoint metrics of %s not sent: %s", pipeline, exc)
