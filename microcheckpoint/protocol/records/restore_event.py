"""``_events/restores/<at>-<writer>``: one restore, rescale, fallback or cancel, kept for good.

``_restore`` and ``_cancelled`` hold only the pipeline's latest restore and cancel (each
overwrites the one before); an event is appended once per operation and never rewritten,
so the pipeline's restores and cancels can be listed like Flink's Rescales tab lists its
rescales. What is known only later (the first checkpoint after the event, the parallelism
it ran at, the time it took) is derived when the history is read (``protocol.restores``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from microcheckpoint.protocol.records.pipeline import ClaimMode

__all__ = ["EventKind", "RestoreEvent"]


class EventKind(str, Enum):
    """What happened. A restore whose requested parallelism differs from the pipeline's is
    a ``rescale``; a restore of ``latest`` that passed over an unusable checkpoint is a
    ``fallback`` (whatever its parallelism)."""

    RESTORE = "restore"
    RESCALE = "rescale"
    FALLBACK = "fallback"
    CANCEL = "cancel"

    @property
    def restores(self) -> bool:
        """Whether the pipeline runs again from a point after it (not a cancel)."""
        return self is not EventKind.CANCEL


@dataclass(frozen=True)
class RestoreEvent:
    """One restore, rescale, fallback or cancel of a pipeline.

    ``after_id`` is the highest checkpoint id allocated when it happened: the checkpoints
    after it have higher ids (ids are never reused, so this holds across a cancel that
    deleted every checkpoint). ``source`` and ``checkpoint_id`` name the point restored (for
    a cancel: the latest completed checkpoint, the one a restore of ``latest`` resumes;
    ``""`` and None without one). ``parallelism_before`` is the subtasks per operator uid
    of the pipeline's newest completed checkpoint (else of the restored point);
    ``parallelism`` the one requested (None: the runner's default). ``records_to_replay``
    is the records between the point's offsets and the newest completed checkpoint's,
    summed over partitions (None without a completed checkpoint). ``who`` is the
    Airflow run (``dag_id/run_id``) or ``cli:<user>``; ``writer`` makes the bytes unique.
    """

    kind: ClassVar[str] = "restore event"

    event_kind: EventKind
    at_ms: int
    after_id: int
    source: str
    checkpoint_id: int | None
    point_kind: str
    claim_mode: ClaimMode | None
    parallelism_before: Mapping[str, int]
    parallelism: int | None
    records_to_replay: int | None
    who: str
    writer: str
    note: str = ""
    labels: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.event_kind.value,
            "at_ms": self.at_ms,
            "after_id": self.after_id,
            "source": self.source,
            "checkpoint_id": self.checkpoint_id,
            "point_kind": self.point_kind,
            "claim_mode": None if self.claim_mode is None else self.claim_mode.value,
            "parallelism_before": dict(sorted(self.parallelism_before.items())),
            "parallelism": self.parallelism,
            "records_to_replay": self.records_to_replay,
            "who": self.who,
            "writer": self.writer,
            "note": self.note,
            "labels": dict(self.labels),
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RestoreEvent:
        claim, cid = body.get("claim_mode"), body.get("checkpoint_id")
        parallelism, replay = body.get("parallelism"), body.get("records_to_replay")
        return cls(
            event_kind=EventKind(body["kind"]),
            at_ms=int(body["at_ms"]),
            after_id=int(body["after_id"]),
            source=str(body.get("source") or ""),
            checkpoint_id=None if cid is None else int(cid),
            point_kind=str(body.get("point_kind") or ""),
            claim_mode=None if claim is None else ClaimMode(claim),
            parallelism_before={
                str(uid): int(n) for uid, n in (body.get("parallelism_before") or {}).items()
            },
            parallelism=None if parallelism is None else int(parallelism),
            records_to_replay=None if replay is None else int(replay),
            who=str(body.get("who") or ""),
            writer=str(body.get("writer") or ""),
            note=str(body.get("note") or ""),
            labels=dict(body.get("labels") or {}),
        )
