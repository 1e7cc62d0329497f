"""Replayability decisions: lost below the log start, soon within the retention horizon."""

from __future__ import annotations

import pytest

from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol import replay, savepoints
from microcheckpoint.protocol.replay import (
    DEFAULT_HORIZON_MS,
    KAFKA_DEFAULT_RETENTION_MS,
    ReplayPoint,
    Severity,
    endangered,
    kafka_positions,
    retained_points,
)

HOUR = 3_600_000
DAY = 24 * HOUR
NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
TP10 = TopicPartition("events", 10)
OTHER = TopicPartition("clicks", 0)
FILES = TopicPartition("files.logs", 0)
CHK7 = ReplayPoint("checkpoint", 7, {TP0: 100, TP1: 50})
SAVE = ReplayPoint("savepoint", "s3://b/pipe/savepoints/savepoint-0000000003-abc123", {TP0: 40})


def decide(points, starts, times, retention, horizon_ms=DEFAULT_HORIZON_MS):
    return endangered(points, starts, times, retention, NOW, horizon_ms)


# ---- lost ----------------------------------------------------------------------------------


def test_an_offset_below_the_log_start_is_lost_whatever_the_retention() -> None:
    warnings = decide([CHK7], {TP0: 120, TP1: 0}, {(TP1, 50): NOW}, {"events": -1})
    assert len(warnings) == 1
    (w,) = warnings
    assert (w.severity, w.partition, w.offset, w.log_start, w.deleted_at_ms) == (
        Severity.LOST,
        TP0,
        100,
        120,
        None,
    )
    assert w.message == (
        "checkpoint 7: offset 100 of events:0 is below the log start 120: Kafka already "
        "deleted records 100..119, so a restore from it would skip them; restore from a newer "
        "checkpoint, or take a savepoint now to replace it"
    )
    assert w.to_dict() == {
        "point": 7,
        "kind": "checkpoint",
        "partition": "events:0",
        "offset": 100,
        "log_start": 120,
        "record_time_ms": None,
        "retention_ms": None,
        "retention_assumed": False,
        "deleted_at_ms": None,
        "severity": "lost",
        "message": w.message,
    }


def test_an_offset_at_the_log_start_is_not_lost() -> None:
    assert decide([CHK7], {TP0: 100, TP1: 50}, {}, {}) == []


# ---- soon ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record_time", "expected"),
    [
        (NOW - 2 * DAY + DAY, True),  # deleted exactly at the horizon's end
        (NOW - 2 * DAY + DAY + 1, False),  # one ms after it
        (NOW - 2 * DAY + 1, True),  # deleted in 1 ms
        (NOW - 2 * DAY - HOUR, True),  # past retention, Kafka has not deleted it yet
        (NOW, False),  # fresh
    ],
)
def test_soon_when_timestamp_plus_retention_is_within_the_horizon(record_time, expected) -> None:
    warnings = decide([CHK7], {TP0: 0, TP1: 0}, {(TP0, 100): record_time}, {"events": 2 * DAY})
    assert [(w.severity, w.partition) for w in warnings] == (
        [(Severity.SOON, TP0)] if expected else []
    )
    if expected:
        assert warnings[0].deleted_at_ms == record_time + 2 * DAY
        assert warnings[0].record_time_ms == record_time


def test_soon_message_names_point_partition_offsets_times_and_fix() -> None:
    (w,) = decide([SAVE], {TP0: 10}, {(TP0, 40): NOW - 2 * DAY + 3 * HOUR}, {"events": 2 * DAY})
    assert w.message == (
        "savepoint s3://b/pipe/savepoints/savepoint-0000000003-abc123: offset 40 of events:0 "
        "(log start 10; record time 2025-12-30T03:00:00Z) passes retention.ms=172800000 (2 d) "
        "at 2026-01-01T03:00:00Z, within the 24 h horizon; take a savepoint now, restore from a "
        "newer checkpoint, or raise retention.ms of topic 'events'"
    )
    assert w.to_dict()["point"] == SAVE.ident
    assert w.to_dict()["severity"] == "soon"
    assert w.to_dict()["deleted_at_ms"] == NOW + 3 * HOUR


def test_overdue_record_message_says_any_moment() -> None:
    (w,) = decide([CHK7], {TP0: 0, TP1: 0}, {(TP0, 100): NOW - 90 * 60_000}, {"events": HOUR})
    assert w.deleted_at_ms == NOW - 30 * 60_000
    assert "passed retention.ms=3600000 (1 h) at 2025-12-31T23:30:00Z and Kafka may delete it " in (
        w.message
    )
    assert w.message.startswith("checkpoint 7: offset 100 of events:0 (log start 0; ")


def test_unreported_retention_assumes_kafkas_default_and_says_so() -> None:
    old = NOW - KAFKA_DEFAULT_RETENTION_MS + HOUR
    for retention in ({}, {"events": None}):
        (w,) = decide([CHK7], {TP0: 0, TP1: 0}, {(TP0, 100): old}, retention)
        assert (w.retention_ms, w.retention_assumed) == (KAFKA_DEFAULT_RETENTION_MS, True)
        assert w.deleted_at_ms == NOW + HOUR
        assert "retention.ms=604800000 (7 d) (not reported by the broker: Kafka's default " in (
            w.message
        )


def test_unlimited_retention_is_never_soon() -> None:
    times = {(TP0, 100): 0, (TP1, 50): 0}
    assert decide([CHK7], {TP0: 0, TP1: 0}, times, {"events": -1}) == []


def test_no_record_at_the_offset_yet_is_safe() -> None:
    times = {(TP0, 100): None}  # TP1's offset absent: both are at the log end
    assert decide([CHK7], {TP0: 0, TP1: 0}, times, {"events": 1}) == []


def test_the_horizon_moves_the_line() -> None:
    times = {(TP0, 100): NOW - DAY + 5 * HOUR}
    retention = {"events": DAY}
    assert decide([CHK7], {TP0: 0, TP1: 0}, times, retention, horizon_ms=4 * HOUR) == []
    warned = decide([CHK7], {TP0: 0, TP1: 0}, times, retention, horizon_ms=5 * HOUR)
    assert [w.horizon_ms for w in warned] == [5 * HOUR]
    assert "within the 5 h horizon" in warned[0].message
    with pytest.raises(ValueError, match="horizon_ms=-1"):
        decide([CHK7], {TP0: 0, TP1: 0}, times, retention, horizon_ms=-1)


# ---- several points and partitions ---------------------------------------------------------


def test_order_is_points_then_partitions_by_number_and_topics_are_separate() -> None:
    older = ReplayPoint("checkpoint", 6, {TP10: 5, TP1: 5, OTHER: 5, FILES: 0})
    points = [older, CHK7, SAVE]
    starts = {TP0: 120, TP1: 0, TP10: 0, OTHER: 0}
    old = NOW - DAY
    times = {(TP1, 5): old, (TP10, 5): old, (OTHER, 5): old, (TP1, 50): NOW + 1}
    got = decide(points, starts, times, {"events": DAY, "clicks": 30 * DAY})
    assert [(w.point.ident, str(w.partition), w.severity.value) for w in got] == [
        (6, "events:1", "soon"),
        (6, "events:10", "soon"),
        (7, "events:0", "lost"),
        (SAVE.ident, "events:0", "lost"),
    ]


def test_file_sources_are_not_kafka() -> None:
    point = ReplayPoint("checkpoint", 1, {FILES: 3, TopicPartition("file.x", 0): 1, TP0: 2})
    assert point.kafka_offsets() == {TopicPartition("file.x", 0): 1, TP0: 2}
    assert kafka_positions([point, CHK7]) == {
        (TopicPartition("file.x", 0), 1),
        (TP0, 2),
        (TP0, 100),
        (TP1, 50),
    }
    assert decide([ReplayPoint("checkpoint", 1, {FILES: 3})], {}, {}, {}) == []


def test_duration_words() -> None:
    assert [replay._duration(ms) for ms in (2 * DAY, DAY, 90_000, 60_000, 1_500, 0)] == [
        "2 d",
        "24 h",
        "90 s",
        "1 min",
        "1500 ms",
        "0 ms",
    ]


# ---- the points of a pipeline --------------------------------------------------------------


def test_retained_points_are_completed_checkpoints_then_savepoints(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10, TP1: 4})
    url = savepoints.create_savepoint(h.store, "pipe")
    h.epoch(coord, {TP0: 20, TP1: 8})
    h.epoch(coord, {TP0: 30, TP1: 9})  # retention drops checkpoint 1
    assert [(p.kind, p.ident, dict(p.offsets)) for p in retained_points(h.store, "pipe")] == [
        ("checkpoint", 2, {TP0: 20, TP1: 8}),
        ("checkpoint", 3, {TP0: 30, TP1: 9}),
        ("savepoint", url, {TP0: 10, TP1: 4}),
    ]


def test_unreadable_points_are_left_out(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    savepoints.create_savepoint(h.store, "pipe")
    h.epoch(coord, {TP0: 20})
    (prefix,) = savepoints.list_savepoints(h.store, "pipe")
    h.store.put(prefix + "_metadata", b"{not json")
    h.store.put(h.layout.chk(CheckpointId(1)) + "_metadata", b"{not json")
    assert [(p.kind, p.ident) for p in retained_points(h.store, "pipe")] == [("checkpoint", 2)]
    assert retained_points(h.store, "other") == []
