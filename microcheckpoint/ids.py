"""Value types for protocol ids, so a partition number is never passed where an offset belongs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from microcheckpoint.errors import InvalidValue

__all__ = ["CheckpointId", "KeyGroup", "OperatorUid", "TaskId", "TopicPartition"]

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_UID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, order=True)
class CheckpointId:
    """Checkpoint (epoch) number; the first checkpoint of a pipeline is 1."""

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool) or self.value < 1:
            raise InvalidValue(f"checkpoint id must be an integer >= 1, got {self.value!r}")

    @property
    def dirname(self) -> str:
        """Folder name under the pipeline root, zero-padded so listings sort numerically."""
        return f"chk-{self.value:010d}"

    @classmethod
    def parse_dirname(cls, name: str) -> CheckpointId | None:
        """The id of a ``chk-…`` folder name, or None for any other name."""
        match = re.fullmatch(r"chk-(\d{10})", name)
        return cls(int(match.group(1))) if match else None

    def next(self) -> CheckpointId:
        return CheckpointId(self.value + 1)

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, order=True)
class TopicPartition:
    """A Kafka topic partition; ``str()`` gives ``topic:partition``, the JSON key form."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        if (
            not isinstance(self.topic, str)
            or not _TOPIC.match(self.topic)
            or self.topic in (".", "..")
        ):
            raise InvalidValue(
                f"topic name {self.topic!r} is not a valid Kafka topic name "
                "(1-249 characters of A-Z a-z 0-9 . _ -, not '.' or '..')"
            )
        if not _is_index(self.partition):
            raise InvalidValue(f"partition of {self.topic!r} must be >= 0, got {self.partition!r}")

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        topic, sep, partition = text.rpartition(":")
        if not sep or not partition.isdigit():
            raise InvalidValue(f"expected 'topic:partition', got {text!r}")
        return cls(topic, int(partition))


@dataclass(frozen=True, order=True)
class OperatorUid:
    """Stable operator id; state is matched to operators by uid on restore."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _UID.match(self.value):
            raise InvalidValue(
                f"operator uid {self.value!r} must be 1-128 characters of A-Z a-z 0-9 . _ -"
            )

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class KeyGroup:
    """Key group index in ``[0, max_parallelism)``."""

    index: int

    def __post_init__(self) -> None:
        if not _is_index(self.index):
            raise InvalidValue(f"key group must be >= 0, got {self.index!r}")


@dataclass(frozen=True, order=True)
class TaskId:
    """One operator subtask that must acknowledge a checkpoint: ``uid#subtask``."""

    uid: OperatorUid
    subtask: int

    def __post_init__(self) -> None:
        if not _is_index(self.subtask):
            raise InvalidValue(f"subtask index of {self.uid} must be >= 0, got {self.subtask!r}")

    def __str__(self) -> str:
        return f"{self.uid}#{self.subtask}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        uid, sep, subtask = text.rpartition("#")
        if not sep or not subtask.isdigit():
            raise InvalidValue(f"expected 'uid#subtask', got {text!r}")
        return cls(OperatorUid(uid), int(subtask))

    @classmethod
    def of(cls, uid: str, subtask: int) -> TaskId:
        return cls(OperatorUid(uid), subtask)
