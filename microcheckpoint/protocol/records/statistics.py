"""A completed checkpoint's statistics as stored in ``_metadata`` (``"statistics"``).

Computed by ``protocol.statistics.checkpoint_statistics`` when ``_metadata`` is written; the
names are Flink's Checkpoints tab's. A savepoint, and a checkpoint written before statistics
existed, stores ``{}``: read as None. Fields missing from older records read as 0 (sizes,
durations) or None (a stage's fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.protocol.records.alignment import Alignment, alignment_from_json

__all__ = ["CheckpointStatistics", "SubtaskStatistics"]


@dataclass(frozen=True)
class SubtaskStatistics:
    """One subtask's part (``uid#subtask``): its ack's duration and sizes; for a stage, the
    stage's alignment fields (every subtask starts at the one cut its stage aligned on)."""

    ack_duration_ms: int
    checkpointed_size: int
    full_size: int
    alignment_duration_ms: int | None = None
    start_delay_ms: int | None = None
    unaligned: bool | None = None
    persisted_inflight_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ack_duration_ms": self.ack_duration_ms,
            "checkpointed_size": self.checkpointed_size,
            "full_size": self.full_size,
        }
        stage = {
            "alignment_duration_ms": self.alignment_duration_ms,
            "start_delay_ms": self.start_delay_ms,
            "unaligned": self.unaligned,
            "persisted_inflight_bytes": self.persisted_inflight_bytes,
        }
        body.update({name: value for name, value in stage.items() if value is not None})
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SubtaskStatistics:
        def optional(name: str) -> int | None:
            value = body.get(name)
            return None if value is None else int(value)

        unaligned = body.get("unaligned")
        return cls(
            ack_duration_ms=int(body.get("ack_duration_ms", 0)),
            checkpointed_size=int(body.get("checkpointed_size", 0)),
            full_size=int(body.get("full_size", 0)),
            alignment_duration_ms=optional("alignment_duration_ms"),
            start_delay_ms=optional("start_delay_ms"),
            unaligned=None if unaligned is None else bool(unaligned),
            persisted_inflight_bytes=optional("persisted_inflight_bytes"),
        )


@dataclass(frozen=True)
class CheckpointStatistics:
    """Trigger to global ack (``end_to_end_duration_ms``); ``checkpointed_size``: bytes of
    the files this checkpoint wrote (its incremental part); ``full_size``: bytes of every
    file it references; ``alignment``: a stage's alignment, else None; ``subtasks`` by
    ``uid#subtask``."""

    checkpoint_id: int
    end_to_end_duration_ms: int
    checkpointed_size: int
    full_size: int
    alignment: Alignment | None = None
    subtasks: Mapping[str, SubtaskStatistics] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "end_to_end_duration_ms": self.end_to_end_duration_ms,
            "checkpointed_size": self.checkpointed_size,
            "full_size": self.full_size,
            "alignment": None if self.alignment is None else self.alignment.to_json(),
            "subtasks": {task: s.to_json() for task, s in sorted(self.subtasks.items())},
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CheckpointStatistics | None:
        """The statistics stored in ``body``; None for ``{}`` (a savepoint, an old record)."""
        if not body:
            return None
        alignment = body.get("alignment")
        return cls(
            checkpoint_id=int(body["checkpoint_id"]),
            end_to_end_duration_ms=int(body.get("end_to_end_duration_ms", 0)),
            checkpointed_size=int(body.get("checkpointed_size", 0)),
            full_size=int(body.get("full_size", 0)),
            alignment=None if not alignment else alignment_from_json(alignment),
            subtasks={
                str(task): SubtaskStatistics.from_json(s)
                for task, s in (body.get("subtasks") or {}).items()
            },
        )
