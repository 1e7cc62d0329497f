"""The checkpoint coordinator: trigger, plan, acknowledge, complete, abort, notify.

It keeps no state of its own between calls: every decision is derived from checkpoint
storage (``view.scan``), so any Airflow task can run any step, a crashed step can be
run again, and two racing steps are settled by put-if-absent writes:

- ``_pending`` allocates a checkpoint id (ids are dense and increasing);
- ``acks/<attempt>/<task>.json`` records an ack once per task and attempt;
- ``_outcome`` decides COMPLETED or ABORTED once per checkpoint;
- ``_metadata`` is the commit point (I2). Before a checkpoint claims COMPLETED, every
  lower id has an outcome and every lower COMPLETED one has its ``_metadata``, so no
  lower id completes after a higher one.

Whether to trigger is the decider's (``decider``), counting failures is the failure
manager's (``failures``), and what an epoch processes is the plan's (``plan``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import Any, Protocol

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import (
    AcksMissing,
    CheckpointExpired,
    CheckpointNotFound,
    CommitConflict,
    MetadataFormatError,
    StorageError,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier, plan_barrier
from microcheckpoint.protocol.decider import TriggerDecision, Verdict, decide
from microcheckpoint.protocol.failures import FailureManager
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.pending import AckResult, PendingCheckpoint
from microcheckpoint.protocol.plan import EpochPlan, epoch_plan
from microcheckpoint.protocol.records import (
    AbortReason,
    Ack,
    AttemptRecord,
    CancelRecord,
    CheckpointMetadata,
    DeclineRecord,
    NotifiedRecord,
    OutcomeRecord,
    PendingRecord,
    RestoreMarker,
    StopRecord,
    decode_metadata,
    encode,
    encode_metadata,
    read,
)
from microcheckpoint.protocol.records.alignment import Alignment
from microcheckpoint.protocol.records.interval import DataInterval
from microcheckpoint.protocol.retention import cleanup_checkpoint, enforce_retention
from microcheckpoint.protocol.statistics import checkpoint_statistics
from microcheckpoint.protocol.view import (
    CheckpointStatus,
    PipelineView,
    RecordCache,
    scan,
    sha256_key,
)
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, beside, started, write_once
from microcheckpoint.storage.probe import ensure_put_if_absent

__all__ = [
    "AbortOutcome",
    "CheckpointCoordinator",
    "CommitSinks",
    "StartPoint",
    "TriggerDecision",
    "Verdict",
    "acknowledge",
    "record_ack",
]

log = logging.getLogger(__name__)

# A trigger whose put-if-absent of the same id fails this many times, each after a new
# listing that does not show that id, stops: the store's listings miss what it stores.
_UNLISTED_CONFLICTS = 3

StartupOffsets = Callable[[Iterable[TopicPartition]], Mapping[TopicPartition, int]]
# (partition, start, end, the last file read before start) -> names, or None: not a file partition
FilesOf = Callable[[TopicPartition, int, int, str | None], list[str] | None]


class AbortOutcome(Enum):
    ABORTED = "ABORTED"
    ALREADY_ABORTED = "ALREADY_ABORTED"
    ALREADY_COMPLETED = "ALREADY_COMPLETED"


@dataclass(frozen=True)
class StartPoint:
    """Where the next epoch starts: offsets, and the checkpoint whose state it continues.

    ``base`` is None after a restore (the state comes from the restore marker's point).
    ``previous`` is the checkpoint whose end the next epoch starts at: the head of the
    chain, or the restored checkpoint when the restore re-based onto one of this
    pipeline's own (None for a savepoint or a first checkpoint).
    """

    offsets: dict[TopicPartition, int]
    base: CheckpointId | None
    previous: CheckpointId | None


class CommitSinks(Protocol):
    """The sinks' commit of completed checkpoint ``meta`` (step 0 of ``notify``).

    ``ready``, when given, returns once the checkpoint's ``_metadata`` is written (it
    raises when that failed): the sinks may read their parts before, and make nothing
    visible until it has returned.
    """

    def __call__(
        self, meta: CheckpointMetadata, ready: Callable[[], object] | None = None
    ) -> None: ...


def _failure(step: Future[Any] | None) -> BaseException | None:
    """What ``step`` raised, once it is done (None: it succeeded, or there is no step)."""
    if step is None:
        return None
    wait([step])
    return step.exception()


def acknowledge(store: ObjectStore, layout: Layout, cid: CheckpointId, ack: Ack) -> AckResult:
    """Record a task's ack after checking it against storage: DISCARDED when ``cid`` is no
    longer pending or the ack is from an older attempt, UNKNOWN when the task or attempt is
    not the checkpoint's; else ``record_ack``. What the coordinator's ``acknowledge`` does;
    the engine's tasks call ``record_ack``.
    """
    view = scan(store, layout)
    record = view.records.get(cid)
    if record is None or record.status is not CheckpointStatus.PENDING:
        return AckResult.DISCARDED
    if ack.attempt < record.attempt:
        return AckResult.DISCARDED
    if ack.task not in view.expected_tasks(cid) or ack.attempt > record.attempt:
        return AckResult.UNKNOWN
    return record_ack(store, layout, cid, ack)


def record_ack(store: ObjectStore, layout: Layout, cid: CheckpointId, ack: Ack) -> AckResult:
    """Record a task's ack: one put-if-absent, nothing read (a repeated ack is a DUPLICATE).

    Runs wherever the task runs (a Spark executor, the driver), for the task and attempt of
    the plan it was given (``plan``: the attempt began, the tasks are ``_pending``'s). It
    does not check that ``cid`` is still pending: no read could make that check atomic with
    the write, and nothing needs it. Completion counts only the acks of the current attempt
    of a pending checkpoint, and a late ack in a decided folder is a file nothing
    references, which retention deletes (``enforce_retention`` step 3). Checking cost a LIST
    of the pipeline and a GET of ``_pending`` per ack: LISTs per epoch grew with the
    subtasks.
    """
    if ack.acked_at_ms is None:
        ack = replace(ack, acked_at_ms=int(time.time() * 1000))
    outcome = write_once(store, layout.ack(cid, ack.attempt, ack.task), encode(ack))
    return AckResult.SUCCESS if outcome is WriteOutcome.OK else AckResult.DUPLICATE


class CheckpointCoordinator:
    """Coordinator steps for one pipeline over one checkpoint store.

    Args:
        store: checkpoint storage holding ``<pipeline>/…``.
        config: the pipeline's checkpoint configuration.
        clock: seconds since the epoch (injectable for tests).
    """

    def __init__(
        self,
        store: ObjectStore,
        config: CheckpointConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config
        self.layout = Layout(config.pipeline)
        self.clock = clock
        self.token = uuid.uuid4().hex  # makes this writer's bytes unique (see write_once)
        self.failures = FailureManager(store, self.layout, config)
        self._store_probed = False  # ensure_put_if_absent ran for this coordinator
        # The write-once records this coordinator read or wrote: its views share them.
        self.records = RecordCache()
        # The view ``trigger`` decided on, with the checkpoint it allocated, for ``plan``.
        self._triggered: dict[CheckpointId, PipelineView] = {}
        # The checkpoints a trigger with ``begin`` allocated: ``plan`` takes attempt 2.
        self._begun: set[CheckpointId] = set()
        # The ack keys of the attempts this coordinator planned and has not decided yet:
        # the listing after the tasks acked reads them at the same time (``view``).
        self._planned: dict[CheckpointId, list[str]] = {}
        # ``_metadata`` writes that ``complete(then_notify=True)`` sent, for ``notify``.
        self._committing: dict[
            CheckpointId, tuple[CheckpointMetadata, Future[CheckpointMetadata]]
        ] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def view(self) -> PipelineView:
        """A fresh listing of the pipeline (records already read come from ``records``);
        the acks of an attempt this coordinator planned are read while it lists."""
        acks = [key for keys in self._planned.values() for key in keys]
        return scan(self.store, self.layout, self.records, acks=acks)

    def _write_once(self, key: str, record: object, data: bytes) -> WriteOutcome:
        """``write_once`` of a write-once record; on success the views know it unread."""
        outcome = write_once(self.store, key, data)
        if outcome is WriteOutcome.OK:
            self.records.put(key, record)
        return outcome

    # ---- failures -------------------------------------------------------------------

    def consecutive_failures(self, view: PipelineView | None = None) -> int:
        """Expired or declined checkpoints since the last completed one (and the last reset)."""
        return self.failures.consecutive_failures(view or self.view())

    def ensure_can_continue(self, view: PipelineView | None = None) -> None:
        """Raise ``TooManyFailures`` once consecutive failures exceed ``tolerable_failures``."""
        self.failures.ensure_can_continue(view or self.view())

    def reset_failures(self) -> None:
        """A person acknowledges the failures: only later aborts count from now on."""
        self.failures.reset(self.view(), self.now_ms())

    # ---- stop and resume (the coordinator deactivator) --------------------------------

    def suspend(self, reason: str) -> None:
        """Stop triggering (stop with savepoint): ``trigger`` refuses until ``resume``."""
        self.store.put(self.layout.stopped, encode(StopRecord(reason, self.now_ms())))

    def suspended(self, view: PipelineView | None = None) -> StopRecord | None:
        """The stop record (reason, time) while triggering is stopped, else None (as
        ``view`` read it, when given)."""
        if view is not None:
            return view.marker(self.layout.stopped, StopRecord)
        return read(self.store, self.layout.stopped, StopRecord)

    def resume(self) -> None:
        """Allow triggering again (idempotent)."""
        self.store.delete(self.layout.stopped)

    def id_floor(self, view: PipelineView | None = None) -> int:
        """The highest id a cancel saw: ids stay unique even after it deleted checkpoints."""
        if view is not None:
            cancelled = view.marker(self.layout.cancelled, CancelRecord)
        else:
            cancelled = read(self.store, self.layout.cancelled, CancelRecord)
        return cancelled.after_id if cancelled is not None else 0

    # ---- trigger --------------------------------------------------------------------

    def trigger_decision(self, view: PipelineView | None = None) -> TriggerDecision:
        """Stop, failures, max concurrent and min pause, as the sensors check them."""
        view = view or self.view()
        return decide(
            view,
            self.config,
            stop=self.suspended(view),
            failures=self.consecutive_failures(view),
            now_ms=self.now_ms(),
        )

    def start_point(self, view: PipelineView) -> StartPoint:
        """Offsets the next epoch starts from, and the checkpoint it continues from.

        The head of the chain is the highest pending or completed checkpoint; a restore
        marker written after it wins (re-basing on a savepoint or older checkpoint).
        """
        head = view.head
        marker = view.restore_marker
        if marker is not None and marker.covers(head):
            own = marker.pipeline_checkpoint
            restored = view.records.get(own) if own is not None else None
            live = restored is not None and restored.status is not CheckpointStatus.DISCARDED
            return StartPoint(dict(marker.offsets), None, own if live else None)
        if head is None:
            return StartPoint({}, None, None)
        if view.records[head].status is CheckpointStatus.COMPLETED:
            return StartPoint(dict(view.metadata(head).offsets), head, head)
        return StartPoint(view.pending_record(head).barrier.ends, head, head)

    def trigger(
        self,
        expected: Iterable[TaskId],
        end_offsets: Mapping[TopicPartition, int],
        startup_offsets: StartupOffsets | None = None,
        *,
        behind: str = "refuse",
        labels: Mapping[str, Any] | None = None,
        files: FilesOf | None = None,
        data_interval: DataInterval | None = None,
        alignment: Alignment | None = None,
        view: PipelineView | None = None,
        begin: bool = False,
    ) -> PendingCheckpoint:
        """Allocate checkpoint n and write its barrier.

        Steps: 1. check once that the store honours put-if-absent (``storage.probe``:
        a store that does not is refused before anything of the pipeline is written);
        2. refuse when stopped, in min pause, or at max concurrent; 3. find the start
        offsets (previous barrier ends, a restore, or the startup offsets for new
        partitions); 4. plan the barrier; 5. allocate n, the listing's highest id + 1, with
        put-if-absent of ``_pending``, which holds the barrier (one atomic write: no
        checkpoint exists without its barrier). If another trigger allocated n first, list
        again and decide again from step 2. A trigger takes only the id just above the
        highest its listing showed, so every checkpoint in flight below n was in the listing
        step 2 counted, and no listing after the allocation is needed to enforce max
        concurrent. Every processing run then begins its own attempt (``begin_attempt``: 2,
        3, ...), so a re-run never mixes with an earlier run's acks.

        Args:
            expected: every operator subtask that must ack.
            end_offsets: per partition, the offset the epoch reads up to (the high
                watermark for policy ``latest``; capped by ``max_records_per_epoch``).
            startup_offsets: offsets for partitions with no checkpointed offset.
            behind: an end offset below the start offset is refused (``"refuse"``: the
                topic was truncated) or read as nothing to do (``"empty"``: policy
                ``data_interval`` when the interval was processed already).
            labels: JSON-able facts kept in ``_pending`` (e.g. the Airflow run and its
                data interval), for the checkpoint history.
            files: names the files of a file-source partition's range (and checks the
                folder's past is what the previous barrier read); kept in ``_pending``.
            data_interval: the run's data interval (policy ``data_interval``).
            alignment: a stage input's alignment, from its offsets port's ``align``.
            view: a view ``finish_completing`` returned just before (``start_epoch``'s),
                to decide on without listing again; by default the trigger lists.
            begin: this coordinator plans n next (``plan``), in this process: ``_pending``
                says so (``PendingRecord.begun``), and that is n's attempt 2 begun, with no
                marker of its own. Not for a trigger whose epoch another process runs (it
                begins an attempt of its own).
        """
        # Step 1: the store keeps its put-if-absent promise (one GET after the first time).
        if not self._store_probed:
            ensure_put_if_absent(self.store)
            self._store_probed = True
        if view is None:
            view = self.finish_completing()
        taken: list[CheckpointId] = []
        while True:
            record = self._barrier_record(
                view, expected, end_offsets, startup_offsets, behind, labels, files,
                data_interval, alignment, begin,
            )  # fmt: skip
            cid = record.checkpoint_id
            if (
                self._write_once(self.layout.pending(cid), record, encode(record))
                is WriteOutcome.OK
            ):
                break
            # Step 5: another trigger took n; what it changed decides this one again.
            log.info("checkpoint %s of %s was allocated by another trigger", cid, record.pipeline)
            taken.append(cid)
            if taken.count(cid) >= _UNLISTED_CONFLICTS:
                raise StorageError(
                    f"{self.store.child_url(self.layout.pending(cid))} exists, but "
                    f"{_UNLISTED_CONFLICTS} listings of {self.store.child_url(self.layout.root)} "
                    "did not show it; checkpoint storage must list every object it stores "
                    "(read-after-write consistent listings)"
                )
            view = self.finish_completing()
        self._triggered = {cid: view.with_pending(record)}
        if begin:
            self._begun = {cid}
        log.info(
            "triggered checkpoint %s of %s: %s records",
            cid,
            self.config.pipeline,
            record.barrier.record_count,
        )
        return PendingCheckpoint(cid, record.trigger_time_ms, record.expected, attempt=1)

    def _barrier_record(
        self,
        view: PipelineView,
        expected: Iterable[TaskId],
        end_offsets: Mapping[TopicPartition, int],
        startup_offsets: StartupOffsets | None,
        behind: str,
        labels: Mapping[str, Any] | None,
        files: FilesOf | None,
        data_interval: DataInterval | None,
        alignment: Alignment | None,
        begin: bool,
    ) -> PendingRecord:
        """Steps 2 to 4 of ``trigger`` on ``view``: the ``_pending`` of the next id."""
        # Step 2: the same checks the sensors make (after finishing half-done completions).
        view.prefetch()
        decision = self.trigger_decision(view)
        if decision.verdict is Verdict.STOPPED:
            self.ensure_can_continue(view)
        if not decision.allowed:
            raise TriggerRefused(f"pipeline {self.config.pipeline!r}: {decision.reason}")
        # Step 3: start offsets.
        start = self.start_point(view)
        starts = dict(start.offsets)
        marker = view.restore_marker
        restored_from = None
        if marker is not None and marker.covers(view.head):
            # The first checkpoint after a restore: the history counts restores by it.
            restored_from = marker.source
        new = [tp for tp in end_offsets if tp not in starts]
        if new:
            if startup_offsets is None:
                raise TriggerRefused(f"partitions {', '.join(map(str, new))} have no start offset")
            starts.update({tp: int(o) for tp, o in startup_offsets(new).items()})
        # Step 4: the barrier.
        if behind == "empty":
            end_offsets = {tp: max(o, starts.get(tp, o)) for tp, o in end_offsets.items()}
        barrier = plan_barrier(starts, end_offsets, self.config.max_records_per_epoch)
        named = self._barrier_files(view, start, barrier, files)
        return PendingRecord(
            pipeline=self.config.pipeline,
            checkpoint_id=CheckpointId(
                max(view.max_id.value if view.max_id else 0, self.id_floor(view)) + 1
            ),
            barrier=barrier,
            trigger_time_ms=self.now_ms(),
            expected=frozenset(expected),
            base=start.base,
            writer=self.token,
            labels=dict(labels or {}),
            files=named,
            data_interval=data_interval,
            alignment=alignment,
            restored_from=restored_from,
            begun=begin,
        )

    def _barrier_files(
        self, view: PipelineView, start: StartPoint, barrier: Barrier, files: FilesOf | None
    ) -> dict[TopicPartition, tuple[str, ...]]:
        """The files of each file-source partition's range, checked against the previous barrier."""
        if files is None:
            return {}
        previous: Mapping[TopicPartition, tuple[str, ...]] = {}
        if start.previous is not None and start.previous in view.records:
            record = view.records[start.previous]
            if record.status is not CheckpointStatus.DISCARDED:
                previous = view.pending_record(start.previous).files
        named = {}
        for tp, r in barrier.ranges.items():
            last = previous.get(tp, ())
            names = files(tp, r.start, r.end, last[-1] if last else None)
            if names is not None:
                named[tp] = tuple(names)
        return named

    def barrier(self, cid: CheckpointId) -> Barrier:
        """Barrier n: the offset ranges checkpoint n processes (held in its ``_pending``)."""
        key = self.layout.pending(cid)
        record = self.records.get(key, lambda: read(self.store, key, PendingRecord))
        if record is None:
            raise CheckpointNotFound(f"checkpoint {cid} of {self.config.pipeline!r} does not exist")
        return record.barrier

    def begin_attempt(self, cid: CheckpointId, view: PipelineView | None = None) -> int:
        """Start a new processing attempt of a pending checkpoint; older attempts' acks stop counting."""
        view = view or self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.PENDING:
            raise CheckpointNotFound(f"checkpoint {cid} is not pending")
        if cid in self._begun:
            self._begun.discard(cid)
            if record.attempt <= 2:
                return 2  # this coordinator's trigger began it (``PendingRecord.begun``)
        attempt = record.attempt + 1
        while True:
            marker = encode(AttemptRecord(attempt, self.token, self.now_ms()))
            if write_once(self.store, self.layout.attempt(cid, attempt), marker) is WriteOutcome.OK:
                return attempt
            attempt += 1

    def plan(self, cid: CheckpointId) -> EpochPlan:
        """Begin a new attempt of pending checkpoint ``cid`` and hand the engine its plan.

        Steps: 1. begin the attempt (acks of older attempts stop counting); 2. read the
        checkpoint once: barrier, trigger time, expected tasks, the state to restore.

        Raises:
            CheckpointNotFound: ``cid`` is not pending, or the state it continues from is gone.
        """
        # Step 1: the attempt. Its marker is all that changes, so one view serves both
        # steps: for a checkpoint this coordinator triggered, the one its trigger decided on,
        # with the ``_pending`` it wrote (the base, restore and barrier were fixed then; a
        # racing attempt only makes ``begin_attempt`` take the next number), else a listing.
        view = self._triggered.pop(cid, None) or self.view()
        attempt = self.begin_attempt(cid, view)
        # Step 2: one read of everything the epoch needs.
        plan = epoch_plan(
            view,
            cid,
            attempt,
            incremental=self.config.incremental,
            mode=self.config.mode,
            max_parallelism=self.config.max_parallelism,
        )
        self._planned[cid] = [self.layout.ack(cid, attempt, task) for task in sorted(plan.expected)]
        return plan

    # ---- acks -----------------------------------------------------------------------

    def load_pending(
        self, cid: CheckpointId, view: PipelineView | None = None
    ) -> PendingCheckpoint:
        view = view or self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.PENDING:
            raise CheckpointNotFound(f"checkpoint {cid} of {self.config.pipeline!r} is not pending")
        return self._replayed(view, cid, record.attempt)

    def _replayed(self, view: PipelineView, cid: CheckpointId, attempt: int) -> PendingCheckpoint:
        pending = PendingCheckpoint(
            cid, view.trigger_time_ms(cid), view.expected_tasks(cid), attempt
        )
        pending.replay(view.acks(cid, attempt))
        return pending

    def acknowledge(self, cid: CheckpointId, ack: Ack) -> AckResult:
        """Record a task's ack (put-if-absent, so a repeated ack is a DUPLICATE)."""
        if ack.acked_at_ms is None:
            ack = replace(ack, acked_at_ms=self.now_ms())
        return acknowledge(self.store, self.layout, cid, ack)

    # ---- abort ----------------------------------------------------------------------

    def outcome(self, cid: CheckpointId) -> OutcomeRecord | None:
        """Checkpoint ``cid``'s ``_outcome``, if one was decided."""
        key = self.layout.outcome(cid)
        return self.records.get(key, lambda: read(self.store, key, OutcomeRecord))

    def abort(
        self,
        cid: CheckpointId,
        reason: AbortReason,
        detail: str = "",
        decline: DeclineRecord | None = None,
    ) -> AbortOutcome:
        """Decide ABORTED for ``cid`` unless an outcome was decided already (``decline``:
        the task that declined it, kept in the outcome with its cause)."""
        self._planned.pop(cid, None)  # decided either way: its acks are not worth reading
        body = OutcomeRecord.aborted(reason, detail, self.now_ms(), self.token, decline)
        if self._write_once(self.layout.outcome(cid), body, encode(body)) is WriteOutcome.OK:
            log.warning(
                "checkpoint %s of %s aborted: %s %s",
                cid,
                self.config.pipeline,
                reason.value,
                detail,
            )
            if reason is not AbortReason.SUBSUMED:
                # Nothing can reference a failed checkpoint's files, and later checkpoints
                # that continued from it cannot complete either. (A subsumed checkpoint's
                # files may be referenced by the newer one: retention decides for them.)
                cleanup_checkpoint(self.store, self.layout, cid, keep=set())
                self._abort_dependents(cid)
            return AbortOutcome.ABORTED
        current = self.outcome(cid)
        if current is not None and current.completed:
            return AbortOutcome.ALREADY_COMPLETED
        return AbortOutcome.ALREADY_ABORTED

    def _abort_dependents(self, cid: CheckpointId) -> None:
        view = self.view()
        for other in view.pending:
            if other > cid and view.pending_record(other).base == cid:
                self.abort(
                    other, AbortReason.BASE_ABORTED, f"continued from aborted checkpoint {cid}"
                )

    def abort_expired(self, view: PipelineView | None = None) -> list[CheckpointId]:
        """Abort every pending checkpoint older than the checkpoint timeout (as ``view``,
        a listing of now, shows them)."""
        view = view or self.view()
        now, timeout = self.now_ms(), int(self.config.timeout * 1000)
        expired = [c for c in view.pending if now - view.trigger_time_ms(c) > timeout]
        return [
            c
            for c in expired
            if self.abort(c, AbortReason.EXPIRED, f"timeout {self.config.timeout}s")
            is AbortOutcome.ABORTED
        ]

    def abort_declined(
        self, cid: CheckpointId, detail: str, decline: DeclineRecord | None = None
    ) -> AbortOutcome:
        return self.abort(cid, AbortReason.DECLINED, detail, decline)

    def expire_if_late(
        self, cid: CheckpointId, view: PipelineView | None = None
    ) -> CheckpointExpired | None:
        """Abort pending ``cid`` as EXPIRED once its timeout has passed.

        Returns the error to report when ``cid`` is now aborted (by this call or by
        another writer), else None: within its timeout, or completed meanwhile.
        """
        view = view or self.view()
        if self.now_ms() - view.trigger_time_ms(cid) <= self.config.timeout * 1000:
            return None
        self.abort(cid, AbortReason.EXPIRED, f"timeout {self.config.timeout}s")
        if self.view().records[cid].status is not CheckpointStatus.ABORTED:
            return None
        return CheckpointExpired(
            f"checkpoint {cid} of {self.config.pipeline!r} expired: not complete within "
            f"timeout={self.config.timeout}s of its trigger (aborted as EXPIRED; the next "
            "epoch re-reads its range)"
        )

    # ---- complete -------------------------------------------------------------------

    def finish_completing(self, view: PipelineView | None = None) -> PipelineView:
        """Finish what a completer that died after claiming COMPLETED left undone.

        Steps: 1. every pending checkpoint below a claimed one gets an outcome (SUBSUMED,
        unless it claims COMPLETED first), as step 3 of ``complete`` would have done, so it
        can never complete after the higher one (I2); 2. every claimed checkpoint gets its
        ``_metadata``, in id order. Returns a view of the pipeline after it: ``view`` (or
        the one listed) when nothing was left undone, else a new listing.
        """
        view = view or self.view()
        claimed = view.ids(CheckpointStatus.COMPLETING)
        if not claimed:
            return view
        # Step 1
        for lower in view.pending:
            if lower < claimed[-1]:
                self.abort(lower, AbortReason.SUBSUMED, f"checkpoint {claimed[-1]} completed")
        # Step 2
        view = self.view()
        for cid in view.ids(CheckpointStatus.COMPLETING):
            outcome = view.records[cid].outcome
            assert outcome is not None and outcome.attempt is not None
            # On behalf of the claim: its writer is the checkpoint's one writer.
            made = self._metadata_of(view, cid, outcome.attempt, writer=outcome.writer or None)
            self._store_metadata(cid, *made)
        return self.view()

    def _metadata_of(
        self,
        view: PipelineView,
        cid: CheckpointId,
        attempt: int,
        pending: PendingCheckpoint | None = None,
        writer: str | None = None,
    ) -> tuple[CheckpointMetadata, bytes]:
        """``cid``'s ``_metadata`` from the acks of ``attempt``, and its bytes."""
        # A pending checkpoint replays its current attempt; a COMPLETING one the claimed one.
        pending = pending or self._replayed(view, cid, attempt)
        if pending.missing:
            raise AcksMissing(
                f"checkpoint {cid} lacks acks from {sorted(map(str, pending.missing))}"
            )
        record = view.pending_record(cid)
        completed_ms = self.now_ms()
        # The lineage: the bytes of the _metadata this checkpoint continued from, and the run.
        # (A base listed as COMPLETING had its _metadata written just before, in id order.)
        base = view.records.get(record.base) if record.base is not None else None
        previous = ""
        if base is not None and base.status in (
            CheckpointStatus.COMPLETED,
            CheckpointStatus.COMPLETING,
        ):
            with contextlib.suppress(MetadataFormatError):
                previous = view.metadata_sha256(base.checkpoint_id)
        run = "/".join(str(record.labels[k]) for k in ("dag_id", "run_id") if k in record.labels)
        meta = CheckpointMetadata(
            pipeline=self.config.pipeline,
            checkpoint_id=cid,
            attempt=attempt,
            barrier=record.barrier,
            acks=dict(pending.acks),
            trigger_time_ms=pending.trigger_time_ms,
            completed_time_ms=completed_ms,
            config=self.config.to_mapping(),
            base=None if record.base is None else record.base.value,
            # The claim's writer (``writer`` when finishing another coordinator's claim).
            writer=writer or self.token,
            statistics=checkpoint_statistics(
                cid,
                pending.acks,
                record.alignment,
                pending.trigger_time_ms,
                completed_ms,
                self.layout.chk(cid),
            ),
            previous_sha256=previous,
            run=run,
        )
        return meta, encode_metadata(meta)

    def _store_metadata(
        self, cid: CheckpointId, meta: CheckpointMetadata, data: bytes
    ) -> CheckpointMetadata:
        """Write ``_metadata`` (put-if-absent): the stored one, when another writer finished
        the same claim first."""
        key = self.layout.metadata(cid)
        written = self._write_once(key, meta, data)
        if written is WriteOutcome.OK:
            self.records.put(sha256_key(key), hashlib.sha256(data).hexdigest())
        if written is WriteOutcome.CONFLICT:
            stored = self.store.get(key)
            theirs = decode_metadata(stored.data, self.store.child_url(key)) if stored else None
            if stored is None or theirs is None or theirs.attempt != meta.attempt:
                raise CommitConflict(f"{self.store.child_url(key)} was written for another attempt")
            self.records.put(key, theirs)
            self.records.put(sha256_key(key), hashlib.sha256(stored.data).hexdigest())
            return theirs
        return meta

    def complete(
        self,
        cid: CheckpointId,
        view: PipelineView | None = None,
        *,
        then_notify: bool = False,
        on_acked: Callable[[], object] | None = None,
    ) -> CheckpointMetadata:
        """The global ack: decide COMPLETED and write ``_metadata``.

        Steps: 1. check every expected task acked the current attempt; 2. claim the
        COMPLETED outcome; 3. give every lower pending checkpoint an outcome (SUBSUMED,
        unless it claimed COMPLETED first); 4. write ``_metadata`` of every claimed
        checkpoint in id order, lower ones first, then n's.

        ``view``: a listing taken after the tasks acked (by default ``complete`` lists).
        ``then_notify``: the caller calls ``notify(cid)`` next, in this process. When
        nothing is in flight below ``cid``, n's ``_metadata`` is then sent as ``complete``
        returns and ``notify`` waits for it beside its own first requests (its listing,
        the sinks' reads), where it cost a round trip of its own before them; the sinks
        publish nothing visible before it is written. The claim decided the checkpoint
        already: if the write fails, ``notify`` raises, and the next recovery writes
        ``_metadata`` for the claim (``finish_completing``). ``on_acked``: called once
        every expected task has acked, just before the claim is sent, for reads that
        may go beside it (the sinks' first reads: ``SinkPublisher.prepare``).

        Raises:
            AcksMissing: not every expected task has acknowledged yet.
            CommitConflict: another writer decided this checkpoint (completed or aborted it).
        """
        view = view or self.view()
        record = view.records.get(cid)
        if record is None:
            raise CheckpointNotFound(f"checkpoint {cid} of {self.config.pipeline!r} does not exist")
        if record.status is CheckpointStatus.COMPLETED:
            raise CommitConflict(f"checkpoint {cid} is already completed")
        if record.status is not CheckpointStatus.PENDING:
            raise CommitConflict(f"checkpoint {cid} is {record.status.value}, it cannot complete")
        # Step 1: the global ack.
        pending = self.load_pending(cid, view)
        if pending.missing:
            raise AcksMissing(
                f"checkpoint {cid} is waiting for {len(pending.missing)} task(s): "
                f"{', '.join(sorted(map(str, pending.missing)))}"
            )
        # Step 2: claim the outcome (if n was aborted meanwhile, nothing else changes).
        self._planned.pop(cid, None)
        if on_acked is not None:
            on_acked()
        claim = OutcomeRecord.completed_by(pending.attempt, self.now_ms(), self.token)
        written = self._write_once(self.layout.outcome(cid), claim, encode(claim))
        if written is not WriteOutcome.OK:
            current = self.outcome(cid)
            decided = "" if current is None else current.outcome.value
            if current is not None and current.reason is not None:
                decided += f" {current.reason.value}"
            raise CommitConflict(
                f"checkpoint {cid} was already decided by another writer: {decided}".strip()
            )
        # Step 3: every lower pending id gets an outcome: SUBSUMED (put-if-absent, so one
        # that claimed COMPLETED first keeps its claim) ...
        lower = [c for c in view.in_flight if c < cid]
        for other in lower:
            if other in view.pending:
                self.abort(other, AbortReason.SUBSUMED, f"checkpoint {cid} completed")
        # Step 4: ... and every claimed one gets its ``_metadata`` in id order, lower ones
        # before n's (I2: no lower id completes after a higher one). With none in flight
        # below n when it was listed, none can be: ids only grow, so n's ``_metadata``
        # comes from the acks just read, with no second listing.
        if lower:
            self.finish_completing()
            meta = self.view().metadata(cid)
        elif then_notify:
            meta, data = self._metadata_of(view, cid, pending.attempt, pending)
            self._committing[cid] = (meta, started(partial(self._store_metadata, cid, meta, data)))
        else:
            meta = self._store_metadata(
                cid, *self._metadata_of(view, cid, pending.attempt, pending)
            )
        log.info(
            "completed checkpoint %s of %s in %d ms", cid, self.config.pipeline, meta.duration_ms
        )
        return meta

    def committed(self, cid: CheckpointId) -> CheckpointMetadata | None:
        """Wait for the ``_metadata`` of ``cid`` that ``complete(then_notify=True)`` is
        writing, if it is (None when it is not): the stored one (raises what the write
        raised)."""
        committing = self._committing.get(cid)
        return None if committing is None else committing[1].result()

    # ---- notify ---------------------------------------------------------------------

    def notify(
        self,
        cid: CheckpointId,
        commit_offsets: Callable[[Mapping[TopicPartition, int]], None] | None = None,
        commit_sinks: CommitSinks | None = None,
    ) -> None:
        """notifyCheckpointComplete: sinks, group offsets, cleanup, retention. Idempotent.

        Steps: 0. commit the sinks (publish what the epoch staged); 1. commit the group
        offsets (only for the latest completed checkpoint, so committed offsets never
        move back; I1); 2. mark notified; 3. apply retention, which also deletes the files
        of checkpoint ``cid`` that nothing references (its acks, now inside ``_metadata``,
        and other attempts' files: ``enforce_retention`` step 3).

        One listing serves steps 1 and 3. It is sent with the read of ``_restore`` that
        retention needs and, when this coordinator wrote or read ``cid``'s ``_metadata``
        (the commit point: ``cid`` is completed), while the sinks publish. When it is
        writing it (``complete(then_notify=True)``), the write goes at once with them too,
        and the sinks make nothing visible before it is done; the listing, with that
        ``_metadata``, shows ``cid`` completed. When that
        listing shows ``cid`` as the latest completed checkpoint, retention keeps ``cid``
        and every file its ``_metadata`` names, so step 3 runs while the sinks publish
        (as Flink drops the checkpoints a completed one subsumes before it notifies);
        otherwise (a newer one completed meanwhile: retention may drop ``cid`` itself) it
        runs after step 2. Either way, a failure of step 3 is raised after step 2.
        """
        listing = started(partial(scan, self.store, self.layout, self.records))
        restore = started(partial(read, self.store, self.layout.restore, RestoreMarker))
        committing = self._committing.pop(cid, None)
        known = self.records.get(self.layout.metadata(cid), lambda: None)
        # Step 0, at once with the listing when ``cid`` is known to be completed; when its
        # ``_metadata`` is still being written (``complete(then_notify=True)``), the sinks
        # read their parts meanwhile and get them once it is written.
        publish: Future[None] | None = None
        retention: Future[list[CheckpointId]] | None = None
        if commit_sinks is not None and committing is not None:
            written = committing[1]
            publish = beside(partial(commit_sinks, committing[0], ready=written.result))
        elif commit_sinks is not None and isinstance(known, CheckpointMetadata):
            publish = beside(partial(commit_sinks, known))
        try:
            wait([listing])
            wait([restore])
            view = listing.result()
            view.remember_marker(self.layout.restore, restore.result())
            if committing is not None:
                # The claim decided ``cid``; its ``_metadata`` makes it completed, as a
                # listing taken after it would show.
                view.completed_now(cid, committing[1].result())
            record = view.records.get(cid)
            if record is None or record.status is not CheckpointStatus.COMPLETED:
                # Dropped meanwhile by another run's retention (its newer checkpoints
                # completed): a publish that failed on its deleted files failed for that.
                raise CheckpointNotFound(
                    f"checkpoint {cid} of {self.config.pipeline!r} is not completed"
                ) from _failure(publish)
            meta = view.metadata(cid)
            if commit_sinks is not None and publish is None:
                publish = beside(partial(commit_sinks, meta))
            # Step 3 while steps 0 to 2 go on, when retention keeps ``cid`` (see above).
            latest = view.latest_completed == cid
            retain = partial(
                enforce_retention, self.store, self.layout, self.config.retained, self.records, view
            )
            if latest:
                retention = beside(retain)
            failed = _failure(publish)
            if failed is not None:
                raise failed
            # Step 1: group offsets.
            if commit_offsets is not None and latest:
                commit_offsets(meta.offsets)
            # Step 2: mark notified (before a late retention, which may drop ``cid``).
            notified = self.layout.notified(cid)
            self.store.put(notified, encode(NotifiedRecord(self.now_ms())))
            if notified not in record.keys:
                record.keys.append(notified)  # the listing shows it: retention may drop it
            record.notified = True
        except BaseException as exc:
            # Nothing of this notify goes on after it returns.
            for step in (publish, retention):
                problem = _failure(step)
                if problem is not None and problem is not exc:
                    log.warning("notify of checkpoint %s: %s", cid, problem)
            raise
        if retention is not None:
            retention.result()
        else:
            # Step 3, late: on the listing taken after ``cid`` completed
            # (``enforce_retention`` says why that is safe).
            retain()
