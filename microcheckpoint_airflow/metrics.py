"""Checkpoint metrics through Airflow's own metrics (StatsD, Datadog or OpenTelemetry, as
Airflow's ``[metrics]`` section configures them; nothing is sent when it is off).

Names (``<p>``: the pipeline name), as Flink's checkpoint metrics:

- ``microcheckpoint.<p>.checkpoint_completed`` (counter) and ``.checkpoint_failed``
  (counter; also ``.checkpoint_failed.<reason>``, e.g. ``EXPIRED``, ``DECLINED``);
- ``microcheckpoint.<p>.checkpoint_duration`` (timer, ms: trigger to global ack);
- ``microcheckpoint.<p>.checkpointed_size`` and ``.full_size`` (gauges, bytes: written by
  this checkpoint, and referenced by it), ``.checkpoint_records`` (gauge);
- for a stage: ``microcheckpoint.<p>.alignment_duration`` and ``.alignment_wait`` (timers,
  ms), ``.checkpoint_unaligned`` (counter);
- ``microcheckpoint.<p>.restore_events`` (counter; also ``.restore_events.<kind>``:
  ``restore``, ``rescale``, ``fallback``, ``cancel``), sent by the restore, global restore
  and cancel tasks, and ``.restore_time_to_first_checkpoint`` (timer, ms: from a restore to
  the completion of the first checkpoint after it), sent when that checkpoint completes.

Every metric also carries the tag ``pipeline`` for backends with tags.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from microcheckpoint.protocol.records import RestoreEvent
from microcheckpoint.protocol.records.statistics import CheckpointStatistics

__all__ = [
    "checkpoint_completed",
    "checkpoint_failed",
    "first_checkpoint_after_restore",
    "restore_event",
]

log = logging.getLogger(__name__)
PREFIX = "microcheckpoint"


def _stats() -> Any:
    from airflow.sdk.observability import stats

    return stats


def _name(pipeline: str, metric: str) -> str:
    return f"{PREFIX}.{pipeline}.{metric}"


def checkpoint_completed(
    pipeline: str, statistics: CheckpointStatistics | None, records: int
) -> None:
    """The metrics of one completed checkpoint (its ``_metadata`` statistics; None for a
    checkpoint written without them: only the count and the records are sent)."""
    stats, tags = _stats(), {"pipeline": pipeline}
    try:
        stats.incr(_name(pipeline, "checkpoint_completed"), tags=tags)
        stats.gauge(_name(pipeline, "checkpoint_records"), records, tags=tags)
        if statistics is None:
            return
        stats.timing(
            _name(pipeline, "checkpoint_duration"),
            timedelta(milliseconds=statistics.end_to_end_duration_ms),
            tags=tags,
        )
        stats.gauge(_name(pipeline, "checkpointed_size"), statistics.checkpointed_size, tags=tags)
        stats.gauge(_name(pipeline, "full_size"), statistics.full_size, tags=tags)
        alignment = statistics.alignment
        if alignment is None:
            return
        for part in alignment.parts:
            if part.alignment_duration_ms is None:
                continue  # at-least-once: no alignment to time
            stats.timing(
                _name(pipeline, "alignment_duration"),
                timedelta(milliseconds=part.alignment_duration_ms),
                tags=tags,
            )
            stats.timing(
                _name(pipeline, "alignment_wait"), timedelta(milliseconds=part.waited_ms), tags=tags
            )
        if alignment.unaligned:
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


def restore_event(pipeline: str, lookup: Callable[[], str | None]) -> None:
    """One restore, rescale, fallback or cancel (``protocol.restores``), counted by its
    kind (``lookup`` may read it from storage; None: no event, nothing sent). Reading or
    sending it never fails the restore."""
    try:
        kind = lookup()
        if kind is None:
            return
        stats, tags = _stats(), {"pipeline": pipeline, "kind": kind}
        stats.incr(_name(pipeline, "restore_events"), tags=tags)
        stats.incr(_name(pipeline, f"restore_events.{kind}"), tags=tags)
    except Exception as exc:  # a metrics backend must never fail a restore
        log.warning("restore metrics of %s not sent: %s", pipeline, exc)


def first_checkpoint_after_restore(
    pipeline: str, lookup: Callable[[], tuple[RestoreEvent, int] | None]
) -> None:
    """The time from a restore to the first checkpoint completed after it, when the
    checkpoint just completed is that one (``lookup``: ``restores.first_checkpoint_after``,
    which reads storage only for a checkpoint without a base). Reading or sending it never
    fails the checkpoint."""
    try:
        found = lookup()
        if found is None:
            return
        event, ms = found
        _stats().timing(
            _name(pipeline, "restore_time_to_first_checkpoint"),
            timedelta(milliseconds=ms),
            tags={"pipeline": pipeline, "kind": event.event_kind.value},
        )
    except Exception as exc:
        log.warning("restore metrics of %s not sent: %s", pipeline, exc)
