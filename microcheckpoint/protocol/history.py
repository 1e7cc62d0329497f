"""Checkpoint history of one pipeline, as Flink's Checkpoints tab shows it, as plain data.

Read from storage like everything else: one row per checkpoint still in storage (id,
status, abort reason, attempt, trigger and end times, duration, records, state size,
offset ranges, the labels the trigger recorded, e.g. the Airflow run, and a completed one's
statistics from ``_metadata``, see ``protocol.statistics``), plus the
pipeline's savepoints, its restore marker and whether triggering is stopped.
"""

from __future__ import annotations

from typing import Any

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import StopRecord, read
from microcheckpoint.protocol.savepoints import list_savepoints
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView, scan
from microcheckpoint.storage.port import ObjectStore

__all__ = ["checkpoint_history", "run_attempt"]


def run_attempt(stored: int) -> int:
    """The attempt as people count it, from 1. Stored attempt 1 belongs to the trigger;
    every processing run begins its own (2, 3, ...), so the first run is stored as 2."""
    return max(1, stored - 1)


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
    except MetadataFormatError:
        return row
    barrier = pending.barrier
    row.update(
        trigger_time_ms=pending.trigger_time_ms,
        records=barrier.record_count,
        ranges={str(tp): [r.start, r.end] for tp, r in sorted(barrier.ranges.items())},
        labels=dict(pending.labels),
        base=None if pending.base is None else pending.base.value,
    )
    outcome = record.outcome
    if record.status is CheckpointStatus.ABORTED and outcome is not None:
        row.update(
            reason=None if outcome.reason is None else outcome.reason.value,
            detail=outcome.detail,
        )
        row["end_time_ms"] = outcome.at_ms
    if record.status is CheckpointStatus.COMPLETED:
        meta = view.metadata(cid)
        row.update(
            end_time_ms=meta.completed_time_ms,
            state_bytes=meta.state_size,
            attempt=run_attempt(meta.attempt),
            statistics=dict(meta.statistics),
        )
    if row.get("end_time_ms") is not None:
        row["duration_ms"] = int(row["end_time_ms"]) - row["trigger_time_ms"]
    return row


def checkpoint_history(store: ObjectStore, pipeline: str) -> dict[str, Any]:
    """The pipeline's checkpoints (newest first), savepoints, restore marker and stop state."""
    layout = Layout(pipeline)
    view = scan(store, layout)
    rows = [
        _row(view, cid)
        for cid in sorted(view.records, reverse=True)
        if view.records[cid].status is not CheckpointStatus.DISCARDED
    ]
    restore = view.restore_marker
    stopped = read(store, layout.stopped, StopRecord)
    return {
        "pipeline": pipeline,
        "storage": store.url,
        "checkpoints": rows,
        "latest_completed": view.latest_completed.value if view.latest_completed else None,
        "savepoints": [store.child_url(p.rstrip("/")) for p in list_savepoints(store, pipeline)],
        "restored_from": None if restore is None else restore.source,
        # Set when the restore fell back to an older checkpoint (or a global restore said
        # what it skipped): the fact must be seen, not only logged.
        "restore_note": None if restore is None or not restore.note else restore.note,
        "stopped": None if stopped is None else stopped.to_json(),
    }
