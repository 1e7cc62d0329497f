"""Cancel a pipeline, as Flink cancels a job: stop, abort what is in flight, then keep or
delete its checkpoints by the externalized-checkpoint cleanup policy. Savepoints are never
touched.

| ``externalized_cleanup`` | after a cancel |
|---|---|
| ``RETAIN_ON_CANCELLATION`` (default) | completed checkpoints stay: restore from one later |
| ``DELETE_ON_CANCELLATION`` | every checkpoint is deleted |
| ``NO_EXTERNALIZED_CHECKPOINTS`` | every checkpoint is deleted (none outlives the pipeline) |

Checkpoint ids are never reused: ``_cancelled`` keeps the highest one, so sinks (which
publish each epoch once per id) never mistake a new epoch for an old one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from microcheckpoint.config import ExternalizedCleanup
from microcheckpoint.errors import ConfigError
from microcheckpoint.ops.target import PipelineTarget
from microcheckpoint.protocol.records import AbortReason, CancelRecord, encode
from microcheckpoint.protocol.restores import newest_completed, record_cancel
from microcheckpoint.protocol.view import CheckpointStatus

__all__ = ["cancel_pipeline", "cleanup_policy"]


def cleanup_policy(target: PipelineTarget, override: str | None = None) -> ExternalizedCleanup:
    """The policy a cancel applies: ``override``, else the one stored with the pipeline's
    latest checkpoint (its configuration), else the target's configuration.

    Raises:
        ConfigError: ``override`` is not a policy.
    """
    if override not in (None, ""):
        try:
            return ExternalizedCleanup(str(override).strip().upper())
        except ValueError as exc:
            names = ", ".join(p.value for p in ExternalizedCleanup)
            raise ConfigError("externalized_cleanup", override, f"one of {names}") from exc
    view = target.coordinator().view()
    if view.latest_completed is not None:
        stored = view.metadata(view.latest_completed).config.get("externalized_cleanup")
        try:
            return ExternalizedCleanup(str(stored))
        except ValueError:
            pass
    return target.config.externalized_cleanup


def cancel_pipeline(
    target: PipelineTarget,
    *,
    cleanup: str | None = None,
    labels: Mapping[str, Any] | None = None,
    pause: Callable[[], None] | None = None,
    now: Callable[[], float] = time.time,
) -> CancelRecord:
    """Cancel the pipeline; returns what was done (also stored as ``_cancelled``).

    Steps: 1. check the policy; 2. stop triggering; 3. ``pause`` the
    scheduler (the Airflow DAG, when the edge can reach it); 4. abort every checkpoint in
    flight as CANCELLED (a running epoch's late acks are discarded and its task fails);
    5. by the policy, keep the completed checkpoints or delete every checkpoint's files;
    6. write ``_cancelled``; 7. append the cancel's event to the pipeline's restores
    history (``protocol.restores``). A restore (``restore_pipeline``) starts the pipeline
    again.

    Raises:
        ConfigError: an unknown policy.
    """
    # Step 1: check.
    policy = cleanup_policy(target, cleanup)
    coord = target.coordinator()
    who = str((labels or {}).get("run_id") or (labels or {}).get("by") or "requested")
    # Step 2 and 3: nothing new starts.
    coord.suspend(f"cancelled ({who})")
    if pause is not None:
        pause()
    # Step 4: abort what is in flight.
    view = coord.view()
    aborted = []
    for cid in view.in_flight:
        if view.records[cid].status is CheckpointStatus.PENDING:
            coord.abort(cid, AbortReason.CANCELLED, f"pipeline cancelled ({who})")
            aborted.append(cid.value)
    view = coord.view()
    highest = view.max_id.value if view.max_id else 0
    newest = newest_completed(view)  # for the event: read before step 5 deletes anything
    # Step 5: the cleanup policy.
    deleted = 0
    retained: tuple[int, ...] = tuple(c.value for c in view.completed)
    if policy is not ExternalizedCleanup.RETAIN_ON_CANCELLATION:
        retained = ()
        for cid in view.ids():
            keys = view.records[cid].keys
            # The commit point first: a half-deleted folder is never restorable.
            for first in (coord.layout.metadata(cid), coord.layout.pending(cid)):
                if first in keys:
                    coord.store.delete(first)
                    deleted += 1
            for key in keys:
                if key not in (coord.layout.metadata(cid), coord.layout.pending(cid)):
                    coord.store.delete(key)
                    deleted += 1
    # Step 6: the record.
    record = CancelRecord(
        after_id=max(highest, coord.id_floor()),
        at_ms=int(now() * 1000),
        cleanup=policy.value,
        aborted=tuple(aborted),
        retained=retained,
        deleted=deleted,
        labels=dict(labels or {}),
    )
    coord.store.put(coord.layout.cancelled, encode(record))
    # Step 7: the durable row (``_cancelled`` holds only the latest cancel).
    record_cancel(coord.store, coord.layout, newest, record)
    return record
