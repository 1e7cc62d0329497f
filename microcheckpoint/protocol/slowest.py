"""Which subtask finished a checkpoint last, and why: its end to end split into phases.

A checkpoint completes when its last ack is in, so the subtask with the greatest end to end
(trigger to ack) is the one that held it up. Its end to end splits, from its ``Ack``, into
five phases that add up to it:

- ``waiting to start``: ``started_at_ms`` minus the trigger time: the trigger to the
  subtask's code starting in its Spark task (Spark scheduling the job, and the stages
  before this one: reading and decoding the source, the stateless steps, the shuffle that
  brings its rows);
- ``read``: ``read_ms``, receiving and decoding its own rows (a Spark partition's batches,
  grouped by key);
- ``keyed``: ``sync_ms``, its own work: restore, apply or process, serialize (a sink part:
  sort and serialize);
- ``snapshot upload``: ``async_ms``, the upload of its files to checkpoint storage;
- ``ack``: ``acked_at_ms`` minus the end of the upload: from the upload's end to the ack,
  stamped just before its one write.

``why`` is the largest phase (on a tie, the earlier one in the table). Edge cases: the ack
phase is wall clock minus three timed parts, so it is 0 or a few ms, never below 0; it does
not include the write of the ack itself, whose time no ack can carry. The start and the ack
are stamped in whole ms, so the phases add up to the end to end within 1 ms. An ack stored before
these facts existed has None for the phases it lacks; ``why`` is chosen among the known
ones, None when none is known. Pure: the history and the command line call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from microcheckpoint.ids import TaskId
from microcheckpoint.protocol.records.checkpoint import Ack

__all__ = ["PHASES", "end_to_end_ms", "slowest_subtask", "subtask_phases", "why"]

WAITING, READ, KEYED, UPLOAD, ACK = "waiting to start", "read", "keyed", "snapshot upload", "ack"
PHASES = (WAITING, READ, KEYED, UPLOAD, ACK)


def end_to_end_ms(ack: Ack, trigger_time_ms: int | None) -> int | None:
    """Trigger to the subtask's ack, in ms (None when either time is unknown)."""
    if ack.acked_at_ms is None or trigger_time_ms is None:
        return None
    return max(0, ack.acked_at_ms - trigger_time_ms)


def subtask_phases(ack: Ack, trigger_time_ms: int | None) -> dict[str, float | None]:
    """The subtask's end to end split into ``PHASES``, in ms (None: not recorded)."""
    wait: float | None = None
    if ack.started_at_ms is not None and trigger_time_ms is not None:
        wait = float(max(0, ack.started_at_ms - trigger_time_ms))
    timed = (ack.started_at_ms, ack.acked_at_ms, ack.read_ms, ack.sync_ms, ack.async_ms)
    done: float | None = None
    if all(t is not None for t in timed):
        own = (ack.read_ms or 0.0) + (ack.sync_ms or 0.0) + (ack.async_ms or 0.0)
        gap = (ack.acked_at_ms or 0) - (ack.started_at_ms or 0) - own
        done = round(max(0.0, gap), 3)
    return {WAITING: wait, READ: ack.read_ms, KEYED: ack.sync_ms, UPLOAD: ack.async_ms, ACK: done}


def why(phases: Mapping[str, float | None]) -> str | None:
    """The largest known phase of ``phases`` (the earlier of ``PHASES`` on a tie)."""
    known = [(phases[p], -i, p) for i, p in enumerate(PHASES) if phases.get(p) is not None]
    return max(known)[2] if known else None


def slowest_subtask(
    acks: Mapping[TaskId, Ack], trigger_time_ms: int | None
) -> dict[str, Any] | None:
    """The subtask that finished last (greatest end to end; on a tie the first by task
    name), its phases and ``why``; None without any ack time.

    Returns:
        ``{"task": "word-counts#1", "end_to_end_ms": 840, "phases": {...}, "why": "keyed",
        "why_ms": 610.2}``.
    """
    timed = [
        (e2e, str(task), ack)
        for task, ack in acks.items()
        if (e2e := end_to_end_ms(ack, trigger_time_ms)) is not None
    ]
    if not timed:
        return None
    e2e, task, ack = min(timed, key=lambda t: (-t[0], t[1]))
    phases = subtask_phases(ack, trigger_time_ms)
    reason = why(phases)
    return {
        "task": task,
        "end_to_end_ms": e2e,
        "phases": phases,
        "why": reason,
        "why_ms": None if reason is None else phases[reason],
    }
