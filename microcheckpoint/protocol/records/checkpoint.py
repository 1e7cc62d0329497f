"""The records of one checkpoint: ``_pending``, ``_attempt-<k>``, acks, ``_outcome``, ``_notified``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier
from microcheckpoint.protocol.records.alignment import Alignment, alignment_from_json
from microcheckpoint.protocol.records.codec import id_or_none
from microcheckpoint.protocol.records.handles import StateHandle
from microcheckpoint.protocol.records.interval import DataInterval

__all__ = [
    "AbortReason",
    "Ack",
    "AttemptRecord",
    "DeclineRecord",
    "NotifiedRecord",
    "Outcome",
    "OutcomeRecord",
    "PendingRecord",
]


class AbortReason(Enum):
    EXPIRED = "EXPIRED"  # not acknowledged within the checkpoint timeout
    DECLINED = "DECLINED"  # a task failed or declined
    SUBSUMED = "SUBSUMED"  # a newer checkpoint completed first
    TRIGGER_REFUSED = "TRIGGER_REFUSED"  # lost a race against max_concurrent (before 11-28)
    BASE_ABORTED = "BASE_ABORTED"  # the checkpoint it continued from was aborted
    CANCELLED = "CANCELLED"  # the pipeline was cancelled while it was in flight

    @property
    def counts_as_failure(self) -> bool:
        """Only expired and declined checkpoints count toward ``tolerable_failures``."""
        return self in (AbortReason.EXPIRED, AbortReason.DECLINED)


class Outcome(Enum):
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class PendingRecord:
    """``_pending``: checkpoint n was triggered with barrier n.

    ``base`` is the checkpoint whose state and offsets n continues from (None after a
    restore, or for the first checkpoint). ``labels`` are JSON-able facts for the history
    (the Airflow run). ``writer`` makes the bytes unique per writer. ``files`` names, per
    file-source partition, the files of its barrier range, in order. ``begun``: the run
    that triggered n processes it itself, as attempt 2, the first run's; it writes no
    ``_attempt-00002`` marker, and a run that begins n later takes attempt 3.

    Three facts are typed: ``data_interval`` (policy ``data_interval``), ``alignment`` (a
    stage input's) and ``restored_from`` (the first checkpoint after a restore: the point's
    URL). They are stored among the labels under those names, as they always were, so
    ``labels`` may not hold those names itself (ValueError).
    """

    kind: ClassVar[str] = "_pending"

    pipeline: str
    checkpoint_id: CheckpointId
    barrier: Barrier
    trigger_time_ms: int
    expected: frozenset[TaskId]
    base: CheckpointId | None = None
    writer: str = ""
    labels: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[TopicPartition, tuple[str, ...]] = field(default_factory=dict)
    data_interval: DataInterval | None = None
    alignment: Alignment | None = None
    restored_from: str | None = None
    begun: bool = False

    TYPED_LABELS: ClassVar[tuple[str, ...]] = ("data_interval", "alignment", "restored_from")

    def __post_init__(self) -> None:
        typed = sorted(set(self.labels) & set(self.TYPED_LABELS))
        if typed:
            raise ValueError(
                f"labels {typed} of checkpoint {self.checkpoint_id} are typed fields: pass "
                "them as data_interval=, alignment= or restored_from="
            )

    def labels_json(self) -> dict[str, Any]:
        """The labels as stored and shown: the free ones and the typed facts that are set."""
        out = dict(self.labels)
        if self.data_interval is not None:
            out["data_interval"] = self.data_interval.to_json()
        if self.alignment is not None:
            out["alignment"] = self.alignment.to_json()
        if self.restored_from is not None:
            out["restored_from"] = self.restored_from
        return out

    def to_json(self) -> dict[str, Any]:
        body = {
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id.value,
            "barrier": self.barrier.to_json(),
            "trigger_time_ms": self.trigger_time_ms,
            "expected": sorted(str(t) for t in self.expected),
            "base": None if self.base is None else self.base.value,
            "writer": self.writer,
            "labels": self.labels_json(),
        }
        if self.files:
            body["files"] = {str(tp): list(names) for tp, names in sorted(self.files.items())}
        if self.begun:
            body["begun"] = True
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> PendingRecord:
        labels = dict(body.get("labels") or {})
        interval, alignment = labels.pop("data_interval", None), labels.pop("alignment", None)
        restored_from = labels.pop("restored_from", None)
        return cls(
            pipeline=str(body["pipeline"]),
            checkpoint_id=CheckpointId(int(body["checkpoint_id"])),
            barrier=Barrier.from_json(body["barrier"]),
            trigger_time_ms=int(body["trigger_time_ms"]),
            expected=frozenset(TaskId.parse(t) for t in body["expected"]),
            base=id_or_none(body.get("base")),
            writer=str(body.get("writer", "")),
            labels=labels,
            files={
                TopicPartition.parse(tp): tuple(str(n) for n in names)
                for tp, names in (body.get("files") or {}).items()
            },
            data_interval=None if not interval else DataInterval.from_json(interval),
            alignment=None if not alignment else alignment_from_json(alignment),
            restored_from=None if restored_from is None else str(restored_from),
            begun=bool(body.get("begun", False)),
        )


@dataclass(frozen=True)
class AttemptRecord:
    """``_attempt-<k>``: processing attempt k (≥ 2) of a checkpoint began."""

    kind: ClassVar[str] = "_attempt"

    attempt: int
    writer: str = ""
    at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "writer": self.writer, "at_ms": self.at_ms}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> AttemptRecord:
        return cls(
            int(body.get("attempt", 0)), str(body.get("writer", "")), int(body.get("at_ms", 0))
        )


@dataclass(frozen=True)
class Ack:
    """A task's acknowledgement: its snapshot's handles and small inline state.

    ``operator_state`` is JSON-able state small enough to live in ``_metadata``
    (for example a source subtask's ``{"topic:partition": next_offset}``).

    The times split the subtask's work as Flink does: ``sync_ms`` from the subtask's barrier
    (its epoch's start: restore, apply, serialize) to its snapshot written locally, and
    ``async_ms`` the upload of its files to storage (0 when it wrote none). Both are
    fractional milliseconds and None in acks stored before they existed; ``duration_ms``
    is their sum, rounded. The end to end of a subtask is ``acked_at_ms`` minus the
    checkpoint's trigger time (the history computes it).

    Two more facts place the subtask in that end to end (``protocol.slowest``):
    ``started_at_ms``, when its code began in its Spark task (ms since the epoch), and
    ``read_ms``, the time it then spent receiving and decoding its rows (before its sync
    part). Both are None in acks stored before they existed.
    """

    kind: ClassVar[str] = "ack"

    task: TaskId
    attempt: int
    handles: tuple[StateHandle, ...] = ()
    operator_state: Mapping[str, Any] = field(default_factory=dict)
    duration_ms: int = 0
    # When the ack was stored (ms since the epoch; None in acks stored before it existed):
    # the history's "latest acknowledgement".
    acked_at_ms: int | None = None
    sync_ms: float | None = None
    async_ms: float | None = None
    started_at_ms: int | None = None
    read_ms: float | None = None

    @property
    def size(self) -> int:
        return sum(h.size for h in self.handles)

    def to_json(self) -> dict[str, Any]:
        body = {
            "task": str(self.task),
            "attempt": self.attempt,
            "handles": [h.to_json() for h in self.handles],
            "operator_state": dict(self.operator_state),
            "duration_ms": self.duration_ms,
        }
        if self.acked_at_ms is not None:
            body["acked_at_ms"] = self.acked_at_ms
        if self.sync_ms is not None:
            body["sync_ms"] = self.sync_ms
        if self.async_ms is not None:
            body["async_ms"] = self.async_ms
        if self.started_at_ms is not None:
            body["started_at_ms"] = self.started_at_ms
        if self.read_ms is not None:
            body["read_ms"] = self.read_ms
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ack:
        try:
            return cls(
                TaskId.parse(data["task"]),
                int(data["attempt"]),
                tuple(StateHandle.from_json(h) for h in data.get("handles", ())),
                dict(data.get("operator_state", {})),
                int(data.get("duration_ms", 0)),
                None if data.get("acked_at_ms") is None else int(data["acked_at_ms"]),
                None if data.get("sync_ms") is None else float(data["sync_ms"]),
                None if data.get("async_ms") is None else float(data["async_ms"]),
                None if data.get("started_at_ms") is None else int(data["started_at_ms"]),
                None if data.get("read_ms") is None else float(data["read_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MetadataFormatError(f"ack is malformed: {exc}") from exc


@dataclass(frozen=True)
class DeclineRecord:
    """``_declined-<k>``: a task of attempt k failed, and why (Flink's DeclineCheckpoint).

    ``task`` is a subtask (``word-counts#1``) or ``driver``: the epoch's driver, for a
    failure outside every subtask. ``cause`` is one line, ``ValueError: bad row 3``. Only
    the first decline of an attempt is kept (put-if-absent).
    """

    kind: ClassVar[str] = "_declined"

    task: str
    attempt: int
    cause: str
    at_ms: int = 0
    writer: str = ""

    @property
    def detail(self) -> str:
        """What an abort and the history say: ``task word-counts#1: ValueError: bad row 3``."""
        return f"task {self.task}: {self.cause}"

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "attempt": self.attempt,
            "cause": self.cause,
            "at_ms": self.at_ms,
            "writer": self.writer,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> DeclineRecord:
        return cls(
            str(body["task"]),
            int(body["attempt"]),
            str(body.get("cause", "")),
            int(body.get("at_ms", 0)),
            str(body.get("writer", "")),
        )


@dataclass(frozen=True)
class OutcomeRecord:
    """``_outcome``: the one decision about a checkpoint.

    COMPLETED carries the attempt whose acks complete it (``_metadata`` follows);
    ABORTED carries the reason and a detail for people, and, when a task declined it, that
    task and its cause (None in outcomes stored before they existed, or without a decline).
    """

    kind: ClassVar[str] = "_outcome"

    outcome: Outcome
    at_ms: int
    writer: str = ""
    attempt: int | None = None
    reason: AbortReason | None = None
    detail: str = ""
    task: str | None = None
    cause: str | None = None

    @property
    def completed(self) -> bool:
        return self.outcome is Outcome.COMPLETED

    @classmethod
    def completed_by(cls, attempt: int, at_ms: int, writer: str) -> OutcomeRecord:
        return cls(Outcome.COMPLETED, at_ms, writer, attempt=attempt)

    @classmethod
    def aborted(
        cls,
        reason: AbortReason,
        detail: str,
        at_ms: int,
        writer: str,
        decline: DeclineRecord | None = None,
    ) -> OutcomeRecord:
        if decline is None:
            return cls(Outcome.ABORTED, at_ms, writer, reason=reason, detail=detail)
        return cls(
            Outcome.ABORTED,
            at_ms,
            writer,
            reason=reason,
            detail=detail,
            task=decline.task,
            cause=decline.cause,
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"outcome": self.outcome.value, "at_ms": self.at_ms}
        body["writer"] = self.writer
        if self.outcome is Outcome.COMPLETED:
            body["attempt"] = self.attempt
        else:
            body["reason"] = None if self.reason is None else self.reason.value
            body["detail"] = self.detail
            if self.task is not None:
                body["task"], body["cause"] = self.task, self.cause
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> OutcomeRecord:
        outcome = Outcome(body["outcome"])
        reason = body.get("reason")
        attempt = body.get("attempt")
        return cls(
            outcome,
            int(body.get("at_ms", 0)),
            str(body.get("writer", "")),
            attempt=None if attempt is None else int(attempt),
            reason=None if reason is None else AbortReason(reason),
            detail=str(body.get("detail", "")),
            task=None if body.get("task") is None else str(body["task"]),
            cause=None if body.get("cause") is None else str(body["cause"]),
        )


@dataclass(frozen=True)
class NotifiedRecord:
    """``_notified``: notify (sinks, group offsets, cleanup) finished for the checkpoint."""

    kind: ClassVar[str] = "_notified"

    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> NotifiedRecord:
        return cls(int(body.get("at_ms", 0)))
