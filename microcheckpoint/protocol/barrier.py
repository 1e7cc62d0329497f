"""Barriers: the offset range every source partition processes in one epoch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import InvalidValue, KafkaSourceError, MetadataFormatError
from microcheckpoint.ids import TopicPartition

__all__ = ["Barrier", "OffsetRange", "plan_barrier"]


@dataclass(frozen=True)
class OffsetRange:
    """``[start, end)``: ``end`` is exclusive, one past the last offset of the epoch."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise InvalidValue(f"offset range [{self.start}, {self.end}) is invalid")

    @property
    def count(self) -> int:
        """Offsets in the range (records, or fewer where compaction left gaps)."""
        return self.end - self.start


@dataclass(frozen=True)
class Barrier:
    """Barrier n: per partition, the range epoch n reads. Its ends are checkpoint n's offsets."""

    ranges: Mapping[TopicPartition, OffsetRange]

    @property
    def ends(self) -> dict[TopicPartition, int]:
        return {tp: r.end for tp, r in self.ranges.items()}

    @property
    def starts(self) -> dict[TopicPartition, int]:
        return {tp: r.start for tp, r in self.ranges.items()}

    @property
    def record_count(self) -> int:
        return sum(r.count for r in self.ranges.values())

    def to_json(self) -> dict[str, Any]:
        return {str(tp): [r.start, r.end] for tp, r in sorted(self.ranges.items())}

    @classmethod
    def from_json(cls, data: Any) -> Barrier:
        try:
            return cls(
                {
                    TopicPartition.parse(k): OffsetRange(int(v[0]), int(v[1]))
                    for k, v in data.items()
                }
            )
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
            raise MetadataFormatError(f"barrier is malformed: {exc}") from exc


def plan_barrier(
    starts: Mapping[TopicPartition, int],
    high_watermarks: Mapping[TopicPartition, int],
    max_records: int | None = None,
) -> Barrier:
    """Barrier for policy ``latest``: ``end = min(high watermark, start + max_records)``.

    Args:
        starts: next offset to read per partition (the previous checkpoint's ends).
        high_watermarks: one past the last record per partition (or, for policy
            ``data_interval``, the first offset at or after the interval's end).
        max_records: cap on offsets per partition per epoch; None for no cap.

    Raises:
        KafkaSourceError: a partition's high watermark is below its start offset
            (the topic was deleted and re-created, or the log was truncated), or a
            partition in ``starts`` is missing from ``high_watermarks``.
    """
    ranges: dict[TopicPartition, OffsetRange] = {}
    for tp, start in sorted(starts.items()):
        if tp not in high_watermarks:
            raise KafkaSourceError(
                f"partition {tp} has a start offset {start} but no end offset; the topic may "
                "have lost partitions: restore from a savepoint taken with the new layout"
            )
        hw = high_watermarks[tp]
        if hw < start:
            raise KafkaSourceError(
                f"partition {tp}: end offset {hw} is below the checkpointed offset {start}; "
                "the topic was re-created or truncated. Restore from a savepoint or reset the "
                "pipeline's offsets (startup_mode) to continue"
            )
        end = hw if max_records is None else min(hw, start + max_records)
        ranges[tp] = OffsetRange(start, end)
    return Barrier(ranges)
