"""The storage requests of the protocol's steps, counted on a store that logs them.

What an S3 bill and an epoch's latency grow with: an ack is one put-if-absent and reads
nothing, and the LISTs of an epoch do not grow with its subtasks (docs/operations.md, "The
S3 request budget", has the same counts measured on SeaweedFS through the bench).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.records import Ack
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
    # trigger and again for retention (what it keeps).
    assert {key: n for key, n in gets.items() if n > 1} == {h.layout.restore: 2}
    written = {key for op, key in store.log if op == "PUT_IF_ABSENT" and "/acks/" not in key}
    assert written & set(gets) == set()
    # The trigger's listing after writing _pending serves the plan: 5 listings (start, the
    # trigger's race check, complete, notify, retention).
    assert plan.attempt == 2
    assert store.kinds()["LIST"] == 5
