"""``complete(then_notify=True)``: ``_metadata`` written beside notify's first requests.

The claim decides a checkpoint; its ``_metadata`` makes it restorable. A run that notifies
right after it completes sends ``_metadata`` as ``complete`` returns, so it goes at once with
notify's listing and the sinks' reads of their parts, where it was a round trip of its own
before them (docs/operations.md, the critical path). The sinks get their rows only once it is
written: nothing is published for a checkpoint that is not restorable.
"""

from __future__ import annotations

import threading

import pytest

from microcheckpoint.errors import AcksMissing, StorageError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.recovery import notify_left_behind
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import StoredObject, WriteOutcome
from tests.unit.conftest import TP0
from tests.unit.protocol.test_recovery import MemoryOffsets
from tests.unit.protocol.test_requests import Recording, tasks

STAGED = "pipe/sink/staged-part"


class HoldsMetadata(FileStore):
    """A file store whose put-if-absent of a ``_metadata`` waits (``patience``) until a
    listing and a read of ``STAGED`` have begun, and notes whether both had; ``before``
    runs first (another writer's step), ``fail`` makes it raise instead."""

    def __init__(self, url: str, patience: float = 5.0) -> None:
        super().__init__(url)
        self.listed = threading.Event()
        self.read = threading.Event()
        self.patience = patience
        self.overlapped: list[bool] = []
        self.before = None
        self.fail = False

    def list(self, prefix: str = ""):
        self.listed.set()
        return super().list(prefix)

    def get(self, key: str) -> StoredObject | None:
        if key == STAGED:
            self.read.set()
        return super().get(key)

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        if key.endswith("/_metadata"):
            if self.fail:
                raise StorageError(f"PUT {key}: connection reset")
            both = self.listed.wait(self.patience) and self.read.wait(self.patience)
            self.overlapped.append(both)
            if self.before is not None:
                self.before()
        return super().put_if_absent(key, data)

    def arm(self) -> None:
        self.listed.clear()
        self.read.clear()
        self.overlapped.clear()


def acked(h, coord) -> CheckpointId:
    """A triggered and planned checkpoint every task acked."""
    cid = coord.trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    for task in tasks(1):
        record_ack(h.store, h.layout, cid, Ack(task, plan.attempt, (), {}, 5))
    return cid


class Sink:
    """A sink's commit: reads its staged part, takes its rows (``ready``), publishes; notes
    whether ``_metadata`` existed when it published."""

    def __init__(self, h) -> None:
        self.h = h
        self.published: list[tuple[int, bool]] = []

    def __call__(self, meta, ready=None) -> None:
        self.h.store.get(STAGED)
        if ready is not None:
            ready()
        restorable = self.h.store.exists(self.h.layout.metadata(meta.checkpoint_id))
        self.published.append((meta.checkpoint_id.value, restorable))


def test_metadata_goes_beside_notify_s_listing_and_the_sinks_reads(h) -> None:
    store = h.store = HoldsMetadata(h.store.url)
    store.put(STAGED, b"{}\n")
    coord = h.coordinator()
    cid = acked(h, coord)
    store.arm()
    sink = Sink(h)

    meta = coord.complete(cid, then_notify=True)
    coord.notify(cid, commit_sinks=sink)

    # _metadata waited for notify's listing and the sink's read, and got both.
    assert store.overlapped == [True]
    assert sink.published == [(cid.value, True)]
    view = h.coordinator().view()
    assert view.records[cid].status is CheckpointStatus.COMPLETED and view.records[cid].notified
    assert view.metadata(cid) == meta
    # Without then_notify, complete writes _metadata before it returns: no listing yet.
    store.patience = 0.3
    nxt = acked(h, coord)
    store.arm()
    coord.complete(nxt)
    assert store.overlapped == [False]


def test_a_failed_metadata_write_publishes_nothing_and_recovery_completes_it(h) -> None:
    store = h.store = HoldsMetadata(h.store.url)
    store.put(STAGED, b"{}\n")
    coord = h.coordinator()
    cid = acked(h, coord)
    store.fail = True
    sink = Sink(h)

    coord.complete(cid, then_notify=True)
    with pytest.raises(StorageError, match="_metadata: connection reset"):
        coord.notify(cid, commit_sinks=sink)

    assert sink.published == []  # the rows were never handed over
    view = h.coordinator().view()
    assert view.records[cid].status is CheckpointStatus.COMPLETING  # the claim decided it
    assert not view.records[cid].notified
    # The next run's recovery writes _metadata for the claim, then publishes it, once.
    store.fail = False
    store.patience = 0.0
    kafka = MemoryOffsets({TP0: 5})
    done, _ = notify_left_behind(h.coordinator(), kafka, sink)
    assert done == [cid]
    assert kafka.committed == {h.config().effective_group_id: {TP0: 5}}
    assert sink.published == [(cid.value, True)]
    view = h.coordinator().view()
    assert view.records[cid].status is CheckpointStatus.COMPLETED and view.records[cid].notified
    assert view.metadata(cid).attempt == 2


def test_metadata_another_writer_finished_first_is_the_one_notify_uses(h) -> None:
    store = h.store = HoldsMetadata(h.store.url, patience=0.0)
    store.put(STAGED, b"{}\n")
    coord = h.coordinator()
    cid = acked(h, coord)
    other = h.coordinator()

    # Another process's recovery finishes the claim while ours is on its way.
    def finish() -> None:
        store.before = None
        h.t[0] += 1  # a second later
        other.finish_completing()

    store.before = finish
    sink = Sink(h)

    mine = coord.complete(cid, then_notify=True)
    coord.notify(cid, commit_sinks=sink)

    stored = h.coordinator().view().metadata(cid)
    assert stored.writer == mine.writer == coord.token  # finished on behalf of the claim
    assert stored != mine  # built by the other process, at its own time
    assert sink.published == [(cid.value, True)]
    view = coord.view()
    assert view.metadata(cid) == stored  # this coordinator's views see the stored one
    assert view.metadata_sha256(cid) == h.coordinator().view().metadata_sha256(cid)


def test_on_acked_runs_after_the_completion_s_listing_just_before_its_claim(h) -> None:
    store = h.store = Recording(h.store.url)
    coord = h.coordinator()
    cid = coord.trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    record_ack(store, h.layout, cid, Ack(tasks(1)[0], plan.attempt, (), {}, 5))
    called: list[int] = []

    # Not every task acked: no claim, and nothing to prepare for.
    with pytest.raises(AcksMissing):
        coord.complete(cid, on_acked=lambda: called.append(len(store.log)))
    assert called == []

    record_ack(store, h.layout, cid, Ack(tasks(1)[1], plan.attempt, (), {}, 5))
    store.log.clear()
    coord.complete(cid, on_acked=lambda: called.append(len(store.log)))
    # After the listing, with nothing sent between it and the claim.
    (at,) = called
    assert store.log[at - 1][0] == "LIST" or "/acks/" in store.log[at - 1][1]
    assert store.log[at] == ("PUT_IF_ABSENT", h.layout.outcome(cid))
