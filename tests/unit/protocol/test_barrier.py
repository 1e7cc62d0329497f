"""Barriers: exact per-partition ranges, their validation and their JSON form."""

from __future__ import annotations

import json

import pytest

from microcheckpoint.errors import KafkaSourceError, MetadataFormatError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.barrier import Barrier, OffsetRange, plan_barrier

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
TP2 = TopicPartition("events", 2)
OTHER = TopicPartition("audit", 0)


def test_offset_range() -> None:
    assert OffsetRange(0, 10).count == 10
    assert OffsetRange(7, 7).count == 0
    with pytest.raises(ValueError) as caught:
        OffsetRange(5, 4)
    assert str(caught.value) == "offset range [5, 4) is invalid"
    with pytest.raises(ValueError) as caught:
        OffsetRange(-1, 0)
    assert str(caught.value) == "offset range [-1, 0) is invalid"


def test_plan_without_cap_reads_to_the_high_watermark() -> None:
    barrier = plan_barrier({TP0: 5, TP1: 0}, {TP0: 12, TP1: 0, TP2: 99})
    assert dict(barrier.ranges) == {TP0: OffsetRange(5, 12), TP1: OffsetRange(0, 0)}
    assert barrier.starts == {TP0: 5, TP1: 0}
    assert barrier.ends == {TP0: 12, TP1: 0}
    assert barrier.record_count == 7


def test_plan_with_cap() -> None:
    barrier = plan_barrier({TP0: 5, TP1: 10, OTHER: 3}, {TP0: 100, TP1: 12, OTHER: 7}, 4)
    assert dict(barrier.ranges) == {
        TP0: OffsetRange(5, 9),
        TP1: OffsetRange(10, 12),
        OTHER: OffsetRange(3, 7),
    }
    assert barrier.record_count == 10


def test_plan_cap_of_one() -> None:
    barrier = plan_barrier({TP0: 0}, {TP0: 3}, 1)
    assert barrier.ends == {TP0: 1}


def test_high_watermark_below_start() -> None:
    with pytest.raises(KafkaSourceError) as caught:
        plan_barrier({TP0: 2, TP1: 7}, {TP0: 9, TP1: 3})
    message = str(caught.value)
    assert message.startswith(
        "partition events:1: end offset 3 is below the checkpointed offset 7; "
    )
    assert "Restore from a savepoint or reset the pipeline's offsets (startup_mode)" in message


def test_high_watermark_equal_to_start_is_an_empty_range() -> None:
    barrier = plan_barrier({TP0: 7}, {TP0: 7}, 10)
    assert dict(barrier.ranges) == {TP0: OffsetRange(7, 7)}
    assert barrier.record_count == 0


def test_missing_partition() -> None:
    with pytest.raises(KafkaSourceError) as caught:
        plan_barrier({TP0: 1, TP2: 4}, {TP0: 9})
    assert str(caught.value).startswith(
        "partition events:2 has a start offset 4 but no end offset; "
    )


def test_json_round_trip() -> None:
    barrier = plan_barrier({TP1: 3, TP0: 5, OTHER: 0}, {TP0: 12, TP1: 3, OTHER: 8})
    data = barrier.to_json()
    assert data == {"audit:0": [0, 8], "events:0": [5, 12], "events:1": [3, 3]}
    assert list(data) == ["audit:0", "events:0", "events:1"]
    assert Barrier.from_json(data) == barrier
    assert Barrier.from_json(json.loads(json.dumps(data))) == barrier
    assert Barrier.from_json({}) == Barrier({})


@pytest.mark.parametrize(
    "bad",
    [
        [["events:0", 0, 1]],
        "events:0",
        None,
        {"events:0": [1]},
        {"events:0": [5, 3]},
        {"events:0": [-1, 3]},
        {"nocolon": [0, 1]},
        {"events:x": [0, 1]},
        {"events:0": None},
        {"events:0": ["a", 1]},
        {"events:0": 5},
    ],
)
def test_malformed_json(bad: object) -> None:
    with pytest.raises(MetadataFormatError) as caught:
        Barrier.from_json(bad)
    assert str(caught.value).startswith("barrier is malformed: ")


def test_malformed_json_object_range() -> None:
    with pytest.raises(MetadataFormatError):
        Barrier.from_json({"events:0": {"start": 0, "end": 5}})
