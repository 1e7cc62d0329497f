"""The checkpoint coordinator: trigger, acknowledge, complete, abort, notify.

It keeps no state of its own between calls: every decision is derived from checkpoint
storage (``completed.scan``), so any Airflow task can run any step, a crashed step can be
run again, and two racing steps are settled by put-if-absent writes:

- ``_pending`` allocates a checkpoint id (ids are dense and increasing);
- ``acks/<attempt>/<task>.json`` records an ack once per task and attempt;
- ``_outcome`` decides COMPLETED or ABORTED once per checkpoint;
- ``_metadata`` is the commit point (I2). Before a checkpoint claims COMPLETED, every
  lower id has an outcome and every lower COMPLETED one has its ``_metadata``, so no
  lower id completes after a higher one.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import (
    AcksMissing,
    CheckpointNotFound,
    CommitConflict,
    TooManyFailures,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier, plan_barrier
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.metadata import CheckpointMetadata, decode_metadata, encode_metadata
from microcheckpoint.protocol.pending import Ack, AckResult, PendingCheckpoint
from microcheckpoint.protocol.retention import cleanup_checkpoint, enforce_retention
from microcheckpoint.protocol.view import (
    AbortReason,
    CheckpointStatus,
    PipelineView,
    read_json,
    scan,
)
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = ["AbortOutcome", "CheckpointCoordinator", "TriggerDecision", "Verdict"]

log = logging.getLogger(__name__)

StartupOffsets = Callable[[Iterable[TopicPartition]], Mapping[TopicPartition, int]]


class Verdict(Enum):
    TRIGGER = "TRIGGER"
    WAIT_MIN_PAUSE = "WAIT_MIN_PAUSE"
    WAIT_MAX_CONCURRENT = "WAIT_MAX_CONCURRENT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"


@dataclass(frozen=True)
class TriggerDecision:
    """Whether a checkpoint may be triggered now; ``wait_s`` is the min-pause remainder."""

    verdict: Verdict
    reason: str
    wait_s: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.TRIGGER


class AbortOutcome(Enum):
    ABORTED = "ABORTED"
    ALREADY_ABORTED = "ALREADY_ABORTED"
    ALREADY_COMPLETED = "ALREADY_COMPLETED"


def _dumps(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


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

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def view(self) -> PipelineView:
        return scan(self.store, self.layout)

    # ---- failures -------------------------------------------------------------------

    def consecutive_failures(self, view: PipelineView | None = None) -> int:
        """Expired or declined checkpoints since the last completed one (and the last reset)."""
        view = view or self.view()
        floor = view.latest_completed.value if view.latest_completed else 0
        reset = read_json(self.store, self.layout.failures_reset)
        if reset is not None:
            floor = max(floor, int(reset["after_id"]))
        return sum(
            1
            for cid in view.ids(CheckpointStatus.ABORTED)
            if cid.value > floor and view.records[cid].abort_reason.counts_as_failure  # type: ignore[union-attr]
        )

    def ensure_can_continue(self, view: PipelineView | None = None) -> None:
        """Raise ``TooManyFailures`` once consecutive failures exceed ``tolerable_failures``."""
        view = view or self.view()
        failures = self.consecutive_failures(view)
        if failures > self.config.tolerable_failures:
            raise TooManyFailures(
                f"pipeline {self.config.pipeline!r}: {failures} consecutive checkpoint failures "
                f"exceed tolerable_failures={self.config.tolerable_failures}; triggering is stopped. "
                "Fix the cause, then reset the failure count (reset_failures) to resume"
            )

    # ---- stop and resume (the coordinator deactivator) --------------------------------

    def suspend(self, reason: str) -> None:
        """Stop triggering (stop with savepoint): ``trigger`` refuses until ``resume``."""
        self.store.put(self.layout.stopped, _dumps({"reason": reason, "at_ms": self._now_ms()}))

    def suspended(self) -> dict[str, Any] | None:
        """The stop record (reason, time) while triggering is stopped, else None."""
        return read_json(self.store, self.layout.stopped)

    def resume(self) -> None:
        """Allow triggering again (idempotent)."""
        self.store.delete(self.layout.stopped)

    def reset_failures(self) -> None:
        """A person acknowledges the failures: only later aborts count from now on."""
        view = self.view()
        after = view.max_id.value if view.max_id else 0
        self.store.put(
            self.layout.failures_reset, _dumps({"after_id": after, "at_ms": self._now_ms()})
        )

    # ---- trigger --------------------------------------------------------------------

    def trigger_decision(self, view: PipelineView | None = None) -> TriggerDecision:
        """Min pause, max concurrent and the failure stop, as the sensors check them."""
        view = view or self.view()
        stop = self.suspended()
        if stop is not None:
            return TriggerDecision(
                Verdict.SUSPENDED, f"stopped: {stop.get('reason', '')}; restore to resume"
            )
        failures = self.consecutive_failures(view)
        if failures > self.config.tolerable_failures:
            return TriggerDecision(Verdict.STOPPED, f"{failures} consecutive failures")
        in_flight = len(view.pending) + len(view.ids(CheckpointStatus.COMPLETING))
        limit = self.config.effective_max_concurrent
        if in_flight >= limit:
            return TriggerDecision(
                Verdict.WAIT_MAX_CONCURRENT,
                f"{in_flight} checkpoint(s) in flight, max_concurrent={limit}",
            )
        latest = view.latest_completed
        if self.config.min_pause > 0 and latest is not None:
            since = (self._now_ms() - view.metadata(latest).completed_time_ms) / 1000
            if since < self.config.min_pause:
                return TriggerDecision(
                    Verdict.WAIT_MIN_PAUSE,
                    f"{since:.1f}s since checkpoint {latest} completed, min_pause={self.config.min_pause}s",
                    self.config.min_pause - since,
                )
        return TriggerDecision(Verdict.TRIGGER, "ok")

    def start_point(self, view: PipelineView) -> tuple[dict[TopicPartition, int], int | None]:
        """Offsets the next epoch starts from, and the checkpoint id it continues from.

        The head of the chain is the highest pending or completed checkpoint; a restore
        marker written after it wins (re-basing on a savepoint or older checkpoint).
        """
        live = view.ids(CheckpointStatus.PENDING, CheckpointStatus.COMPLETED)
        head = live[-1] if live else None
        restore = read_json(self.store, self.layout.restore)
        if restore is not None and (head is None or int(restore["after_id"]) >= head.value):
            offsets = {TopicPartition.parse(k): int(v) for k, v in restore["offsets"].items()}
            return offsets, None
        if head is None:
            return {}, None
        if view.records[head].status is CheckpointStatus.COMPLETED:
            return view.metadata(head).offsets, head.value
        return Barrier.from_json(view.pending_record(head)["barrier"]).ends, head.value

    def trigger(
        self,
        expected: Iterable[TaskId],
        end_offsets: Mapping[TopicPartition, int],
        startup_offsets: StartupOffsets | None = None,
        *,
        behind: str = "refuse",
        labels: Mapping[str, Any] | None = None,
    ) -> PendingCheckpoint:
        """Allocate checkpoint n and write its barrier.

        Steps: 1. refuse when stopped, in min pause, or at max concurrent; 2. find the
        start offsets (previous barrier ends, a restore, or the startup offsets for new
        partitions); 3. plan the barrier; 4. allocate n with put-if-absent of
        ``_pending``, which holds the barrier (one atomic write: no checkpoint exists
        without its barrier); 5. if a racing trigger took the concurrency slot first,
        abort n as TRIGGER_REFUSED. Every processing run then begins its own attempt
        (``begin_attempt``: 2, 3, ...), so a re-run never mixes with an earlier run's acks.

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
        """
        # Step 1: the same checks the sensors make (after finishing half-done completions).
        self.finish_completing()
        view = self.view()
        decision = self.trigger_decision(view)
        if decision.verdict is Verdict.STOPPED:
            self.ensure_can_continue(view)
        if not decision.allowed:
            raise TriggerRefused(f"pipeline {self.config.pipeline!r}: {decision.reason}")
        # Step 2: start offsets.
        starts, base = self.start_point(view)
        new = [tp for tp in end_offsets if tp not in starts]
        if new:
            if startup_offsets is None:
                raise TriggerRefused(f"partitions {', '.join(map(str, new))} have no start offset")
            starts.update({tp: int(o) for tp, o in startup_offsets(new).items()})
        # Step 3: the barrier.
        if behind == "empty":
            end_offsets = {tp: max(o, starts.get(tp, o)) for tp, o in end_offsets.items()}
        barrier = plan_barrier(starts, end_offsets, self.config.max_records_per_epoch)
        expected_set = frozenset(expected)
        now = self._now_ms()
        record = {
            "pipeline": self.config.pipeline,
            "barrier": barrier.to_json(),
            "trigger_time_ms": now,
            "expected": sorted(str(t) for t in expected_set),
            "base": base,
            "writer": self.token,
            "labels": dict(labels or {}),
        }
        # Step 4: allocate the next free id.
        cid = view.max_id.next() if view.max_id else CheckpointId(1)
        while True:
            record["checkpoint_id"] = cid.value
            if write_once(self.store, self.layout.pending(cid), _dumps(record)) is WriteOutcome.OK:
                break
            cid = cid.next()
        # Step 5: a racing trigger may have allocated a lower id meanwhile.
        lower = [c for c in self.view().pending if c < cid]
        if len(lower) >= self.config.effective_max_concurrent:
            self.abort(
                cid, AbortReason.TRIGGER_REFUSED, "lost a trigger race against max_concurrent"
            )
            raise TriggerRefused(
                f"checkpoint {cid}: max_concurrent reached by a concurrent trigger"
            )
        log.info(
            "triggered checkpoint %s of %s: %s records",
            cid,
            self.config.pipeline,
            barrier.record_count,
        )
        return PendingCheckpoint(cid, now, expected_set, attempt=1)

    def barrier(self, cid: CheckpointId) -> Barrier:
        """Barrier n: the offset ranges checkpoint n processes (held in its ``_pending``)."""
        data = read_json(self.store, self.layout.pending(cid))
        if data is None:
            raise CheckpointNotFound(f"checkpoint {cid} of {self.config.pipeline!r} does not exist")
        return Barrier.from_json(data["barrier"])

    def begin_attempt(self, cid: CheckpointId) -> int:
        """Start a new processing attempt of a pending checkpoint; older attempts' acks stop counting."""
        view = self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.PENDING:
            raise CheckpointNotFound(f"checkpoint {cid} is not pending")
        attempt = record.attempt + 1
        while (
            write_once(self.store, self.layout.attempt(cid, attempt), b"{}") is not WriteOutcome.OK
        ):
            attempt += 1
        return attempt

    # ---- acks -----------------------------------------------------------------------

    def load_pending(
        self, cid: CheckpointId, view: PipelineView | None = None
    ) -> PendingCheckpoint:
        view = view or self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.PENDING:
            raise CheckpointNotFound(f"checkpoint {cid} of {self.config.pipeline!r} is not pending")
        pending = PendingCheckpoint(
            cid, view.trigger_time_ms(cid), view.expected_tasks(cid), record.attempt
        )
        prefix = self.layout.acks(cid, record.attempt)
        acks = []
        for key in record.keys:
            if key.startswith(prefix):
                data = read_json(self.store, key)
                if data is not None:
                    acks.append(Ack.from_json(data))
        pending.replay(acks)
        return pending

    def acknowledge(self, cid: CheckpointId, ack: Ack) -> AckResult:
        """Record a task's ack (put-if-absent, so a repeated ack is a DUPLICATE)."""
        view = self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.PENDING:
            return AckResult.DISCARDED
        if ack.attempt < record.attempt:
            return AckResult.DISCARDED
        if ack.task not in view.expected_tasks(cid) or ack.attempt > record.attempt:
            return AckResult.UNKNOWN
        outcome = write_once(
            self.store, self.layout.ack(cid, ack.attempt, ack.task), _dumps(ack.to_json())
        )
        return AckResult.SUCCESS if outcome is WriteOutcome.OK else AckResult.DUPLICATE

    # ---- abort ----------------------------------------------------------------------

    def abort(self, cid: CheckpointId, reason: AbortReason, detail: str = "") -> AbortOutcome:
        """Decide ABORTED for ``cid`` unless an outcome was decided already."""
        body = {
            "outcome": "ABORTED",
            "reason": reason.value,
            "detail": detail,
            "at_ms": self._now_ms(),
            "writer": self.token,
        }
        if write_once(self.store, self.layout.outcome(cid), _dumps(body)) is WriteOutcome.OK:
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
        current = read_json(self.store, self.layout.outcome(cid)) or {}
        if current.get("outcome") == "COMPLETED":
            return AbortOutcome.ALREADY_COMPLETED
        return AbortOutcome.ALREADY_ABORTED

    def _abort_dependents(self, cid: CheckpointId) -> None:
        view = self.view()
        for other in view.pending:
            if other > cid and view.pending_record(other).get("base") == cid.value:
                self.abort(
                    other, AbortReason.BASE_ABORTED, f"continued from aborted checkpoint {cid}"
                )

    def abort_expired(self) -> list[CheckpointId]:
        """Abort every pending checkpoint older than the checkpoint timeout."""
        view = self.view()
        now, timeout = self._now_ms(), int(self.config.timeout * 1000)
        expired = [c for c in view.pending if now - view.trigger_time_ms(c) > timeout]
        return [
            c
            for c in expired
            if self.abort(c, AbortReason.EXPIRED, f"timeout {self.config.timeout}s")
            is AbortOutcome.ABORTED
        ]

    def abort_declined(self, cid: CheckpointId, detail: str) -> AbortOutcome:
        return self.abort(cid, AbortReason.DECLINED, detail)

    # ---- complete -------------------------------------------------------------------

    def finish_completing(self, view: PipelineView | None = None) -> None:
        """Write ``_metadata`` for checkpoints whose COMPLETED outcome was claimed by a writer that died."""
        view = view or self.view()
        for cid in view.ids(CheckpointStatus.COMPLETING):
            outcome = view.records[cid].outcome or {}
            self._write_metadata(view, cid, int(outcome["attempt"]))

    def _write_metadata(
        self, view: PipelineView, cid: CheckpointId, attempt: int
    ) -> CheckpointMetadata:
        pending = (
            self.load_pending(cid, view)
            if view.records[cid].status is CheckpointStatus.PENDING
            else None
        )
        if pending is None:  # COMPLETING: rebuild from the claimed attempt's acks
            pending = PendingCheckpoint(
                cid, view.trigger_time_ms(cid), view.expected_tasks(cid), attempt
            )
            prefix = self.layout.acks(cid, attempt)
            pending.replay(
                Ack.from_json(read_json(self.store, k) or {})
                for k in view.records[cid].keys
                if k.startswith(prefix)
            )
        if pending.missing:
            raise AcksMissing(
                f"checkpoint {cid} lacks acks from {sorted(map(str, pending.missing))}"
            )
        meta = CheckpointMetadata(
            pipeline=self.config.pipeline,
            checkpoint_id=cid,
            attempt=attempt,
            barrier=self.barrier(cid),
            acks=dict(pending.acks),
            trigger_time_ms=pending.trigger_time_ms,
            completed_time_ms=self._now_ms(),
            config=self.config.to_mapping(),
            base=view.pending_record(cid).get("base"),
            writer=self.token,
        )
        key = self.layout.metadata(cid)
        if write_once(self.store, key, encode_metadata(meta)) is WriteOutcome.CONFLICT:
            stored = self.store.get(key)
            theirs = decode_metadata(stored.data, self.store.child_url(key)) if stored else None
            if theirs is None or theirs.attempt != attempt:
                raise CommitConflict(f"{self.store.child_url(key)} was written for another attempt")
            return theirs
        return meta

    def complete(self, cid: CheckpointId) -> CheckpointMetadata:
        """The global ack: decide COMPLETED and write ``_metadata``.

        Steps: 1. check every expected task acked the current attempt; 2. claim the
        COMPLETED outcome; 3. give every lower pending checkpoint an outcome (SUBSUMED,
        unless it claimed COMPLETED first); 4. write ``_metadata`` of every claimed
        checkpoint in id order, lower ones first, then n's.

        Raises:
            AcksMissing: not every expected task has acknowledged yet.
            CommitConflict: another writer decided this checkpoint (completed or aborted it).
        """
        view = self.view()
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
        claim = {
            "outcome": "COMPLETED",
            "attempt": pending.attempt,
            "at_ms": self._now_ms(),
            "writer": self.token,
        }
        if write_once(self.store, self.layout.outcome(cid), _dumps(claim)) is not WriteOutcome.OK:
            current = read_json(self.store, self.layout.outcome(cid)) or {}
            raise CommitConflict(
                f"checkpoint {cid} was already decided by another writer: {current.get('outcome')} "
                f"{current.get('reason', '')}".strip()
            )
        # Step 3: every lower pending id gets an outcome: SUBSUMED (put-if-absent, so one
        # that claimed COMPLETED first keeps its claim) ...
        for lower in view.pending:
            if lower < cid:
                self.abort(lower, AbortReason.SUBSUMED, f"checkpoint {cid} completed")
        # Step 4: ... and every claimed one gets its ``_metadata`` in id order, lower ones
        # before n's (I2: no lower id completes after a higher one).
        self.finish_completing()
        meta = self.view().metadata(cid)
        log.info(
            "completed checkpoint %s of %s in %d ms", cid, self.config.pipeline, meta.duration_ms
        )
        return meta

    # ---- notify ---------------------------------------------------------------------

    def notify(
        self,
        cid: CheckpointId,
        commit_offsets: Callable[[Mapping[TopicPartition, int]], None] | None = None,
        commit_sinks: Callable[[CheckpointMetadata], None] | None = None,
    ) -> None:
        """notifyCheckpointComplete: group offsets, cleanup, retention. Idempotent.

        Steps: 0. commit the sinks (publish what the epoch staged); 1. commit the group
        offsets (only for the latest completed checkpoint,
        so committed offsets never move back; I1); 2. delete files of checkpoint ``cid``
        that its ``_metadata`` does not reference; 3. mark notified; 4. apply retention.
        """
        view = self.view()
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.COMPLETED:
            raise CheckpointNotFound(
                f"checkpoint {cid} of {self.config.pipeline!r} is not completed"
            )
        meta = view.metadata(cid)
        # Step 0: publish the sinks' staged output (idempotent per pipeline, uid, epoch).
        if commit_sinks is not None:
            commit_sinks(meta)
        # Step 1: group offsets.
        if commit_offsets is not None and view.latest_completed == cid:
            commit_offsets(meta.offsets)
        # Step 2: leftovers of other attempts and the acks (now inside _metadata).
        cleanup_checkpoint(self.store, self.layout, cid, keep={h.key for h in meta.handles})
        # Step 3: mark notified (before retention, which may drop ``cid`` itself).
        self.store.put(self.layout.notified(cid), _dumps({"at_ms": self._now_ms()}))
        # Step 4: retention.
        enforce_retention(self.store, self.layout, self.config.retained)
