"""PendingCheckpoint: the ack bookkeeping between trigger and the global ack."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.pending import AckResult, PendingCheckpoint
from microcheckpoint.protocol.records import Ack
from microcheckpoint.state.handles import StateHandle

SRC0 = TaskId.of("source", 0)
SRC1 = TaskId.of("source", 1)
SINK = TaskId.of("sink", 0)
STRANGER = TaskId.of("other", 0)


def pending(attempt: int = 1) -> PendingCheckpoint:
    return PendingCheckpoint(CheckpointId(3), 10_000, frozenset({SRC0, SRC1, SINK}), attempt)


def ack(task: TaskId, attempt: int = 1, key: str = "") -> Ack:
    handles = (StateHandle(key or f"state/{task}", 10, (1, 2)),)
    return Ack(task, attempt, handles, {"events:0": 5}, 7)


def test_success_then_duplicate() -> None:
    p = pending()
    first = ack(SRC0, key="first")
    assert p.acknowledge(first) is AckResult.SUCCESS
    assert p.acknowledge(ack(SRC0, key="second")) is AckResult.DUPLICATE
    assert p.acks == {SRC0: first}
    assert p.missing == frozenset({SRC1, SINK})
    assert p.fully_acknowledged is False


def test_unknown_task_and_future_attempt() -> None:
    p = pending(attempt=2)
    assert p.acknowledge(ack(STRANGER, 2)) is AckResult.UNKNOWN
    assert p.acknowledge(ack(SRC0, 3)) is AckResult.UNKNOWN
    assert p.acks == {}
    assert p.missing == frozenset({SRC0, SRC1, SINK})


def test_discarded_older_attempt_and_disposed() -> None:
    p = pending(attempt=2)
    assert p.acknowledge(ack(SRC0, 1)) is AckResult.DISCARDED
    # An old attempt is discarded before the task is even looked at.
    assert p.acknowledge(ack(STRANGER, 1)) is AckResult.DISCARDED
    assert p.acknowledge(ack(SRC0, 2)) is AckResult.SUCCESS
    p.disposed = True
    assert p.acknowledge(ack(SRC1, 2)) is AckResult.DISCARDED
    assert p.acknowledge(ack(STRANGER, 2)) is AckResult.DISCARDED
    assert set(p.acks) == {SRC0}


def test_fully_acknowledged() -> None:
    p = pending()
    for task in (SRC0, SRC1, SINK):
        assert p.fully_acknowledged is False
        assert p.acknowledge(ack(task)) is AckResult.SUCCESS
    assert p.missing == frozenset()
    assert p.fully_acknowledged is True
    p.disposed = True
    assert p.fully_acknowledged is False


def test_no_expected_tasks_is_acknowledged() -> None:
    p = PendingCheckpoint(CheckpointId(1), 0, frozenset())
    assert p.missing == frozenset()
    assert p.fully_acknowledged is True


def test_begin_attempt_clears_acks() -> None:
    p = pending()
    p.acknowledge(ack(SRC0))
    p.acknowledge(ack(SINK))
    p.begin_attempt(1)  # same attempt: nothing changes
    assert set(p.acks) == {SRC0, SINK}
    p.begin_attempt(2)
    assert p.attempt == 2
    assert p.acks == {}
    assert p.missing == frozenset({SRC0, SRC1, SINK})
    assert p.acknowledge(ack(SRC0, 1)) is AckResult.DISCARDED
    assert p.acknowledge(ack(SRC0, 2)) is AckResult.SUCCESS
    p.begin_attempt(1)  # going back is ignored
    assert p.attempt == 2
    assert set(p.acks) == {SRC0}


@pytest.mark.parametrize(
    ("now_ms", "expired"),
    [(10_000, False), (69_999, False), (70_000, False), (70_001, True), (999_999, True)],
)
def test_is_expired_boundary(now_ms: int, expired: bool) -> None:
    # Triggered at 10 000 ms with a 60 s timeout: expired strictly after 70 000 ms.
    assert pending().is_expired(now_ms, 60_000) is expired


def test_replay_keeps_first_of_duplicates_in_task_order() -> None:
    p = pending()
    p.replay([ack(SINK), ack(SRC1, 0), ack(SRC0), ack(STRANGER)])
    assert set(p.acks) == {SINK, SRC0}
    assert p.missing == frozenset({SRC1})


def test_ack_json_round_trip() -> None:
    original = Ack(SRC1, 4, (StateHandle("a/b", 3, (0, 7)), StateHandle("c", 0)), {"t:1": 9}, 12)
    data = original.to_json()
    assert data == {
        "task": "source#1",
        "attempt": 4,
        "handles": [{"key": "a/b", "size": 3, "key_groups": [0, 7]}, {"key": "c", "size": 0}],
        "operator_state": {"t:1": 9},
        "duration_ms": 12,
    }
    assert Ack.from_json(data) == original
    assert original.size == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"attempt": 1},
        {"task": "nohash", "attempt": 1},
        {"task": "s#0"},
        {"task": "s#0", "attempt": "x"},
    ],
)
def test_ack_from_json_malformed(bad: dict) -> None:
    with pytest.raises(MetadataFormatError, match=r"^ack is malformed: "):
        Ack.from_json(bad)
