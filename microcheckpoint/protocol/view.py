"""The stored view of a pipeline's checkpoints: what exists and in which state.

Everything the coordinator knows is derived from checkpoint storage, so a coordinator
that crashes and restarts (a new Airflow task) sees exactly what the old one left.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol import layout as names
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.metadata import CheckpointMetadata, decode_metadata
from microcheckpoint.storage.port import ObjectStore

__all__ = ["AbortReason", "CheckpointRecord", "CheckpointStatus", "PipelineView", "scan"]


class CheckpointStatus(Enum):
    PENDING = "PENDING"
    COMPLETING = "COMPLETING"  # outcome COMPLETED claimed, _metadata not yet written
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    DISCARDED = "DISCARDED"  # only state files still referenced by newer checkpoints remain


class AbortReason(Enum):
    EXPIRED = "EXPIRED"  # not acknowledged within the checkpoint timeout
    DECLINED = "DECLINED"  # a task failed or declined
    SUBSUMED = "SUBSUMED"  # a newer checkpoint completed first
    TRIGGER_REFUSED = "TRIGGER_REFUSED"  # lost a race against max_concurrent
    BASE_ABORTED = "BASE_ABORTED"  # the checkpoint it continued from was aborted

    @property
    def counts_as_failure(self) -> bool:
        """Only expired and declined checkpoints count toward ``tolerable_failures``."""
        return self in (AbortReason.EXPIRED, AbortReason.DECLINED)


def read_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    obj = store.get(key)
    if obj is None:
        return None
    try:
        value = json.loads(obj.data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetadataFormatError(f"{store.child_url(key)} is corrupt: {exc}") from exc
    if not isinstance(value, dict):
        raise MetadataFormatError(f"{store.child_url(key)} is not a JSON object")
    return value


@dataclass
class CheckpointRecord:
    """One ``chk-<n>/`` folder as found in storage."""

    checkpoint_id: CheckpointId
    status: CheckpointStatus
    keys: list[str]
    attempt: int = 0
    outcome: dict[str, Any] | None = None
    notified: bool = False
    _pending: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def abort_reason(self) -> AbortReason | None:
        if self.status is not CheckpointStatus.ABORTED or self.outcome is None:
            return None
        return AbortReason(self.outcome["reason"])


class PipelineView:
    """A consistent listing of one pipeline's checkpoints, read once."""

    def __init__(self, store: ObjectStore, layout: Layout, records: list[CheckpointRecord]) -> None:
        self.store = store
        self.layout = layout
        self.records = {r.checkpoint_id: r for r in records}
        self._metadata: dict[CheckpointId, CheckpointMetadata] = {}

    def ids(self, *statuses: CheckpointStatus) -> list[CheckpointId]:
        return sorted(c for c, r in self.records.items() if not statuses or r.status in statuses)

    @property
    def pending(self) -> list[CheckpointId]:
        return self.ids(CheckpointStatus.PENDING)

    @property
    def completed(self) -> list[CheckpointId]:
        return self.ids(CheckpointStatus.COMPLETED)

    @property
    def latest_completed(self) -> CheckpointId | None:
        done = self.completed
        return done[-1] if done else None

    @property
    def max_id(self) -> CheckpointId | None:
        allocated = self.ids(
            CheckpointStatus.PENDING,
            CheckpointStatus.COMPLETING,
            CheckpointStatus.COMPLETED,
            CheckpointStatus.ABORTED,
        )
        return allocated[-1] if allocated else None

    def pending_record(self, cid: CheckpointId) -> dict[str, Any]:
        record = self.records[cid]
        if record._pending is None:
            data = read_json(self.store, self.layout.pending(cid))
            if data is None:
                raise MetadataFormatError(f"{self.layout.pending(cid)} vanished")
            record._pending = data
        return record._pending

    def expected_tasks(self, cid: CheckpointId) -> frozenset[TaskId]:
        return frozenset(TaskId.parse(t) for t in self.pending_record(cid)["expected"])

    def trigger_time_ms(self, cid: CheckpointId) -> int:
        return int(self.pending_record(cid)["trigger_time_ms"])

    def metadata(self, cid: CheckpointId) -> CheckpointMetadata:
        if cid not in self._metadata:
            key = self.layout.metadata(cid)
            obj = self.store.get(key)
            if obj is None:
                raise MetadataFormatError(f"{self.store.child_url(key)} is missing")
            self._metadata[cid] = decode_metadata(obj.data, self.store.child_url(key))
        return self._metadata[cid]


def scan(store: ObjectStore, layout: Layout) -> PipelineView:
    """List ``<pipeline>/chk-*`` once and derive every checkpoint's status."""
    by_id: dict[CheckpointId, list[str]] = {}
    for key in store.list(layout.root + "chk-"):
        folder = key[len(layout.root) :].split("/", 1)[0]
        cid = CheckpointId.parse_dirname(folder)
        if cid is not None:
            by_id.setdefault(cid, []).append(key)
    records = []
    for cid, keys in sorted(by_id.items()):
        base = layout.chk(cid)
        files = {k[len(base) :] for k in keys}
        attempts = [
            int(f[len(names.ATTEMPT_PREFIX) :]) for f in files if f.startswith(names.ATTEMPT_PREFIX)
        ]
        outcome = None
        if names.METADATA in files:
            status = CheckpointStatus.COMPLETED
        elif names.PENDING not in files:
            status = CheckpointStatus.DISCARDED  # dropped (retention deletes _pending first)
        elif names.OUTCOME in files:
            outcome = read_json(store, layout.outcome(cid))
            completed = outcome is not None and outcome.get("outcome") == "COMPLETED"
            status = CheckpointStatus.COMPLETING if completed else CheckpointStatus.ABORTED
        else:
            status = CheckpointStatus.PENDING
        records.append(
            CheckpointRecord(
                cid,
                status,
                keys,
                attempt=max(attempts, default=1),
                outcome=outcome,
                notified=names.NOTIFIED in files,
            )
        )
    return PipelineView(store, layout, records)
