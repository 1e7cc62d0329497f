"""Pending checkpoints: the ack bookkeeping between trigger and the global ack."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.records import Ack

__all__ = ["AckResult", "PendingCheckpoint"]


class AckResult(Enum):
    """What became of an acknowledgement."""

    SUCCESS = "success"  # recorded; counts toward the global ack
    DUPLICATE = "duplicate"  # this task already acked this attempt; ignored
    UNKNOWN = "unknown"  # the task is not expected by this checkpoint (or attempt unknown)
    DISCARDED = (
        "discarded"  # the checkpoint is no longer pending, or the ack is from an old attempt
    )


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint waiting for every expected task of its current attempt.

    ``attempt`` is the current processing attempt; acks from an older attempt are
    discarded (a zombie's late ack must not complete the new attempt's checkpoint).
    """

    checkpoint_id: CheckpointId
    trigger_time_ms: int
    expected: frozenset[TaskId]
    attempt: int = 0
    acks: dict[TaskId, Ack] = field(default_factory=dict)
    disposed: bool = False

    def acknowledge(self, ack: Ack) -> AckResult:
        if self.disposed or ack.attempt < self.attempt:
            return AckResult.DISCARDED
        if ack.task not in self.expected or ack.attempt > self.attempt:
            return AckResult.UNKNOWN
        if ack.task in self.acks:
            return AckResult.DUPLICATE
        self.acks[ack.task] = ack
        return AckResult.SUCCESS

    @property
    def missing(self) -> frozenset[TaskId]:
        return self.expected - set(self.acks)

    @property
    def fully_acknowledged(self) -> bool:
        return not self.disposed and not self.missing

    def is_expired(self, now_ms: int, timeout_ms: int) -> bool:
        return now_ms - self.trigger_time_ms > timeout_ms

    def begin_attempt(self, attempt: int) -> None:
        """Start a new processing attempt: acks of older attempts no longer count."""
        if attempt > self.attempt:
            self.attempt = attempt
            self.acks.clear()

    def replay(self, acks: Iterable[Ack]) -> None:
        for ack in sorted(acks, key=lambda a: str(a.task)):
            self.acknowledge(ack)
