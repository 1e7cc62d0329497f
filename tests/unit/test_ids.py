"""Value types for protocol ids: validation and parse/str round trips."""

from __future__ import annotations

import dataclasses

import pytest

from microcheckpoint.ids import CheckpointId, KeyGroup, OperatorUid, TaskId, TopicPartition

# ---- CheckpointId -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, True, False, "1", 1.0, None])
def test_checkpoint_id_refuses(bad: object) -> None:
    with pytest.raises(ValueError) as caught:
        CheckpointId(bad)  # type: ignore[arg-type]
    assert str(caught.value) == f"checkpoint id must be an integer >= 1, got {bad!r}"


@pytest.mark.parametrize(
    ("value", "dirname"),
    [(1, "chk-0000000001"), (42, "chk-0000000042"), (9_999_999_999, "chk-9999999999")],
)
def test_checkpoint_id_dirname_round_trip(value: int, dirname: str) -> None:
    cid = CheckpointId(value)
    assert cid.dirname == dirname
    assert CheckpointId.parse_dirname(dirname) == cid
    assert str(cid) == str(value)


@pytest.mark.parametrize(
    "name", ["chk-1", "chk-00000000001", "chk-000000000x", "_restore", "savepoints", "chk-"]
)
def test_parse_dirname_other_names(name: str) -> None:
    assert CheckpointId.parse_dirname(name) is None


def test_parse_dirname_of_zero_is_refused() -> None:
    with pytest.raises(ValueError):
        CheckpointId.parse_dirname("chk-0000000000")


def test_checkpoint_id_order_and_next() -> None:
    ids = [CheckpointId(10), CheckpointId(2), CheckpointId(9)]
    assert sorted(ids) == [CheckpointId(2), CheckpointId(9), CheckpointId(10)]
    assert CheckpointId(9).next() == CheckpointId(10)
    assert sorted(i.dirname for i in ids) == [
        "chk-0000000002",
        "chk-0000000009",
        "chk-0000000010",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ids[0].value = 3  # type: ignore[misc]


# ---- TopicPartition ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "topic", "partition"),
    [("events:0", "events", 0), ("my.topic-1_x:12", "my.topic-1_x", 12), ("a:007", "a", 7)],
)
def test_topic_partition_parse(text: str, topic: str, partition: int) -> None:
    tp = TopicPartition.parse(text)
    assert tp == TopicPartition(topic, partition)
    assert TopicPartition.parse(str(tp)) == tp
    assert str(tp) == f"{topic}:{partition}"


@pytest.mark.parametrize("text", ["events", "events:", "events:-1", "events:x", "events:1.0"])
def test_topic_partition_parse_refuses_shape(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        TopicPartition.parse(text)
    assert str(caught.value) == f"expected 'topic:partition', got {text!r}"


@pytest.mark.parametrize("text", [":1", "a b:1", "a:b:3", "x" * 250 + ":0"])
def test_topic_partition_parse_refuses_topic(text: str) -> None:
    with pytest.raises(ValueError, match="is not a valid Kafka topic name"):
        TopicPartition.parse(text)


def test_topic_partition_validation() -> None:
    assert TopicPartition("x" * 249, 0).topic == "x" * 249
    with pytest.raises(ValueError) as caught:
        TopicPartition("events", -1)
    assert str(caught.value) == "partition of 'events' must be >= 0, got -1"
    with pytest.raises(ValueError):
        TopicPartition("events", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TopicPartition("events", "1")  # type: ignore[arg-type]


def test_topic_partition_order() -> None:
    tps = [TopicPartition("b", 0), TopicPartition("a", 10), TopicPartition("a", 2)]
    assert sorted(tps) == [TopicPartition("a", 2), TopicPartition("a", 10), TopicPartition("b", 0)]


def test_topic_partition_refuses_bool_partition() -> None:
    with pytest.raises(ValueError):
        TopicPartition("events", True)


@pytest.mark.parametrize("topic", [".", ".."])
def test_topic_partition_refuses_dot_names(topic: str) -> None:
    with pytest.raises(ValueError):
        TopicPartition(topic, 0)


# ---- OperatorUid, KeyGroup, TaskId ------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a#b", "a b", "a/b", "x" * 129, 5])
def test_operator_uid_refuses(bad: object) -> None:
    with pytest.raises(ValueError) as caught:
        OperatorUid(bad)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"operator uid {bad!r} must be 1-128 characters of A-Z a-z 0-9 . _ -"
    )


def test_operator_uid_accepts() -> None:
    assert str(OperatorUid("x" * 128)) == "x" * 128
    assert str(OperatorUid("agg.v2-by_key")) == "agg.v2-by_key"


def test_key_group() -> None:
    assert KeyGroup(0).index == 0
    assert sorted([KeyGroup(5), KeyGroup(1)]) == [KeyGroup(1), KeyGroup(5)]
    with pytest.raises(ValueError) as caught:
        KeyGroup(-1)
    assert str(caught.value) == "key group must be >= 0, got -1"
    with pytest.raises(ValueError):
        KeyGroup("3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "uid", "subtask"),
    [("src#0", "src", 0), ("agg.v2-by_key#17", "agg.v2-by_key", 17)],
)
def test_task_id_round_trip(text: str, uid: str, subtask: int) -> None:
    task = TaskId.parse(text)
    assert task == TaskId(OperatorUid(uid), subtask)
    assert task == TaskId.of(uid, subtask)
    assert str(task) == text
    assert TaskId.parse(str(task)) == task


@pytest.mark.parametrize("text", ["src", "src#", "src#-1", "src#x"])
def test_task_id_parse_refuses_shape(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        TaskId.parse(text)
    assert str(caught.value) == f"expected 'uid#subtask', got {text!r}"


def test_task_id_validation() -> None:
    with pytest.raises(ValueError, match="operator uid ''"):
        TaskId.parse("#1")
    with pytest.raises(ValueError) as caught:
        TaskId.of("src", -1)
    assert str(caught.value) == "subtask index of src must be >= 0, got -1"
    assert sorted([TaskId.of("b", 0), TaskId.of("a", 3), TaskId.of("a", 1)]) == [
        TaskId.of("a", 1),
        TaskId.of("a", 3),
        TaskId.of("b", 0),
    ]
