"""One recovery path: what every cycle does before its epoch, wherever it runs.

``start_epoch`` is called by ``engine.runner.run_cycle`` (local mode, tests, the demo) and by
the Airflow trigger task alike. Its steps:

1. finish a claimed completion (a completer that died between ``_outcome`` and ``_metadata``);
2. publish and notify every completed checkpoint that was not notified, oldest first (its
   sinks publish, the group offsets move), before anything new runs;
3. re-run the oldest pending checkpoint (when the caller owns every in-flight checkpoint, as
   a local cycle does), or trigger the next one with a barrier by ``barrier_policy``:
   ``latest`` reads up to the high watermarks, ``data_interval`` up to the first offset at or
   after the interval's end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from microcheckpoint.config import BarrierPolicy
from microcheckpoint.errors import CheckpointNotFound, CommitConflict, ConfigError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import CheckpointCoordinator, CommitSinks
from microcheckpoint.protocol.declines import stored_decline
from microcheckpoint.protocol.records import AbortReason, CheckpointMetadata
from microcheckpoint.protocol.records.alignment import Alignment
from microcheckpoint.protocol.records.interval import DataInterval
from microcheckpoint.protocol.source import (
    AlignsOnMarkers,
    LimitsEnds,
    NamesFiles,
    ProbesAlignment,
    SourceOffsets,
    group_committer,
    source_partitions,
    startup_offsets,
)
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView

__all__ = [
    "EpochStart",
    "alignment_wait",
    "abort_failed_run",
    "complete_checkpoint",
    "notify_left_behind",
    "parallelism",
    "start_epoch",
]

log = logging.getLogger(__name__)

Publish = CommitSinks | None


@dataclass(frozen=True)
class EpochStart:
    """The checkpoint a cycle processes; ``rerun`` when an earlier run left it pending."""

    checkpoint_id: CheckpointId
    rerun: bool = False


def parallelism(view: PipelineView, default: int) -> int:
    """The parallelism of the next epoch: the latest restore's, else ``default``."""
    marker = view.restore_marker
    return marker.parallelism if marker is not None and marker.parallelism else default


def notify_left_behind(
    coordinator: CheckpointCoordinator, offsets: SourceOffsets, publish: Publish
) -> tuple[list[CheckpointId], PipelineView]:
    """Steps 1 and 2: finish claimed completions, then notify what a failed run left.

    Returns the checkpoints notified now, oldest first, and a view of the pipeline after
    them (one listing in all when nothing was left).
    """
    # Step 1: a claimed completion gets its ``_metadata``.
    view = coordinator.finish_completing()
    # Step 2: completed but not notified: publish before anything new runs.
    left = [cid for cid in view.completed if not view.records[cid].notified]
    for cid in left:
        log.warning(
            "notifying completed checkpoint %s of %s left by a failed run",
            cid,
            coordinator.config.pipeline,
        )
        coordinator.notify(cid, group_committer(offsets, coordinator.config), publish)
    return left, (coordinator.view() if left else view)


def start_epoch(
    coordinator: CheckpointCoordinator,
    offsets: SourceOffsets,
    *,
    topics: Iterable[str],
    expected: Callable[[int], Iterable[TaskId]],
    default_parallelism: int,
    publish: Publish,
    rerun_pending: bool,
    interval: tuple[datetime, datetime] | None = None,
    labels: Mapping[str, Any] | None = None,
    aligned_waited_s: float = 0,
    begin: bool = False,
) -> EpochStart:
    """Recover, then pick the epoch to process (see the module's steps).

    Args:
        coordinator: the pipeline's coordinator.
        offsets: the source's offsets (Kafka).
        topics: the source topics.
        expected: the tasks that must ack, for a parallelism.
        default_parallelism: used unless the latest restore asked for another.
        publish: the sinks' commit callback for notify (None in AT_LEAST_ONCE).
        rerun_pending: re-run the oldest pending checkpoint instead of triggering (only a
            caller that owns every checkpoint in flight may, e.g. a local cycle).
        interval: the run's data interval (policy ``data_interval``).
        labels: facts for the history, kept in ``_pending``.
        aligned_waited_s: how long a stage input's alignment was waited for before this
            call (``alignment_wait``, polled by a sensor); counts toward its timeouts.
        begin: the caller plans the triggered epoch next with ``coordinator``, in this
            process (``CheckpointCoordinator.trigger``'s ``begin``).

    Raises:
        ConfigError: policy ``data_interval`` without an interval.
        TriggerRefused, TooManyFailures: the coordinator refused to trigger.
        NotAligned: a stage input's channels did not all deliver the upstream's next
            barrier marker within the checkpoint timeout (nothing was triggered).
    """
    config = coordinator.config
    # Steps 1 and 2.
    _, view = notify_left_behind(coordinator, offsets, publish)
    # Step 3: re-run or trigger (deciding on that view: nothing was written since).
    if rerun_pending and view.pending:
        cid = view.pending[0]
        log.warning("re-running pending checkpoint %s of %s", cid, config.pipeline)
        return EpochStart(cid, rerun=True)
    view.prefetch()  # the markers and start offsets the trigger decides on, at once
    tps = source_partitions(offsets, topics)
    labels = dict(labels or {})
    behind = "refuse"
    data_interval: DataInterval | None = None
    alignment: Alignment | None = None
    if config.barrier_policy is BarrierPolicy.DATA_INTERVAL:
        if interval is None:
            raise ConfigError(
                "barrier_policy",
                config.barrier_policy.value,
                "a run with a data interval: use a scheduled run or a backfill, not a manual "
                "run without a logical date",
            )
        start, end = interval
        ends = offsets.offsets_for_times(tps, int(end.timestamp() * 1000))
        data_interval = DataInterval(start, end)
        _warn_if_not_contiguous(coordinator, view, start)
        behind = "empty"
    else:
        ends = offsets.end_offsets(tps)
    if isinstance(offsets, AlignsOnMarkers):  # a stage input waits for the upstream's markers
        starts = coordinator.start_point(view).offsets
        ends, alignment = offsets.align(ends, starts, config, aligned_waited_s)
    elif isinstance(offsets, LimitsEnds):  # a file source caps and orders its ranges
        ends = offsets.limit_ends(ends, coordinator.start_point(view).offsets)
    pending = coordinator.trigger(
        expected(parallelism(view, default_parallelism)),
        ends,
        lambda new: startup_offsets(offsets, config, new),
        behind=behind,
        labels=labels,
        files=offsets.files_of if isinstance(offsets, NamesFiles) else None,
        data_interval=data_interval,
        alignment=alignment,
        view=view,
        begin=begin,
    )
    return EpochStart(pending.checkpoint_id)


def alignment_wait(
    coordinator: CheckpointCoordinator,
    offsets: SourceOffsets,
    topics: Iterable[str],
    waited_s: float,
) -> str | None:
    """What the next trigger's alignment would wait for, or None when it would not wait
    (a source without stage inputs never does); one look, for a sensor to poll.

    Raises:
        NotAligned: ``waited_s`` passed the checkpoint timeout with channels still missing
            their marker.
    """
    if not isinstance(offsets, ProbesAlignment):
        return None
    tps = source_partitions(offsets, topics)
    starts = coordinator.start_point(coordinator.view()).offsets
    return offsets.probe(offsets.end_offsets(tps), starts, coordinator.config, waited_s)


def _warn_if_not_contiguous(
    coordinator: CheckpointCoordinator, view: PipelineView, start: datetime
) -> None:
    """Say so when this interval does not begin where the previous checkpoint's ended.

    The epoch still starts at the checkpointed offsets (nothing is skipped or read
    twice), so it also reads any records of earlier intervals that no run covered.
    """
    previous = coordinator.start_point(view).previous
    if previous is None:
        return
    covered = view.pending_record(previous).data_interval
    if covered is not None and covered.end != start:
        log.warning(
            "data interval starts at %s but checkpoint %s covered up to %s: this epoch "
            "reads from the checkpointed offsets, including records before its interval",
            start.isoformat(),
            previous,
            covered.end.isoformat(),
        )


def complete_checkpoint(
    coordinator: CheckpointCoordinator,
    cid: CheckpointId,
    *,
    then_notify: bool = False,
    on_acked: Callable[[], object] | None = None,
    accept_completed: bool = True,
) -> CheckpointMetadata:
    """The complete step, safe to run again (a retried task, a second process).
    ``then_notify`` and ``on_acked``: as ``CheckpointCoordinator.complete``'s.

    Steps: 1. finish a claimed completion an earlier try left; 2. a pending checkpoint past
    its timeout is aborted as EXPIRED; 3. complete it, or return the ``_metadata`` an
    earlier try wrote. With ``accept_completed=False`` (a run that processed the epoch
    itself and must learn that it lost a race), a checkpoint another run completed first
    raises ``CommitConflict`` instead.

    Raises:
        CheckpointNotFound: ``cid`` does not exist.
        CheckpointExpired: ``cid`` is past its timeout (aborted as EXPIRED, now or before).
        AcksMissing: not every task has acknowledged yet (worth retrying).
        CommitConflict: ``cid`` was aborted (or, with ``accept_completed=False``, completed
            by another run).
    """
    # Step 1: a claimed completion (the listing it returns, taken after the tasks acked,
    # serves the steps below).
    view = coordinator.finish_completing()
    record = view.records.get(cid)
    if record is None:
        raise CheckpointNotFound(
            f"checkpoint {cid} of {coordinator.config.pipeline!r} does not exist in "
            f"{coordinator.store.url}"
        )
    # Step 2: the strict timeout (the epoch task's deadline watch or the timeout sensor may
    # have expired it at its deadline already: say so, not merely that it is aborted).
    if record.status is CheckpointStatus.PENDING or record.abort_reason is AbortReason.EXPIRED:
        expired = coordinator.expire_if_late(cid, view)
        if expired is not None:
            raise expired
    # Step 3: the global ack.
    try:
        return coordinator.complete(cid, view, then_notify=then_notify, on_acked=on_acked)
    except CommitConflict:
        view = coordinator.view()
        if not accept_completed or view.records[cid].status is not CheckpointStatus.COMPLETED:
            raise
        log.info("checkpoint %s was completed already (a retry)", cid)
        return view.metadata(cid)


def abort_failed_run(
    coordinator: CheckpointCoordinator, cid: CheckpointId | None, detail: str
) -> None:
    """After a failed step: abort ``cid`` (EXPIRED past the timeout, else DECLINED).

    ``detail`` is what the edge knows (``task process_epoch of Airflow run X failed``);
    when a task of the current attempt declined the checkpoint (``protocol.declines``), the
    abort names that task and its cause instead: ``task word-counts#1: ValueError: bad row
    3``.

    Steps: 1. abort every expired checkpoint; 2. decline ``cid`` if it is still pending,
    with the task that declined it; 3. raise ``TooManyFailures`` when consecutive failures
    now exceed the tolerance.
    """
    # Step 1
    coordinator.abort_expired()
    # Step 2
    if cid is not None:
        view = coordinator.view()
        record = view.records.get(cid)
        if record is not None and record.status is CheckpointStatus.PENDING:
            declined = stored_decline(view, cid)
            if declined is not None:
                detail = declined.detail
            coordinator.abort_declined(cid, detail, declined)
    # Step 3
    coordinator.ensure_can_continue()
