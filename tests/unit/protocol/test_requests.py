"""The storage requests of the protocol's steps, counted on a store that logs them.

What an S3 bill and an epoch's latency grow with: an ack is one put-if-absent and reads
nothing, and the LISTs of an epoch do not grow with its subtasks (docs/operations.md, "The
S3 request budget", has the same counts measured on SeaweedFS through the bench).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from microcheckpoint.errors import (
    CheckpointNotFound,
    MetadataFormatError,
    StorageError,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.records import Ack, PendingRecord, read
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import StoredObject, WriteOutcome
from tests.unit.conftest import TP0

C1 = CheckpointId(1)


class Recording(FileStore):
    """A file store that logs ``(operation, key)`` of every request."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.log: list[tuple[str, str]] = []

    def get(self, key: str) -> StoredObject | None:
        self.log.append(("GET", key))
        return super().get(key)

    def put(self, key: str, data: bytes) -> None:
        self.log.append(("PUT", key))
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        self.log.append(("PUT_IF_ABSENT", key))
        return super().put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.log.append(("DELETE", key))
        super().delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        self.log.append(("LIST", prefix))
        return super().list(prefix)

    def kinds(self) -> Counter[str]:
        return Counter(op for op, _ in self.log)


def recording(h) -> Recording:
    h.store = Recording(h.store.url)
    return h.store


def tasks(n: int) -> list[TaskId]:
    return [TaskId.of("source", 0), *(TaskId.of("agg", i) for i in range(n))]


def test_an_ack_is_one_put_if_absent_and_reads_nothing(h) -> None:
    store = recording(h)
    coord = h.coordinator()
    cid = coord.trigger(tasks(2), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    store.log.clear()

    ack = Ack(TaskId.of("agg", 1), 1, (), {}, 5)
    record_ack(store, h.layout, cid, ack)

    assert store.log == [("PUT_IF_ABSENT", h.layout.ack(cid, 1, ack.task))]


def test_a_late_ack_in_a_decided_checkpoint_is_deleted_by_retention(h) -> None:
    coord = h.coordinator(retained=2)
    first = h.epoch(coord, {TP0: 5}).checkpoint_id
    # A zombie of an older attempt acks after checkpoint 1 completed and was notified.
    late = Ack(TaskId.of("agg", 0), 1, (), {}, 5)
    record_ack(h.store, h.layout, first, late)
    key = h.layout.ack(first, 1, late.task)
    assert h.store.exists(key)
    assert coord.view().records[first].status is CheckpointStatus.COMPLETED

    h.epoch(coord, {TP0: 9})  # the next notify's retention runs

    assert not h.store.exists(key)
    assert coord.view().records[first].status is CheckpointStatus.COMPLETED


def second_epoch_logged(h, subtasks: int):
    """Two epochs (trigger, an ack per task, complete, notify); the recording store, its log
    holding the second epoch's requests (it has a previous checkpoint), and that epoch's
    plan."""
    store = recording(h)
    coord = h.coordinator()
    expected = tasks(subtasks)
    for end in (5, 9):
        store.log.clear()
        cid = coord.trigger(expected, {TP0: end}, h.startup({TP0: 0})).checkpoint_id
        plan = coord.plan(cid)
        for task in expected:
            record_ack(store, h.layout, cid, Ack(task, plan.attempt, (), {}, 5))
        coord.complete(cid)
        coord.notify(cid)
    return store, plan


def lists_of_an_epoch(h, subtasks: int) -> int:
    """The LISTs of one epoch after a first."""
    store, _ = second_epoch_logged(h, subtasks)
    return store.kinds()["LIST"]


def test_the_lists_of_an_epoch_do_not_grow_with_its_subtasks(h, tmp_path) -> None:
    two = lists_of_an_epoch(h, 2)
    h.store = FileStore((tmp_path / "other").as_uri())
    assert lists_of_an_epoch(h, 16) == two


def test_an_epoch_reads_each_record_once_and_nothing_it_wrote(h) -> None:
    store, plan = second_epoch_logged(h, 3)
    gets = Counter(key for op, key in store.log if op == "GET")
    # Write-once records once; the restore marker, which a restore replaces, fresh for the
    # trigger and again for notify's retention (what it keeps).
    assert {key: n for key, n in gets.items() if n > 1} == {h.layout.restore: 2}
    written = {key for op, key in store.log if op == "PUT_IF_ABSENT" and "/acks/" not in key}
    assert written & set(gets) == set()
    # The trigger's view, with the _pending it wrote, serves the plan, and notify's listing
    # serves retention: 3 listings (start, complete, notify).
    assert plan.attempt == 2
    assert store.kinds()["LIST"] == 3


class ListsWhile(Recording):
    """A recording store whose listings wait (``patience``, 5 s) for a GET of a key containing
    ``needle`` to begin, and note whether one did: a step that sends those reads only
    after its listing returns makes ``overlapped`` False."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.needle: str | None = None
        self.began = threading.Event()
        self.overlapped: list[bool] = []
        self.patience = 5.0

    def get(self, key: str) -> StoredObject | None:
        if self.needle is not None and self.needle in key:
            self.began.set()
        return super().get(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        if self.needle is not None:
            self.overlapped.append(self.began.wait(self.patience))
        return super().list(prefix)

    def expect(self, needle: str) -> None:
        self.log.clear()
        self.overlapped.clear()
        self.began.clear()
        self.needle = needle


def test_completion_reads_the_acks_of_its_attempt_while_it_lists(h) -> None:
    store = h.store = ListsWhile(h.store.url)
    coord = h.coordinator()
    cid = coord.trigger(tasks(2), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    for task in tasks(2):
        record_ack(store, h.layout, cid, Ack(task, plan.attempt, (), {}, 5))
    store.expect("/acks/")
    coord.complete(cid)
    # One listing, during which every ack was read, and no ack read again after it.
    assert store.overlapped == [True]
    acks = [key for op, key in store.log if op == "GET" and "/acks/" in key]
    assert sorted(acks) == sorted(h.layout.ack(cid, plan.attempt, t) for t in tasks(2))


def _completed(h, coord, store, end: int) -> CheckpointId:
    cid = coord.trigger(tasks(1), {TP0: end}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    for task in tasks(1):
        record_ack(store, h.layout, cid, Ack(task, plan.attempt, (), {}, 5))
    coord.complete(cid)
    return cid


def test_notify_lists_with_the_read_of_restore_and_retention_lists_no_more(h) -> None:
    store = h.store = ListsWhile(h.store.url)
    coord = h.coordinator(retained=1)
    for end in (5, 9):
        cid = _completed(h, coord, store, end)
        store.expect("_restore")
        coord.notify(cid)
        assert store.overlapped == [True]
        assert store.kinds()["LIST"] == 1
    # Retention on notify's listing dropped checkpoint 1 whole, its _notified included.
    assert [k for k in store.list(h.layout.root) if "chk-0000000001" in k] == []


def test_notify_lists_while_the_sinks_publish_what_it_completed(h) -> None:
    store = h.store = ListsWhile(h.store.url)
    coord = h.coordinator()
    cid = _completed(h, coord, store, 5)
    store.expect("staged-part")
    published: list[int] = []

    def publish(meta) -> None:
        published.append(meta.checkpoint_id.value)
        h.store.get("pipe/sink/staged-part")  # what a sink reads first

    coord.notify(cid, commit_sinks=publish)
    assert published == [cid.value]
    assert store.overlapped == [True]
    # A coordinator that did not complete the checkpoint lists first, then publishes.
    other = h.store = ListsWhile(h.store.url)
    other.patience = 0.3
    other.expect("staged-part")
    h.coordinator().notify(cid, commit_sinks=publish)
    assert published == [cid.value] * 2
    assert other.overlapped == [False]


class FailsOnce(Recording):
    """A recording store whose first GET of each key containing ``needle`` fails."""

    def __init__(self, url: str, needle: str) -> None:
        super().__init__(url)
        self.needle = needle
        self.failed: set[str] = set()

    def get(self, key: str) -> StoredObject | None:
        if self.needle in key and key not in self.failed:
            self.failed.add(key)
            raise StorageError(f"GET {key}: connection reset")
        return super().get(key)


def test_an_ack_read_ahead_that_fails_is_read_again_by_the_completion(h) -> None:
    coord = h.coordinator()
    cid = coord.trigger(tasks(2), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    for task in tasks(2):
        record_ack(h.store, h.layout, cid, Ack(task, plan.attempt, (), {}, 5))
    store = h.store = coord.store = FailsOnce(h.store.url, "/acks/")
    meta = coord.complete(cid)
    assert meta.attempt == plan.attempt and set(meta.acks) == set(tasks(2))
    # Every ack failed once (read ahead) and was read again, once, after the listing.
    assert len(store.failed) == 3
    reads = Counter(key for op, key in store.log if op == "GET" and "/acks/" in key)
    assert reads == Counter(store.failed)


def test_notify_of_a_checkpoint_another_run_dropped_says_so(h) -> None:
    ours = h.coordinator(retained=1)
    cid = _completed(h, ours, h.store, 5)
    other = h.coordinator(retained=1)
    newer = _completed(h, other, h.store, 9)
    other.notify(newer)  # its retention drops checkpoint 1, staged output included

    def publish(meta) -> None:
        raise MetadataFormatError(f"staged output of epoch {meta.checkpoint_id} is missing")

    with pytest.raises(CheckpointNotFound, match=f"checkpoint {cid} .* is not completed"):
        ours.notify(cid, commit_sinks=publish)


class DeletesWhile(Recording):
    """A recording store that sets ``deleted`` when a key containing ``needle`` is deleted,
    and can fail every DELETE (``fail_deletes``)."""

    def __init__(self, url: str, needle: str) -> None:
        super().__init__(url)
        self.needle = needle
        self.deleted = threading.Event()
        self.fail_deletes = False

    def delete(self, key: str) -> None:
        if self.fail_deletes:
            raise StorageError(f"DELETE {key}: connection reset")
        super().delete(key)
        if self.needle in key:
            self.deleted.set()


def test_retention_deletes_while_the_sinks_publish(h) -> None:
    coord = h.coordinator(retained=1)
    first = _completed(h, coord, h.store, 5)
    coord.notify(first)
    store = h.store = coord.store = DeletesWhile(h.store.url, h.layout.pending(first))
    cid = _completed(h, coord, store, 9)
    seen: list[bool] = []

    def publish(meta) -> None:
        # Checkpoint 1 is dropped while the sinks publish 2, not after 2 is notified.
        seen.append(store.deleted.wait(5.0))

    store.log.clear()
    coord.notify(cid, commit_sinks=publish)
    assert seen == [True]
    assert [k for k in store.list(h.layout.root) if h.layout.chk(first) in k] == []
    assert h.coordinator().view().records[cid].notified


def test_retention_after_notified_when_a_newer_checkpoint_completed(h) -> None:
    ours = h.coordinator(retained=1)
    cid = _completed(h, ours, h.store, 5)
    _completed(h, h.coordinator(retained=1), h.store, 9)  # completed, not notified
    store = h.store = ours.store = DeletesWhile(h.store.url, h.layout.pending(cid))
    seen: list[bool] = []
    ours.notify(cid, commit_sinks=lambda meta: seen.append(store.deleted.wait(0.3)))
    # Retention may drop checkpoint 1 itself: it runs once 1 is published and notified.
    assert seen == [False]
    ops = [(op, key) for op, key in store.log if op in ("PUT", "DELETE")]
    assert ops.index(("PUT", h.layout.notified(cid))) < ops.index(("DELETE", h.layout.pending(cid)))
    assert [k for k in store.list(h.layout.root) if h.layout.chk(cid) in k] == []


def test_a_failed_retention_beside_the_sinks_is_raised_after_notified(h) -> None:
    coord = h.coordinator(retained=1)
    coord.notify(_completed(h, coord, h.store, 5))
    store = h.store = coord.store = DeletesWhile(h.store.url, "_pending")
    cid = _completed(h, coord, store, 9)
    store.fail_deletes = True
    published: list[int] = []
    with pytest.raises(StorageError, match=r"DELETE .*connection reset"):
        coord.notify(cid, commit_sinks=lambda meta: published.append(meta.checkpoint_id.value))
    assert published == [cid.value]
    assert h.coordinator().view().records[cid].notified


def test_a_failed_publish_is_raised_and_nothing_is_notified(h) -> None:
    coord = h.coordinator(retained=1)
    coord.notify(_completed(h, coord, h.store, 5))
    cid = _completed(h, coord, h.store, 9)

    def publish(meta) -> None:
        raise MetadataFormatError(f"staged output of epoch {meta.checkpoint_id} is missing")

    with pytest.raises(MetadataFormatError, match="is missing"):
        coord.notify(cid, commit_sinks=publish)
    assert not h.coordinator().view().records[cid].notified
    # Its retention ran beside it, as Flink drops subsumed checkpoints before it notifies:
    # checkpoint 2 is kept whole, and the next notify publishes it.
    published: list[int] = []
    coord.notify(cid, commit_sinks=lambda meta: published.append(meta.checkpoint_id.value))
    assert published == [cid.value] and h.coordinator().view().records[cid].notified


class DeletesAfter(Recording):
    """A recording store whose DELETEs wait (up to 5 s) for a PUT of a key containing
    ``needle``, and note whether one came."""

    def __init__(self, url: str, needle: str) -> None:
        super().__init__(url)
        self.needle = needle
        self.put_seen = threading.Event()
        self.waited: list[bool] = []

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        if self.needle in key:
            self.put_seen.set()

    def delete(self, key: str) -> None:
        self.waited.append(self.put_seen.wait(5.0))
        super().delete(key)


def test_notified_is_written_without_waiting_for_retention(h) -> None:
    coord = h.coordinator(retained=1)
    first = _completed(h, coord, h.store, 5)
    coord.notify(first)
    cid = _completed(h, coord, h.store, 9)
    store = h.store = coord.store = DeletesAfter(h.store.url, h.layout.notified(cid))
    coord.notify(cid, commit_sinks=lambda meta: None)
    # Every delete of checkpoint 1 waited for checkpoint 2's _notified, and got it.
    assert store.waited and all(store.waited)
    assert [k for k in store.list(h.layout.root) if h.layout.chk(first) in k] == []


def test_a_trigger_that_plans_begins_attempt_2_in_its_barrier(h) -> None:
    store = recording(h)
    coord = h.coordinator()
    view = coord.finish_completing()
    store.log.clear()
    cid = coord.trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0}), view=view, begin=True)
    cid = cid.checkpoint_id
    # One write of the pipeline, the barrier, which says its run began attempt 2, and no
    # listing after it (the store's put-if-absent probe aside).
    writes = [key for op, key in store.log if op.startswith("PUT") and "_probe" not in key]
    assert writes == [h.layout.pending(cid)]
    assert store.kinds()["LIST"] == 0
    assert read(store, h.layout.pending(cid), PendingRecord).begun
    store.log.clear()
    plan = coord.plan(cid)
    assert plan.attempt == 2
    assert store.log == []  # the plan read and wrote nothing
    # Every other process's view counts attempt 2 as begun: a re-run takes 3, and the
    # first run's acks stop counting.
    other = h.coordinator()
    assert other.view().records[cid].attempt == 2
    assert other.plan(cid).attempt == 3
    assert h.layout.attempt(cid, 3) in list(store.list(h.layout.chk(cid)))
    record_ack(store, h.layout, cid, Ack(tasks(1)[0], 2, (), {}, 5))
    assert other.load_pending(cid).missing == set(tasks(1))


def test_a_trigger_that_does_not_plan_leaves_attempt_2_to_its_run(h) -> None:
    store = recording(h)
    coord = h.coordinator()
    cid = coord.trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0})).checkpoint_id
    assert not read(store, h.layout.pending(cid), PendingRecord).begun
    assert not [k for op, k in store.log if op == "PUT_IF_ABSENT" and "_attempt-" in k]
    assert h.coordinator().plan(cid).attempt == 2
    assert h.layout.attempt(cid, 2) in list(store.list(h.layout.chk(cid)))


@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_a_trigger_that_lost_its_id_decides_again_on_a_new_listing(h, max_concurrent) -> None:
    store = recording(h)
    first, second = (h.coordinator(max_concurrent=max_concurrent) for _ in range(2))
    # Both list before either allocates: both decide on checkpoint 1.
    views = first.finish_completing(), second.finish_completing()
    won = first.trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0}), view=views[0]).checkpoint_id
    assert won == CheckpointId(1)
    if max_concurrent == 1:
        # Its put-if-absent of 1 failed; listing again, it sees 1 in flight and refuses,
        # leaving nothing behind (no checkpoint 2, aborted or not).
        with pytest.raises(TriggerRefused, match="1 checkpoint\\(s\\) in flight"):
            second.trigger(tasks(1), {TP0: 9}, h.startup({TP0: 0}), view=views[1])
        assert second.view().ids() == [won]
        return
    lost = second.trigger(tasks(1), {TP0: 9}, h.startup({TP0: 0}), view=views[1])
    assert lost.checkpoint_id == CheckpointId(2)
    # Decided again: checkpoint 2 continues from 1's barrier, not from nothing.
    barrier = read(store, h.layout.pending(lost.checkpoint_id), PendingRecord).barrier
    assert barrier.ranges[TP0].start == 5


class Unlisted(Recording):
    """A store whose listings leave out checkpoint 1's folder (an inconsistent listing)."""

    def list(self, prefix: str = "") -> Iterator[str]:
        return (k for k in super().list(prefix) if "/chk-0000000001/" not in k)


def test_a_store_that_does_not_list_what_it_stores_stops_the_trigger(h) -> None:
    h.coordinator().trigger(tasks(1), {TP0: 5}, h.startup({TP0: 0}))
    h.store = Unlisted(h.store.url)
    with pytest.raises(StorageError, match="chk-0000000001/_pending exists, but 3 listings"):
        h.coordinator().trigger(tasks(1), {TP0: 9}, h.startup({TP0: 0}))
