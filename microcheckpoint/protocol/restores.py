"""The pipeline's restores and rescales, like Flink's Rescales tab: every restore, rescale,
fallback and cancel as a durable row.

Each operation appends one ``RestoreEvent`` under ``<pipeline>/_events/restores/``,
put-if-absent under a key of its own, so two writers never overwrite each other and an
event is never rewritten: ``savepoints.restore`` (every restore: the CLI's, the restore
DAG's, a global restore's stages) calls ``record_restore``, ``ops.cancel_pipeline`` calls
``record_cancel``. What is known only later is derived when the rows are read, from the
checkpoints retention still keeps:

- ``first_checkpoint``: the first checkpoint completed after the event (ids after its
  ``after_id``, before the next event's), and ``time_to_first_checkpoint_ms``, its
  completion time minus the event's time;
- ``parallelism_after``: the subtasks per operator uid of the first checkpoint triggered
  after the event (its ``_pending``'s expected tasks).

Both are None until such a checkpoint exists, for a cancel, for an event a later one
superseded before any checkpoint, and once retention dropped that checkpoint (or one
before it). ``records_to_replay`` is stored with the event: it is known then.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from microcheckpoint.errors import CommitConflict, MicrocheckpointError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import (
    CancelRecord,
    CheckpointMetadata,
    EventKind,
    RestoreEvent,
    RestoreMarker,
    decode,
    encode,
    read,
)
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = [
    "CLI_LABEL",
    "Newest",
    "append_event",
    "event_at",
    "first_checkpoint_after",
    "newest_completed",
    "read_events",
    "record_cancel",
    "record_restore",
    "restore_kind",
    "restore_rows",
    "subtasks",
    "summarize_restores",
    "who",
]

# The ``by`` label of the command line's records (``who`` says ``cli:<user>`` for them).
CLI_LABEL = "microcheckpoint CLI"
FELL_BACK = "FELL BACK"


def who(labels: Mapping[str, Any]) -> str:
    """Who made an event: the Airflow run (``dag_id/run_id``), else ``cli:<user>`` for the
    command line, else the ``by`` label (``api`` without one), with ``:<user>`` when the
    labels name a user."""
    run, dag = labels.get("run_id"), labels.get("dag_id")
    if run:
        return f"{dag}/{run}" if dag else str(run)
    by = str(labels.get("by") or "")
    name = "cli" if by == CLI_LABEL else by or "api"
    user = labels.get("user")
    return f"{name}:{user}" if user else name


def _per_uid(tasks: Iterable[TaskId]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task in tasks:
        counts[str(task.uid)] = counts.get(str(task.uid), 0) + 1
    return dict(sorted(counts.items()))


def subtasks(meta: CheckpointMetadata) -> dict[str, int]:
    """Subtasks per operator uid of a completed checkpoint or savepoint (its acks)."""
    return _per_uid(meta.acks)


@dataclass(frozen=True)
class Newest:
    """The pipeline's newest readable completed checkpoint, as an event records it."""

    checkpoint_id: int
    source: str
    parallelism: dict[str, int]
    offsets: dict[TopicPartition, int]


def newest_completed(view: PipelineView) -> Newest | None:
    """The newest completed checkpoint whose ``_pending`` reads (None: none). Its barrier's
    ends are its offsets (I1) and its expected tasks its subtasks, so a checkpoint whose
    ``_metadata`` is corrupt (the one a fallback passes over) still counts."""
    for cid in reversed(view.completed):
        try:
            pending = view.pending_record(cid)
        except (MicrocheckpointError, OSError):
            continue
        url = view.store.child_url(view.layout.chk(cid).rstrip("/"))
        return Newest(cid.value, url, _per_uid(pending.expected), dict(pending.barrier.ends))
    return None


def restore_kind(note: str, parallelism: int | None, before: Mapping[str, int]) -> EventKind:
    """``fallback`` when the point fell back, ``rescale`` when ``parallelism`` differs from
    the pipeline's (the most subtasks of any operator: a source has one), else ``restore``."""
    if note.startswith(FELL_BACK):
        return EventKind.FALLBACK
    if parallelism is not None and before and parallelism != max(before.values()):
        return EventKind.RESCALE
    return EventKind.RESTORE


def _replay(offsets: Mapping[TopicPartition, int], newest: Newest | None) -> int | None:
    """Records between ``offsets`` and the newest checkpoint's, summed over partitions."""
    if newest is None:
        return None
    return sum(max(0, end - offsets[tp]) for tp, end in newest.offsets.items() if tp in offsets)


def append_event(store: ObjectStore, layout: Layout, event: RestoreEvent) -> RestoreEvent:
    """Store ``event`` put-if-absent under a key of its own (a new ``writer`` token).

    Raises:
        CommitConflict: the key was taken three times (not expected: the token is random).
        CommitOutcomeUnknown: the store did not say whether the write landed.
    """
    for _ in range(3):
        event = replace(event, writer=uuid.uuid4().hex[:12])
        key = layout.restore_event(event.at_ms, event.writer)
        if write_once(store, key, encode(event)) is WriteOutcome.OK:
            return event
    raise CommitConflict(f"restore event {store.child_url(layout.restore_events)}: key taken")


def record_restore(
    store: ObjectStore,
    layout: Layout,
    view: PipelineView,
    marker: RestoreMarker,
    point_parallelism: Mapping[str, int],
    after_id: int,
) -> RestoreEvent:
    """Append the event of a restore whose ``marker`` was just written.

    Args:
        store: the pipeline's store.
        layout: the pipeline's layout.
        view: the pipeline as the restore saw it (its newest completed checkpoint).
        marker: the restore marker written.
        point_parallelism: subtasks per operator uid of the restored point.
        after_id: the highest checkpoint id allocated so far (a cancel's included).
    """
    newest = newest_completed(view)
    before = newest.parallelism if newest is not None else dict(point_parallelism)
    event = RestoreEvent(
        event_kind=restore_kind(marker.note, marker.parallelism, before),
        at_ms=marker.at_ms or 0,
        after_id=after_id,
        source=marker.source,
        checkpoint_id=marker.checkpoint_id,
        point_kind=marker.point_kind,
        claim_mode=marker.claim_mode,
        parallelism_before=before,
        parallelism=marker.parallelism,
        records_to_replay=_replay(marker.offsets, newest),
        who=who(marker.labels),
        writer="",
        note=marker.note,
        labels=dict(marker.labels),
    )
    return append_event(store, layout, event)


def record_cancel(
    store: ObjectStore, layout: Layout, newest: Newest | None, record: CancelRecord
) -> RestoreEvent:
    """Append the event of a cancel whose ``_cancelled`` ``record`` was just written;
    ``newest`` is the newest completed checkpoint before the cancel deleted anything."""
    aborted = ", ".join(str(c) for c in record.aborted) or "none"
    event = RestoreEvent(
        event_kind=EventKind.CANCEL,
        at_ms=record.at_ms,
        after_id=record.after_id,
        source="" if newest is None else newest.source,
        checkpoint_id=None if newest is None else newest.checkpoint_id,
        point_kind="" if newest is None else "checkpoint",
        claim_mode=None,
        parallelism_before={} if newest is None else newest.parallelism,
        parallelism=None,
        records_to_replay=None,
        who=who(record.labels),
        writer="",
        note=f"{record.cleanup}; aborted: {aborted}; deleted {record.deleted} objects",
        labels=dict(record.labels),
    )
    return append_event(store, layout, event)


def read_events(store: ObjectStore, layout: Layout) -> list[tuple[str, RestoreEvent | str]]:
    """Every stored event, oldest first, as ``(key, event)``; one that does not decode is
    ``(key, error)``, so it never hides the others."""
    found: list[tuple[str, RestoreEvent | str]] = []
    for key in sorted(store.list(layout.restore_events)):
        try:
            event = read(store, key, RestoreEvent)
        except (MicrocheckpointError, OSError) as exc:
            found.append((key, f"{type(exc).__name__}: {exc}"))
            continue
        if event is not None:
            found.append((key, event))
    return found


def _consecutive(view: PipelineView, first: int, last: int) -> bool:
    """Whether every id in ``first..last`` is still stored (retention dropped none)."""
    return all(
        CheckpointId(c) in view.records
        and view.records[CheckpointId(c)].status is not CheckpointStatus.DISCARDED
        for c in range(first, last + 1)
    )


def _after(view: PipelineView, event: RestoreEvent, upper: int | None) -> dict[str, Any]:
    """What followed a restore: its first checkpoint, the time to it, the parallelism."""
    out: dict[str, Any] = {
        "parallelism_after": None,
        "first_checkpoint": None,
        "time_to_first_checkpoint_ms": None,
    }
    if not event.event_kind.restores:
        return out
    ids = [
        c.value
        for c, r in view.records.items()
        if c.value > event.after_id
        and (upper is None or c.value <= upper)
        and r.status is not CheckpointStatus.DISCARDED
    ]
    first = event.after_id + 1
    if first in ids:
        try:
            expected = view.pending_record(CheckpointId(first)).expected
        except (MicrocheckpointError, OSError):
            expected = frozenset()
        out["parallelism_after"] = _per_uid(expected) or None
    done = sorted(
        c for c in ids if view.records[CheckpointId(c)].status is CheckpointStatus.COMPLETED
    )
    if done and _consecutive(view, first, done[0]):
        try:
            completed = view.metadata(CheckpointId(done[0])).completed_time_ms
        except (MicrocheckpointError, OSError):
            return out
        out["first_checkpoint"] = done[0]
        out["time_to_first_checkpoint_ms"] = max(0, completed - event.at_ms)
    return out


def restore_rows(store: ObjectStore, layout: Layout, view: PipelineView) -> list[dict[str, Any]]:
    """The history's ``restores``: one row per event, newest first, with what followed it
    derived from ``view`` (see the module)."""
    events = read_events(store, layout)
    rows: list[dict[str, Any]] = []
    for at, (key, event) in enumerate(events):
        name = key.rsplit("/", 1)[-1]
        if not isinstance(event, RestoreEvent):
            rows.append({"id": name, "error": event})
            continue
        # The checkpoints after it and before the next event are its.
        later = [e.after_id for _, e in events[at + 1 :] if isinstance(e, RestoreEvent)]
        body = event.to_json()
        del body["writer"]
        body["from"] = body.pop("source")
        rows.append({"id": name, **body, **_after(view, event, min(later, default=None))})
    return rows[::-1]


def _nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize_restores(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``count``, the count per kind, and p50 / p90 / max of the time to the first
    checkpoint over the rows that have one (None when none has)."""
    readable = [r for r in rows if "error" not in r]
    times = [
        int(r["time_to_first_checkpoint_ms"])
        for r in readable
        if r.get("time_to_first_checkpoint_ms") is not None
    ]
    return {
        "count": len(readable),
        "by_kind": {k.value: sum(1 for r in readable if r["kind"] == k.value) for k in EventKind},
        "time_to_first_checkpoint_ms": None
        if not times
        else {
            "count": len(times),
            "p50": _nearest_rank(times, 0.5),
            "p90": _nearest_rank(times, 0.9),
            "max": max(times),
        },
    }


def event_at(store: ObjectStore, layout: Layout, at_ms: int | None) -> RestoreEvent | None:
    """The event written at ``at_ms`` (a restore marker's or cancel record's time; None:
    none), for the edges' metrics: one LIST of that millisecond's keys, one GET."""
    if at_ms is None:
        return None
    for key in sorted(store.list(layout.restore_event(at_ms, ""))):
        found = read(store, key, RestoreEvent)
        if found is not None:
            return found
    return None


def first_checkpoint_after(
    store: ObjectStore, layout: Layout, meta: CheckpointMetadata
) -> tuple[RestoreEvent, int] | None:
    """The restore ``meta`` is the first completed checkpoint after, and the time from the
    restore to ``meta``'s completion (ms), for the metric sent at completion.

    Only a checkpoint without a base (the first after a restore, or the first ever) lists
    the events: one LIST, and a GET of the newest event.
    """
    if meta.base is not None:
        return None
    cid = meta.checkpoint_id.value
    keys = sorted(store.list(layout.restore_events))
    for key in reversed(keys):
        obj = store.get(key)
        if obj is None:
            continue
        event = decode(RestoreEvent, obj.data, store.child_url(key))
        if event.after_id >= cid:
            continue  # an event after this checkpoint was triggered
        if not event.event_kind.restores:
            return None
        return event, max(0, meta.completed_time_ms - event.at_ms)
    return None
