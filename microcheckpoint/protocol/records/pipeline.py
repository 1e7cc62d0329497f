"""The records of a whole pipeline: ``_restore``, ``_stopped`` and ``_failures_reset``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.records.codec import id_or_none

__all__ = ["CancelRecord", "ClaimMode", "FailuresReset", "RestoreMarker", "StopRecord"]


class ClaimMode(str, Enum):
    """Who owns a restored point's files (Flink's restore modes)."""

    NO_CLAIM = "NO_CLAIM"
    CLAIM = "CLAIM"


@dataclass(frozen=True)
class RestoreMarker:
    """``_restore``: the pipeline is re-based on a savepoint or checkpoint.

    The next trigger after checkpoint ``after_id`` starts from ``offsets`` and from the
    state in folder ``prefix`` of this store. ``pipeline_checkpoint`` is the restored
    checkpoint's id when it is one of this pipeline's own checkpoints (None for a
    savepoint). Until a checkpoint after ``after_id`` completes, retention keeps
    ``handle_keys``.
    """

    kind: ClassVar[str] = "_restore"

    source: str
    prefix: str
    point_kind: str
    checkpoint_id: int
    pipeline_checkpoint: CheckpointId | None
    claim_mode: ClaimMode
    after_id: int
    offsets: Mapping[TopicPartition, int]
    handle_keys: tuple[str, ...] = ()
    note: str = ""
    parallelism: int | None = None
    # When the restore was written and by whom (e.g. the Airflow run), for the history.
    at_ms: int | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)

    @property
    def first_snapshot_full(self) -> bool:
        """NO_CLAIM: the first checkpoint after the restore writes full snapshots."""
        return self.claim_mode is ClaimMode.NO_CLAIM

    def covers(self, head: CheckpointId | None) -> bool:
        """Whether the marker was written after checkpoint ``head`` (so it re-bases the chain)."""
        return head is None or self.after_id >= head.value

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "prefix": self.prefix,
            "kind": self.point_kind,
            "checkpoint_id": self.checkpoint_id,
            "pipeline_checkpoint": None
            if self.pipeline_checkpoint is None
            else self.pipeline_checkpoint.value,
            "claim_mode": self.claim_mode.value,
            "first_snapshot_full": self.first_snapshot_full,
            "after_id": self.after_id,
            "offsets": {str(tp): off for tp, off in sorted(self.offsets.items())},
            "handle_keys": list(self.handle_keys),
            "note": self.note,
            "parallelism": self.parallelism,
            "at_ms": self.at_ms,
            "labels": dict(self.labels),
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RestoreMarker:
        parallelism = body.get("parallelism")
        claim = ClaimMode(body.get("claim_mode", ClaimMode.NO_CLAIM.value))
        if "first_snapshot_full" in body and bool(body["first_snapshot_full"]) != (
            claim is ClaimMode.NO_CLAIM
        ):
            raise ValueError("first_snapshot_full contradicts claim_mode")
        return cls(
            source=str(body["source"]),
            prefix=str(body.get("prefix") or ""),
            point_kind=str(body.get("kind", "checkpoint")),
            checkpoint_id=int(body["checkpoint_id"]),
            pipeline_checkpoint=id_or_none(body.get("pipeline_checkpoint")),
            claim_mode=claim,
            after_id=int(body["after_id"]),
            offsets={TopicPartition.parse(k): int(v) for k, v in body["offsets"].items()},
            handle_keys=tuple(str(k) for k in body.get("handle_keys", ())),
            note=str(body.get("note", "")),
            parallelism=None if parallelism in (None, "") else int(parallelism),
            at_ms=None if body.get("at_ms") is None else int(body["at_ms"]),
            labels=dict(body.get("labels") or {}),
        )


@dataclass(frozen=True)
class StopRecord:
    """``_stopped``: triggering is stopped (stop with savepoint) until a restore."""

    kind: ClassVar[str] = "_stopped"

    reason: str
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "at_ms": self.at_ms}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> StopRecord:
        return cls(str(body.get("reason", "")), int(body.get("at_ms", 0)))


@dataclass(frozen=True)
class FailuresReset:
    """``_failures_reset``: only checkpoints after ``after_id`` count as failures."""

    kind: ClassVar[str] = "_failures_reset"

    after_id: int
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"after_id": self.after_id, "at_ms": self.at_ms}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> FailuresReset:
        return cls(int(body["after_id"]), int(body.get("at_ms", 0)))


@dataclass(frozen=True)
class CancelRecord:
    """``_cancelled``: the pipeline's last cancel (it stays: it keeps the ids unique).

    ``after_id`` is the highest checkpoint id allocated before the cancel: ids are never
    reused, even when the cancel deleted every checkpoint (sinks publish each epoch once
    per id). ``cleanup`` is the externalized-checkpoint policy applied; ``aborted`` the
    checkpoints it aborted in flight; ``retained`` the completed ones kept; ``deleted`` the
    number of objects deleted.
    """

    kind: ClassVar[str] = "_cancelled"

    after_id: int
    at_ms: int
    cleanup: str
    aborted: tuple[int, ...] = ()
    retained: tuple[int, ...] = ()
    deleted: int = 0
    labels: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "after_id": self.after_id,
            "at_ms": self.at_ms,
            "cleanup": self.cleanup,
            "aborted": list(self.aborted),
            "retained": list(self.retained),
            "deleted": self.deleted,
            "labels": dict(self.labels),
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CancelRecord:
        return cls(
            after_id=int(body["after_id"]),
            at_ms=int(body.get("at_ms", 0)),
            cleanup=str(body.get("cleanup", "")),
            aborted=tuple(int(c) for c in body.get("aborted", ())),
            retained=tuple(int(c) for c in body.get("retained", ())),
            deleted=int(body.get("deleted", 0)),
            labels=dict(body.get("labels") or {}),
        )
