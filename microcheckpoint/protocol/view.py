"""The stored view of a pipeline's checkpoints: what exists and in which state.

Everything the coordinator knows is derived from checkpoint storage, so a coordinator
that crashes and restarts (a new Airflow task) sees exactly what the old one left.
``scan`` lists ``<pipeline>/chk-*`` once; records are read lazily and at most once per
``RecordCache``: a coordinator's views share one, so the write-once records (``_pending``,
``_outcome``, ``_metadata``, acks) are read once per process however often it scans.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import wait
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any, TypeVar

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol import layout as names
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import (
    AbortReason,
    Ack,
    CancelRecord,
    CheckpointMetadata,
    FailuresReset,
    OutcomeRecord,
    PendingRecord,
    RestoreMarker,
    StopRecord,
    decode_metadata,
    read,
)
from microcheckpoint.storage.port import ObjectStore, each, started

__all__ = ["CheckpointRecord", "CheckpointStatus", "PipelineView", "RecordCache", "scan"]

T = TypeVar("T")


class RecordCache:
    """Decoded write-once records by key: ``_pending``, ``_outcome``, ``_metadata``, acks.

    Each is written once with put-if-absent and never replaced, and no key is used twice
    (checkpoint ids only grow, past a cancel too: ``id_floor``), so a record read once stays
    true for as long as its key exists. The views sharing a cache still LIST to learn what
    exists; they only skip reading again what they have read, or what their own coordinator
    wrote (``put``). One cache belongs to one store; it lives as long as its coordinator.
    """

    def __init__(self) -> None:
        self._records: dict[str, Any] = {}

    def get(self, key: str, load: Callable[[], T | None]) -> T | None:
        """The record under ``key``: cached, else ``load()`` (kept unless None)."""
        if key in self._records:
            return self._records[key]  # type: ignore[no-any-return]
        record = load()
        if record is not None:
            self._records[key] = record
        return record

    def has(self, key: str) -> bool:
        """Whether the record under ``key`` was read or written already."""
        return key in self._records

    def put(self, key: str, record: object) -> None:
        """Remember a record this process wrote (put-if-absent succeeded)."""
        self._records[key] = record


class CheckpointStatus(Enum):
    PENDING = "PENDING"
    COMPLETING = "COMPLETING"  # outcome COMPLETED claimed, _metadata not yet written
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    DISCARDED = "DISCARDED"  # only state files still referenced by newer checkpoints remain


@dataclass
class CheckpointRecord:
    """One ``chk-<n>/`` folder as found in storage."""

    checkpoint_id: CheckpointId
    status: CheckpointStatus
    keys: list[str]
    attempt: int = 0
    outcome: OutcomeRecord | None = None
    notified: bool = False
    _pending: PendingRecord | None = field(default=None, repr=False)

    @property
    def abort_reason(self) -> AbortReason | None:
        if self.status is not CheckpointStatus.ABORTED or self.outcome is None:
            return None
        return self.outcome.reason


class PipelineView:
    """A consistent listing of one pipeline's checkpoints, read once."""

    def __init__(
        self,
        store: ObjectStore,
        layout: Layout,
        records: list[CheckpointRecord],
        cache: RecordCache | None = None,
    ) -> None:
        self.store = store
        self.layout = layout
        self.records = {r.checkpoint_id: r for r in records}
        self.cache = cache or RecordCache()
        # Pipeline markers as this view read them (they change: views do not share them).
        self._markers: dict[str, Any] = {}

    def with_pending(self, pending: PendingRecord) -> PipelineView:
        """This view with the checkpoint whose ``_pending`` the caller just wrote: what a
        listing would show next, without one (the markers as this view read them)."""
        cid = pending.checkpoint_id
        record = CheckpointRecord(
            cid,
            CheckpointStatus.PENDING,
            [self.layout.pending(cid)],
            attempt=2 if pending.begun else 1,
            _pending=pending,
        )
        view = PipelineView(self.store, self.layout, [*self.records.values(), record], self.cache)
        view._markers = dict(self._markers)
        return view

    def completed_now(self, cid: CheckpointId, meta: CheckpointMetadata) -> None:
        """Take ``cid`` as completed: its coordinator claimed it and has just written its
        ``_metadata`` (``meta``, as stored), which this listing, taken meanwhile, may show
        or not (then ``cid`` is COMPLETING here). A folder listed otherwise is left as
        listed: one dropped meanwhile stays dropped."""
        record = self.records.get(cid)
        if record is None or record.status is not CheckpointStatus.COMPLETING:
            return
        key = self.layout.metadata(cid)
        record.status = CheckpointStatus.COMPLETED
        if key not in record.keys:
            record.keys.append(key)
        self.cache.put(key, meta)

    def ids(self, *statuses: CheckpointStatus) -> list[CheckpointId]:
        return sorted(c for c, r in self.records.items() if not statuses or r.status in statuses)

    @property
    def pending(self) -> list[CheckpointId]:
        return self.ids(CheckpointStatus.PENDING)

    @property
    def completed(self) -> list[CheckpointId]:
        return self.ids(CheckpointStatus.COMPLETED)

    @property
    def in_flight(self) -> list[CheckpointId]:
        """Pending checkpoints and claimed completions whose ``_metadata`` is not written yet."""
        return self.ids(CheckpointStatus.PENDING, CheckpointStatus.COMPLETING)

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

    @property
    def head(self) -> CheckpointId | None:
        """The highest pending or completed checkpoint: the chain the next trigger extends."""
        live = self.ids(CheckpointStatus.PENDING, CheckpointStatus.COMPLETED)
        return live[-1] if live else None

    def pending_record(self, cid: CheckpointId) -> PendingRecord:
        """Checkpoint ``cid``'s ``_pending`` (its barrier, trigger time, expected tasks, base)."""
        record = self.records[cid]
        if record._pending is None:
            key = self.layout.pending(cid)
            pending = self.cache.get(key, lambda: read(self.store, key, PendingRecord))
            if pending is None:
                raise MetadataFormatError(f"{self.layout.pending(cid)} vanished")
            record._pending = pending
        return record._pending

    def expected_tasks(self, cid: CheckpointId) -> frozenset[TaskId]:
        return self.pending_record(cid).expected

    def trigger_time_ms(self, cid: CheckpointId) -> int:
        return self.pending_record(cid).trigger_time_ms

    def acks(self, cid: CheckpointId, attempt: int) -> list[Ack]:
        """The acks stored for attempt ``attempt`` of ``cid`` (as listed by ``scan``)."""
        prefix = self.layout.acks(cid, attempt)
        keys = [key for key in self.records[cid].keys if key.startswith(prefix)]
        return [ack for ack in each(self.ack, keys) if ack is not None]

    def ack(self, key: str) -> Ack | None:
        """The ack stored under ``key`` (read once per cache)."""
        return self.cache.get(key, lambda: read(self.store, key, Ack))

    def metadata(self, cid: CheckpointId) -> CheckpointMetadata:
        key = self.layout.metadata(cid)

        def load() -> CheckpointMetadata:
            obj = self.store.get(key)
            if obj is None:
                raise MetadataFormatError(f"{self.store.child_url(key)} is missing")
            meta = decode_metadata(obj.data, self.store.child_url(key))
            self.cache.put(sha256_key(key), hashlib.sha256(obj.data).hexdigest())
            return meta

        meta = self.cache.get(key, load)
        assert meta is not None
        return meta

    def metadata_sha256(self, cid: CheckpointId) -> str:
        """The SHA-256 of the bytes of ``cid``'s ``_metadata`` (read once per cache, like
        the record; its writer remembers it from writing)."""
        key = self.layout.metadata(cid)
        found = self.cache.get(sha256_key(key), lambda: None)
        if found is None:
            obj = self.store.get(key)
            if obj is None:
                raise MetadataFormatError(f"{self.store.child_url(key)} is missing")
            found = hashlib.sha256(obj.data).hexdigest()
            self.cache.put(sha256_key(key), found)
        return str(found)

    @property
    def restore_marker(self) -> RestoreMarker | None:
        """The pipeline's ``_restore`` marker, read once per view."""
        return self.marker(self.layout.restore, RestoreMarker)

    def marker(self, key: str, cls: type[T]) -> T | None:
        """The pipeline marker under ``key`` (``_restore``, ``_stopped``, ``_cancelled``,
        ``_failures_reset``) decoded as ``cls``, or None: read once per view."""
        if key not in self._markers:
            self._markers[key] = read(self.store, key, cls)
        return self._markers[key]  # type: ignore[no-any-return]

    def remember_marker(self, key: str, value: object) -> None:
        """Take ``value`` as the marker under ``key``, read by the caller while this view
        was listed (``marker`` then does not read it)."""
        self._markers[key] = value

    def prefetch(self) -> PipelineView:
        """Read at once what a trigger decides on: the four markers and the head's
        ``_metadata`` (its start offsets), each a round trip that depends on no other."""
        layout = self.layout
        reads: list[Callable[[], object]] = [
            partial(self.marker, layout.restore, RestoreMarker),
            partial(self.marker, layout.stopped, StopRecord),
            partial(self.marker, layout.cancelled, CancelRecord),
            partial(self.marker, layout.failures_reset, FailuresReset),
        ]
        head = self.head
        if head is not None and self.records[head].status is CheckpointStatus.COMPLETED:
            # A read ahead: a restore written after the head re-bases the chain, and then
            # the head's _metadata (corrupt, the one a fallback passed over) is not needed.
            # A failure is left for whatever does need it (it reads it again then).
            reads.append(partial(_quietly, partial(self.metadata, head)))
        each(lambda load: load(), reads)
        return self


def _quietly(load: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        load()


def sha256_key(key: str) -> str:
    """Where a ``RecordCache`` keeps the SHA-256 of the record stored under ``key``."""
    return key + "#sha256"


def _read_ahead(store: ObjectStore, cache: RecordCache, key: str) -> None:
    """Read the ack under ``key`` into ``cache`` if it is there and reads. A failure is
    left for the view to meet, if it needs the ack at all (it reads it again then)."""
    with contextlib.suppress(Exception):  # a read ahead: the view's own read reports it
        cache.get(key, partial(read, store, key, Ack))


def scan(
    store: ObjectStore,
    layout: Layout,
    cache: RecordCache | None = None,
    *,
    acks: Iterable[str] = (),
) -> PipelineView:
    """List ``<pipeline>/chk-*`` once and derive every checkpoint's status (reading what
    ``cache`` does not hold yet).

    ``acks``: keys of acks the caller expects to find (the tasks of an attempt it ran),
    read into ``cache`` while the listing runs rather than after it, so a completion
    costs one round trip where it cost two. A key that is not there yet is read again if
    the listing shows it, and so is one whose read failed (the view reports that error
    only if it needs the ack). Not for a caller on the ``each`` pool (it waits for it).
    """
    cache = cache or RecordCache()
    reads = [started(partial(_read_ahead, store, cache, key)) for key in acks if not cache.has(key)]
    try:
        listed = list(store.list(layout.root + "chk-"))
    finally:
        wait(reads)
    by_id: dict[CheckpointId, list[str]] = {}
    for key in listed:
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
            outcome = cache.get(
                layout.outcome(cid), partial(read, store, layout.outcome(cid), OutcomeRecord)
            )
            completed = outcome is not None and outcome.completed
            status = CheckpointStatus.COMPLETING if completed else CheckpointStatus.ABORTED
        else:
            status = CheckpointStatus.PENDING
        pending = None
        if not attempts and status is CheckpointStatus.PENDING:
            pending = _pending_of(store, layout, cache, cid)
        records.append(
            CheckpointRecord(
                cid,
                status,
                keys,
                attempt=max(attempts, default=2 if pending is not None and pending.begun else 1),
                outcome=outcome,
                notified=names.NOTIFIED in files,
                _pending=pending,
            )
        )
    return PipelineView(store, layout, records, cache)


def _pending_of(
    store: ObjectStore, layout: Layout, cache: RecordCache, cid: CheckpointId
) -> PendingRecord | None:
    """``cid``'s ``_pending``, for a pending checkpoint with no attempt marker: whether its
    trigger's run began attempt 2 (``PendingRecord.begun``), so that its acks and declines
    are looked for under 2. Read once per cache (the trigger's coordinator has it unread;
    a listing rarely shows another pending one); None when it cannot be read (the
    checkpoint's own steps report that). A folder decided since keeps attempt 1 in the
    view: nothing reads its attempt from there (a claim names its attempt)."""
    key = layout.pending(cid)
    with contextlib.suppress(Exception):
        return cache.get(key, partial(read, store, key, PendingRecord))
    return None
