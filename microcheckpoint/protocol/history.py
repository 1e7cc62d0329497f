"""Checkpoint history of one pipeline, as Flink's Checkpoints tab shows it, as plain data.

Read from storage like everything else, so it survives any restart (Flink's own history
lives in the JobManager's memory and starts empty after a failover):

- ``counts``: triggered, in progress, completed, failed, restored (Flink's overview);
- ``latest``: the latest completed and failed checkpoint, savepoint and restore, each with
  its time and the Airflow run that made it (``labels``);
- ``checkpoints``: one row per checkpoint still in storage, newest first: id, status,
  acknowledged n of N, attempt (from 1), trigger time, latest ack, end-to-end duration,
  checkpointed (incremental) and full size, records, offset ranges, abort reason and detail,
  the task that failed it and the cause (``failed_task``, ``cause``: of an aborted
  checkpoint a task declined, or of a pending one whose current attempt was declined),
  the labels its trigger recorded. A checkpoint whose files cannot be read is one row with
  its ``error``; it never hides the others;
- ``summary``: min / avg / max / p99 of the completed checkpoints' duration, sizes and
  records; ``config``: the settings stored in the latest completed ``_metadata``;
- ``savepoints`` (URLs) and ``savepoint_details``; the restore marker; whether triggering
  is stopped;
- ``restores``: every restore, rescale, fallback and cancel, newest first, and
  ``restores_summary`` (``protocol.restores``, Flink's Rescales tab).

``checkpoint_detail`` gives one checkpoint with its per-subtask statistics, each subtask's
end to end (trigger to ack), the sync and async parts of its snapshot and its ``phases``,
their min / avg / max per operator (``operators``), and ``slowest``: the subtask that
finished last and why (``protocol.slowest``). Pure reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from microcheckpoint.errors import CheckpointNotFound, MicrocheckpointError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.declines import stored_decline
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack, StopRecord, read
from microcheckpoint.protocol.records.metadata import read_point_metadata
from microcheckpoint.protocol.restores import restore_rows, summarize_restores
from microcheckpoint.protocol.savepoints import list_savepoints
from microcheckpoint.protocol.slowest import end_to_end_ms, slowest_subtask, subtask_phases
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView, scan
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "ACK_TIMES",
    "checkpoint_detail",
    "checkpoint_history",
    "operator_times",
    "run_attempt",
    "summarize",
]

IN_PROGRESS = (CheckpointStatus.PENDING, CheckpointStatus.COMPLETING)
SUMMARIZED = ("duration_ms", "checkpointed_size", "full_size", "records")
# A subtask's times in a checkpoint's details (Flink's end to end, sync and async).
ACK_TIMES = ("end_to_end_ms", "sync_ms", "async_ms")


def run_attempt(stored: int) -> int:
    """The attempt as people count it, from 1. Stored attempt 1 belongs to the trigger;
    every processing run begins its own (2, 3, ...), so the first run is stored as 2."""
    return max(1, stored - 1)


def _acks(view: PipelineView, cid: CheckpointId, attempt: int) -> tuple[int, int | None]:
    """(acks stored for ``attempt``, the latest ack's time) of a checkpoint not completed."""
    acks = view.acks(cid, attempt)
    times = [a.acked_at_ms for a in acks if a.acked_at_ms is not None]
    return len(acks), max(times, default=None)


def _row(view: PipelineView, cid: CheckpointId) -> dict[str, Any]:
    record = view.records[cid]
    row: dict[str, Any] = {
        "id": cid.value,
        "status": record.status.value,
        "attempt": run_attempt(record.attempt),
        "notified": record.notified,
    }
    try:
        pending = view.pending_record(cid)
        barrier = pending.barrier
        row.update(
            trigger_time_ms=pending.trigger_time_ms,
            records=barrier.record_count,
            ranges={str(tp): [r.start, r.end] for tp, r in sorted(barrier.ranges.items())},
            labels=pending.labels_json(),
            base=None if pending.base is None else pending.base.value,
            total=len(pending.expected),
        )
        outcome = record.outcome
        if record.status is CheckpointStatus.ABORTED and outcome is not None:
            row.update(
                reason=None if outcome.reason is None else outcome.reason.value,
                detail=outcome.detail,
                end_time_ms=outcome.at_ms,
            )
            if outcome.task is not None:
                row.update(failed_task=outcome.task, cause=outcome.cause)
        if record.status is CheckpointStatus.COMPLETED:
            meta = view.metadata(cid)
            stats = {} if meta.statistics is None else meta.statistics.to_json()
            times = [a.acked_at_ms for a in meta.acks.values() if a.acked_at_ms is not None]
            row.update(
                end_time_ms=meta.completed_time_ms,
                state_bytes=meta.state_size,
                attempt=run_attempt(meta.attempt),
                statistics=stats,
                acknowledged=len(meta.acks),
                latest_ack_ms=max(times, default=None),
                checkpointed_size=stats.get("checkpointed_size"),
                full_size=stats.get("full_size", meta.state_size),
            )
        elif record.status is CheckpointStatus.ABORTED:
            # An abort deletes the checkpoint's acks with its files: not known any more.
            row["acknowledged"], row["latest_ack_ms"] = None, None
        else:
            row["acknowledged"], row["latest_ack_ms"] = _acks(view, cid, record.attempt)
            declined = stored_decline(view, cid)
            if declined is not None:  # its run failed; the next run re-runs it
                row.update(failed_task=declined.task, cause=declined.cause)
    except (MicrocheckpointError, OSError, ValueError, KeyError, TypeError) as exc:
        # A corrupt or unreadable checkpoint is one row with its error, never a failed page.
        row["error"] = f"{type(exc).__name__}: {exc}"
        return row
    if row.get("end_time_ms") is not None:
        row["duration_ms"] = int(row["end_time_ms"]) - row["trigger_time_ms"]
    return row


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by the nearest-rank method (Flink's summary uses the same)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float] | None]:
    """min / avg / max / p99 of each of ``SUMMARIZED`` over completed, readable rows."""
    done = [r for r in rows if r["status"] == "COMPLETED" and "error" not in r]
    summary: dict[str, dict[str, float] | None] = {}
    for name in SUMMARIZED:
        values = [float(r[name]) for r in done if r.get(name) is not None]
        if not values:
            summary[name] = None
            continue
        summary[name] = {
            "count": len(values),
            "min": min(values),
            "avg": sum(values) / len(values),
            "max": max(values),
            "p99": _quantile(values, 0.99),
        }
    return summary


def _savepoints(store: ObjectStore, pipeline: str) -> list[dict[str, Any]]:
    found = []
    for prefix in list_savepoints(store, pipeline):
        entry: dict[str, Any] = {"url": store.child_url(prefix.rstrip("/"))}
        try:
            meta = read_point_metadata(store, prefix)
            entry.update(
                checkpoint_id=meta.checkpoint_id.value,
                time_ms=meta.labels.get("created_ms", meta.completed_time_ms),
                labels=dict(meta.labels),
                full_size=meta.state_size,
            )
        except (MicrocheckpointError, OSError, ValueError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        found.append(entry)
    return sorted(found, key=lambda e: e.get("time_ms") or 0, reverse=True)


def _latest(rows: list[dict[str, Any]], status: str) -> dict[str, Any] | None:
    row = next((r for r in rows if r["status"] == status), None)
    if row is None:
        return None
    keep = ("id", "reason", "detail", "failed_task", "cause", "labels", "error")
    return {
        **{k: row[k] for k in keep if k in row},
        "time_ms": row.get("end_time_ms") or row.get("trigger_time_ms"),
    }


def checkpoint_history(store: ObjectStore, pipeline: str) -> dict[str, Any]:
    """The pipeline's history: counts, latest, checkpoints (newest first), summary,
    configuration, savepoints, restore marker and stop state."""
    layout = Layout(pipeline)
    view = scan(store, layout)
    rows = [
        _row(view, cid)
        for cid in sorted(view.records, reverse=True)
        if view.records[cid].status is not CheckpointStatus.DISCARDED
    ]
    restore = view.restore_marker
    stopped = read(store, layout.stopped, StopRecord)
    savepoints = _savepoints(store, pipeline)
    config: dict[str, Any] = {}
    for cid in reversed(view.completed):
        try:
            config = dict(view.metadata(cid).config)
            break
        except MicrocheckpointError:
            continue
    by_status = [r["status"] for r in rows]
    restores = restore_rows(store, layout, view)
    return {
        "pipeline": pipeline,
        "storage": store.url,
        "counts": {
            # Allocated ids, the discarded (retention) ones included: every trigger so far.
            "triggered": view.max_id.value if view.max_id else 0,
            "in_progress": sum(by_status.count(s.value) for s in IN_PROGRESS),
            "completed": by_status.count("COMPLETED"),
            "failed": by_status.count("ABORTED"),
            "restored": sum(1 for r in rows if (r.get("labels") or {}).get("restored_from")),
            "unreadable": sum(1 for r in rows if "error" in r),
            "retained": len(rows),
        },
        "latest": {
            "completed": _latest(rows, "COMPLETED"),
            "failed": _latest(rows, "ABORTED"),
            "savepoint": next((s for s in savepoints if "error" not in s), None),
            "restore": None
            if restore is None
            else {
                "source": restore.source,
                "checkpoint_id": restore.checkpoint_id,
                "time_ms": restore.at_ms,
                "labels": dict(restore.labels),
                "note": restore.note or None,
                "parallelism": restore.parallelism,
            },
        },
        "checkpoints": rows,
        "summary": summarize(rows),
        "config": config,
        "latest_completed": view.latest_completed.value if view.latest_completed else None,
        "savepoints": [s["url"] for s in savepoints],
        "savepoint_details": savepoints,
        "restored_from": None if restore is None else restore.source,
        # Set when the restore fell back to an older checkpoint (or a global restore said
        # what it skipped): the fact must be seen, not only logged.
        "restore_note": None if restore is None or not restore.note else restore.note,
        "stopped": None if stopped is None else stopped.to_json(),
        "restores": restores,
        "restores_summary": summarize_restores(restores),
    }


def checkpoint_detail(store: ObjectStore, pipeline: str, checkpoint: int) -> dict[str, Any]:
    """One checkpoint's row with its offsets, per-subtask statistics, state files and
    configuration.

    Raises:
        CheckpointNotFound: no such checkpoint in storage.
    """
    view = scan(store, Layout(pipeline))
    cid = CheckpointId(checkpoint)
    if cid not in view.records or view.records[cid].status is CheckpointStatus.DISCARDED:
        known = [c.value for c in sorted(view.records)]
        raise CheckpointNotFound(
            f"pipeline {pipeline!r} has no checkpoint {checkpoint} in {store.url} "
            f"(known: {known}); pick one of the history's ids"
        )
    row = _row(view, cid)
    if row["status"] == "COMPLETED" and "error" not in row:
        meta = view.metadata(cid)
        row["offsets"] = {str(tp): o for tp, o in sorted(meta.offsets.items())}
        row["subtasks"] = [
            {
                "task": str(task),
                "acked_at_ms": ack.acked_at_ms,
                "ack_duration_ms": ack.duration_ms,
                "files": len(ack.handles),
                **(row.get("statistics", {}).get("subtasks", {}).get(str(task), {})),
                **_ack_times(ack, row.get("trigger_time_ms")),
                "phases": subtask_phases(ack, row.get("trigger_time_ms")),
            }
            for task, ack in sorted(meta.acks.items(), key=lambda item: str(item[0]))
        ]
        row["operators"] = operator_times(row["subtasks"])
        row["slowest"] = slowest_subtask(meta.acks, row.get("trigger_time_ms"))
        row["config"] = dict(meta.config)
    return row


def _ack_times(ack: Ack, trigger_time_ms: int | None) -> dict[str, float | None]:
    """A subtask's end to end (trigger to its ack), and the sync and async parts of its
    snapshot; None where the ack predates them."""
    return {
        "end_to_end_ms": end_to_end_ms(ack, trigger_time_ms),
        "sync_ms": ack.sync_ms,
        "async_ms": ack.async_ms,
    }


def operator_times(subtasks: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per operator uid (``uid#subtask`` without its subtask): how many subtasks acked and
    min / avg / max of each of ``ACK_TIMES`` over them (None when no subtask has it: acks
    stored before the times existed)."""
    by_uid: dict[str, list[dict[str, Any]]] = {}
    for s in subtasks:
        by_uid.setdefault(str(s["task"]).rsplit("#", 1)[0], []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for uid, rows in sorted(by_uid.items()):
        out[uid] = {"subtasks": len(rows)}
        for name in ACK_TIMES:
            values = [float(r[name]) for r in rows if r.get(name) is not None]
            out[uid][name] = (
                {"min": min(values), "avg": sum(values) / len(values), "max": max(values)}
                if values
                else None
            )
    return out
