"""Replayability: are the offsets a restore would start from still in Kafka?

A retained checkpoint or a savepoint restores by reading each Kafka partition from its
offsets (``CheckpointMetadata.offsets``, the barrier ends). Kafka's retention deletes old
records regardless of who still needs them, so a point is in danger when

- ``lost``: its offset is below the partition's log start (the records were deleted: a
  restore from it would silently skip them), or
- ``soon``: the record at its offset passes the topic's ``retention.ms`` within the
  horizon (default ``DEFAULT_HORIZON_MS``, 24 hours), so Kafka may delete it by then.

The estimate is the record's timestamp plus ``retention.ms``. Kafka deletes a whole segment
once its newest record is older than ``retention.ms``, so real deletion happens at or after
the estimate: a warning is early, never late (for timestamps that do not run ahead of the
broker's clock). A topic whose ``retention.ms`` the broker does not report is assumed to
have Kafka's default (``KAFKA_DEFAULT_RETENTION_MS``, 7 days), and the message says so.
A negative ``retention.ms`` (``-1``) means unlimited: never ``soon``.

This module decides only; reading Kafka is the adapter's job
(``microcheckpoint.adapters.kafka_replay``). Only Kafka partitions are considered: file
sources (partitions of topic ``files.<uid>``, see ``engine.api.FileSource``) keep their
input, so their topics (``FILE_SOURCE_PREFIXES``) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from microcheckpoint.errors import MicrocheckpointError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import read_point_metadata
from microcheckpoint.protocol.savepoints import list_savepoints
from microcheckpoint.protocol.view import scan
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "DEFAULT_HORIZON_MS",
    "FILE_SOURCE_PREFIXES",
    "KAFKA_DEFAULT_RETENTION_MS",
    "ReplayPoint",
    "ReplayWarning",
    "Severity",
    "endangered",
    "kafka_positions",
    "retained_points",
]

DEFAULT_HORIZON_MS = 24 * 3600 * 1000
"""Warn when a point's first record to replay is deleted within this many ms (24 hours)."""

KAFKA_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
"""Apache Kafka's default ``retention.ms`` (7 days), assumed when the broker reports none."""

FILE_SOURCE_PREFIXES = ("files.", "file:")
"""Topic names of file sources' partitions, which are not in Kafka."""

Position = tuple[TopicPartition, int]


class Severity(Enum):
    """How endangered a point's offset is."""

    LOST = "lost"  # below the log start: already deleted
    SOON = "soon"  # the record at it passes retention.ms within the horizon


@dataclass(frozen=True)
class ReplayPoint:
    """A point a restore can start from: a completed checkpoint or a savepoint.

    ``ident`` is the checkpoint id (an int) or the savepoint's folder URL (a str).
    """

    kind: str  # "checkpoint" or "savepoint"
    ident: int | str
    offsets: Mapping[TopicPartition, int]

    @property
    def label(self) -> str:
        """``checkpoint 7`` or ``savepoint <URL>``: how messages name the point."""
        return f"{self.kind} {self.ident}"

    def kafka_offsets(self) -> dict[TopicPartition, int]:
        """The offsets of Kafka partitions only (file sources are left out)."""
        return {
            tp: o for tp, o in self.offsets.items() if not tp.topic.startswith(FILE_SOURCE_PREFIXES)
        }


@dataclass(frozen=True)
class ReplayWarning:
    """One endangered (point, partition): the offset a restore would read from is gone or
    goes soon. ``deleted_at_ms`` is the estimated deletion time (None when ``lost``)."""

    point: ReplayPoint
    partition: TopicPartition
    offset: int
    log_start: int
    severity: Severity
    record_time_ms: int | None = None
    retention_ms: int | None = None
    retention_assumed: bool = False
    deleted_at_ms: int | None = None
    now_ms: int = 0
    horizon_ms: int = DEFAULT_HORIZON_MS

    @property
    def message(self) -> str:
        """One sentence for people: the point, the partition, the offsets and the fix."""
        where = f"{self.point.label}: offset {self.offset} of {self.partition}"
        if self.severity is Severity.LOST:
            return (
                f"{where} is below the log start {self.log_start}: Kafka already deleted "
                f"records {self.offset}..{self.log_start - 1}, so a restore from it would skip "
                "them; restore from a newer checkpoint, or take a savepoint now to replace it"
            )
        assumed = (
            " (not reported by the broker: Kafka's default assumed)"
            if self.retention_assumed
            else ""
        )
        deleted_at = self.deleted_at_ms or 0
        when = (
            f"passed retention.ms={self.retention_ms} ({_duration(self.retention_ms or 0)})"
            f"{assumed} at {_utc(deleted_at)} and Kafka may delete it at any moment"
            if deleted_at <= self.now_ms
            else f"passes retention.ms={self.retention_ms} ({_duration(self.retention_ms or 0)})"
            f"{assumed} at {_utc(deleted_at)}, within the {_duration(self.horizon_ms)} horizon"
        )
        return (
            f"{where} (log start {self.log_start}; record time {_utc(self.record_time_ms or 0)}) "
            f"{when}; take a savepoint now, restore from a newer checkpoint, or raise "
            f"retention.ms of topic {self.partition.topic!r}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``point`` (checkpoint id or savepoint URL), ``kind``, ``partition``
        (``topic:p``), ``offset``, ``log_start``, ``record_time_ms``, ``retention_ms``,
        ``retention_assumed``, ``deleted_at_ms``, ``severity`` and ``message``."""
        return {
            "point": self.point.ident,
            "kind": self.point.kind,
            "partition": str(self.partition),
            "offset": self.offset,
            "log_start": self.log_start,
            "record_time_ms": self.record_time_ms,
            "retention_ms": self.retention_ms,
            "retention_assumed": self.retention_assumed,
            "deleted_at_ms": self.deleted_at_ms,
            "severity": self.severity.value,
            "message": self.message,
        }


def retained_points(store: ObjectStore, pipeline: str) -> list[ReplayPoint]:
    """Every retained completed checkpoint (oldest first), then every savepoint in the
    pipeline's ``savepoints/`` folder (oldest first).

    A point whose ``_metadata`` cannot be read is left out: it cannot be restored at all
    (``microcheckpoint verify`` says why). Savepoints written to other folders are not
    found here.
    """
    points = []
    view = scan(store, Layout(pipeline))
    for cid in view.completed:
        try:
            points.append(ReplayPoint("checkpoint", cid.value, view.metadata(cid).offsets))
        except MicrocheckpointError:
            continue
    for prefix in list_savepoints(store, pipeline):
        try:
            meta = read_point_metadata(store, prefix)
        except MicrocheckpointError:
            continue
        points.append(ReplayPoint("savepoint", store.child_url(prefix.rstrip("/")), meta.offsets))
    return points


def kafka_positions(points: Iterable[ReplayPoint]) -> set[Position]:
    """The distinct (Kafka partition, offset) pairs the points would replay from."""
    return {(tp, o) for point in points for tp, o in point.kafka_offsets().items()}


def endangered(
    points: Sequence[ReplayPoint],
    log_starts: Mapping[TopicPartition, int],
    record_times: Mapping[Position, int | None],
    retention_ms: Mapping[str, int | None],
    now_ms: int,
    horizon_ms: int = DEFAULT_HORIZON_MS,
) -> list[ReplayWarning]:
    """The warnings for ``points``, in point order, then partition order.

    Args:
        points: what a restore could start from.
        log_starts: the first offset still in each partition (every Kafka partition of
            ``points`` must be present).
        record_times: the timestamp of the record at each (partition, offset); None or
            absent when there is no record there yet (the offset is the log end): nothing
            to lose.
        retention_ms: each topic's ``retention.ms``; None or absent when the broker does not
            report it (``KAFKA_DEFAULT_RETENTION_MS`` is assumed); negative for unlimited.
        now_ms: the current time, ms since the epoch.
        horizon_ms: how far ahead ``soon`` looks (>= 0).

    Returns:
        ``lost`` when the offset is below the log start; ``soon`` when the record's
        estimated deletion time (timestamp + retention.ms) is at or before
        ``now_ms + horizon_ms``. Nothing for offsets that are safe.
    """
    if horizon_ms < 0:
        raise ValueError(f"horizon_ms={horizon_ms} is negative; pass a duration >= 0")
    warnings = []
    for point in points:
        for tp, offset in sorted(point.kafka_offsets().items(), key=_partition_order):
            start = log_starts[tp]
            if offset < start:
                warnings.append(
                    ReplayWarning(point, tp, offset, start, Severity.LOST, now_ms=now_ms)
                )
                continue
            record_time = record_times.get((tp, offset))
            if record_time is None:
                continue
            reported = retention_ms.get(tp.topic)
            retention = KAFKA_DEFAULT_RETENTION_MS if reported is None else reported
            if retention < 0:
                continue
            deleted_at = record_time + retention
            if deleted_at <= now_ms + horizon_ms:
                warnings.append(
                    ReplayWarning(
                        point,
                        tp,
                        offset,
                        start,
                        severity=Severity.SOON,
                        record_time_ms=record_time,
                        retention_ms=retention,
                        retention_assumed=reported is None,
                        deleted_at_ms=deleted_at,
                        now_ms=now_ms,
                        horizon_ms=horizon_ms,
                    )
                )
    return warnings


def _partition_order(item: tuple[TopicPartition, int]) -> tuple[str, int]:
    return item[0].topic, item[0].partition


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(ms: int) -> str:
    """``7 d``, ``24 h``, ``90 s``: the largest whole unit (days from 2 on), else ms."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms and ms % size == 0 and (unit != "d" or ms >= 2 * size):
            return f"{ms // size} {unit}"
    return f"{ms} ms"
