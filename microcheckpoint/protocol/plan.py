"""The epoch plan: everything the engine needs to process one checkpoint, built in one place.

The protocol hands the engine one immutable ``EpochPlan`` (``CheckpointCoordinator.plan``),
so the data path reads top to bottom: trigger → plan → process → acks → complete → notify.
The engine never reads protocol records itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier
from microcheckpoint.protocol.records import Ack, read_point_metadata
from microcheckpoint.protocol.records.handles import StateHandle
from microcheckpoint.protocol.schemes import scheme_of
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView

__all__ = ["EpochPlan", "RestoredState", "restored_state"]


@dataclass(frozen=True)
class RestoredState:
    """The state an epoch starts from: per operator uid, the handles of its state files.

    Keys are store keys (a savepoint's relative keys are resolved). ``full_snapshot``: the
    first checkpoint after a NO_CLAIM restore writes full snapshots, so it references
    nothing of the restored point.
    """

    handles: Mapping[str, tuple[StateHandle, ...]] = field(default_factory=dict)
    full_snapshot: bool = False
    # per operator uid with acks: the key group scheme they name (``state.keygroups``)
    schemes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EpochPlan:
    """One processing attempt of checkpoint ``checkpoint_id``, immutable.

    Attributes:
        pipeline: the pipeline's name.
        checkpoint_id: the checkpoint (epoch) to process.
        attempt: this processing attempt (≥ 2: the first run begins attempt 2, see
            ``CheckpointCoordinator.begin_attempt``); acks carry it.
        barrier: per partition, the offset range ``[start, end)`` to read.
        trigger_time_ms: when the checkpoint was triggered (state TTL is measured in it).
        expected: every task that must acknowledge.
        restore: per operator uid, the state files to restore.
        full_snapshot: write full snapshots (no incremental references).
        base: the checkpoint this one continues from (None after a restore).
        mode: EXACTLY_ONCE stages sink output; AT_LEAST_ONCE publishes it at once.
        max_parallelism: the number of key groups.
        files: per file-source partition, the files to read, in order.
        key_groups: per operator uid the state continues from, its key group scheme
            (``state.keygroups``); an operator without state here starts a new one.
    """

    pipeline: str
    checkpoint_id: CheckpointId
    attempt: int
    barrier: Barrier
    trigger_time_ms: int
    expected: frozenset[TaskId]
    restore: Mapping[str, tuple[StateHandle, ...]]
    full_snapshot: bool
    base: CheckpointId | None
    mode: CheckpointingMode
    max_parallelism: int
    files: Mapping[TopicPartition, tuple[str, ...]] = field(default_factory=dict)
    key_groups: Mapping[str, str] = field(default_factory=dict)

    def subtasks(self, uid: str) -> int:
        """How many subtasks of operator ``uid`` must ack (0 for an unknown uid)."""
        return sum(1 for t in self.expected if t.uid.value == uid)

    def parallelism(self, *uids: str) -> int:
        """The parallelism of the given operators (the largest; 1 when none has subtasks)."""
        return max([self.subtasks(uid) for uid in uids], default=1) or 1


def restored_state(view: PipelineView, cid: CheckpointId) -> RestoredState:
    """The state epoch ``cid`` continues from.

    1. With a base checkpoint: its acks (from ``_metadata`` when completed, else the acks
       of its current attempt, for ``max_concurrent`` > 1).
    2. Without one: the restore marker's point (a savepoint or checkpoint), if any.

    Raises:
        CheckpointNotFound: the base checkpoint is gone.
    """
    base = view.pending_record(cid).base
    acks: list[Ack] = []
    resolve = ""
    full = False
    if base is not None:
        record = view.records.get(base)
        if record is None:
            raise CheckpointNotFound(f"checkpoint {cid} continues from {base}, which is gone")
        if record.status is CheckpointStatus.COMPLETED:
            acks = list(view.metadata(base).acks.values())
        else:
            acks = view.acks(base, record.attempt)
    else:
        marker = view.restore_marker
        if marker is not None and marker.prefix:
            meta = read_point_metadata(view.store, marker.prefix)
            acks = list(meta.acks.values())
            resolve = marker.prefix.rstrip("/") + "/" if meta.relative else ""
            full = marker.first_snapshot_full
    per_uid: dict[str, list[StateHandle]] = {}
    states: dict[str, list[Mapping[str, Any]]] = {}
    for ack in sorted(acks, key=lambda a: str(a.task)):
        per_uid.setdefault(str(ack.task.uid), []).extend(
            replace(h, key=resolve + h.key) for h in ack.handles
        )
        states.setdefault(str(ack.task.uid), []).append(ack.operator_state)
    # Only stored state keeps a scheme: an operator with none yet may start with any.
    schemes = {uid: scheme_of(found) for uid, found in states.items() if per_uid[uid]}
    return RestoredState({uid: tuple(hs) for uid, hs in per_uid.items()}, full, schemes)


def epoch_plan(
    view: PipelineView,
    cid: CheckpointId,
    attempt: int,
    *,
    incremental: bool,
    mode: CheckpointingMode,
    max_parallelism: int,
) -> EpochPlan:
    """The plan of attempt ``attempt`` of pending checkpoint ``cid``, from one view."""
    pending = view.pending_record(cid)
    state = restored_state(view, cid)
    return EpochPlan(
        pipeline=pending.pipeline,
        checkpoint_id=cid,
        attempt=attempt,
        barrier=pending.barrier,
        trigger_time_ms=pending.trigger_time_ms,
        expected=pending.expected,
        restore=state.handles,
        full_snapshot=state.full_snapshot or not incremental,
        base=pending.base,
        mode=mode,
        max_parallelism=max_parallelism,
        files=pending.files,
        key_groups=state.schemes,
    )
