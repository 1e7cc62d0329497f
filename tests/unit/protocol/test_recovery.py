"""The one recovery path, over a file store and an in-memory source standing in for Kafka."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import pytest

from microcheckpoint.errors import (
    AcksMissing,
    CheckpointExpired,
    CheckpointNotFound,
    CommitConflict,
    ConfigError,
    NotAligned,
    TooManyFailures,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import recovery, savepoints
from microcheckpoint.protocol.barrier import OffsetRange
from microcheckpoint.protocol.records import AbortReason, OutcomeRecord, encode
from microcheckpoint.protocol.records.alignment import AlignmentMode, InputAlignment
from microcheckpoint.protocol.records.interval import DataInterval
from microcheckpoint.protocol.source import source_partitions, startup_offsets
from microcheckpoint.protocol.view import CheckpointStatus
from tests.unit.protocol.helpers import C1, C2, C3, SRC, TP0, TP1, ack_all, start, status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 1, tzinfo=UTC)
OTHER = TopicPartition("other", 0)


class MemoryOffsets:
    """The source port, answered from dictionaries; records what was committed."""

    def __init__(
        self, ends: Mapping[TopicPartition, int], by_time: Mapping[int, dict] | None = None
    ):
        self.ends = dict(ends)
        self.by_time = dict(by_time or {})
        self.committed: dict[str, dict[TopicPartition, int]] = {}
        self.begin = dict.fromkeys(ends, 0)

    def partitions(self, topic: str) -> list[TopicPartition]:
        return sorted(tp for tp in self.ends if tp.topic == topic)

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.begin[tp] for tp in tps}

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp] for tp in tps}

    def offsets_for_times(self, tps: Iterable[TopicPartition], timestamp_ms: int):
        return {tp: self.by_time[timestamp_ms][tp] for tp in tps}

    def committed_group_offsets(self, group: str, tps: Iterable[TopicPartition]):
        return {tp: self.committed.get(group, {}).get(tp) for tp in tps}

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self.committed.setdefault(group, {}).update(offsets)


def begin(coord, kafka, **kwargs):
    options = {
        "topics": ["events"],
        "expected": lambda p: [SRC, *(TaskId.of("agg", i) for i in range(p))],
        "default_parallelism": 1,
        "publish": None,
        "rerun_pending": True,
    }
    return recovery.start_epoch(coord, kafka, **{**options, **kwargs})


def test_topics_become_partitions_in_order() -> None:
    kafka = MemoryOffsets({TP1: 3, TP0: 5, OTHER: 1})
    assert source_partitions(kafka, ["events", "other"]) == [TP0, TP1, OTHER]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("earliest", {TP0: 2}), ("latest", {TP0: 9}), ("group_offsets", {TP0: 4})],
)
def test_startup_offsets_by_mode(h, mode: str, expected: dict) -> None:
    kafka = MemoryOffsets({TP0: 9})
    kafka.begin[TP0] = 2
    config = h.config(startup_mode=mode)
    kafka.commit_group_offsets(config.effective_group_id, {TP0: 4})
    assert startup_offsets(kafka, config, [TP0]) == expected


def test_committed_offsets_below_the_log_start_start_at_the_log_start(h) -> None:
    kafka = MemoryOffsets({TP0: 9})
    kafka.begin[TP0] = 6
    config = h.config()
    kafka.commit_group_offsets(config.effective_group_id, {TP0: 4})
    assert startup_offsets(kafka, config, [TP0]) == {TP0: 6}
    assert startup_offsets(kafka, config, []) == {}


def test_a_new_pipeline_triggers_from_the_startup_offsets_to_the_high_watermarks(h) -> None:
    coord = h.coordinator(startup_mode="earliest")
    started = begin(coord, MemoryOffsets({TP0: 10, TP1: 4}))
    assert started == recovery.EpochStart(C1, rerun=False)
    assert coord.barrier(C1).ranges == {TP0: OffsetRange(0, 10), TP1: OffsetRange(0, 4)}
    assert coord.view().expected_tasks(C1) == frozenset({SRC, TaskId.of("agg", 0)})


def test_a_pending_checkpoint_is_re_run_only_by_a_caller_that_owns_it(h) -> None:
    coord = h.coordinator(startup_mode="earliest")
    kafka = MemoryOffsets({TP0: 10})
    begin(coord, kafka)
    assert begin(coord, kafka) == recovery.EpochStart(C1, rerun=True)
    with pytest.raises(TriggerRefused, match="max_concurrent=1"):
        begin(coord, kafka, rerun_pending=False)


def test_what_a_failed_run_left_is_finished_and_notified_before_the_next_trigger(h) -> None:
    coord = h.coordinator(startup_mode="earliest", max_concurrent=2, retained=3)
    kafka = MemoryOffsets({TP0: 10})
    h.epoch(coord, {TP0: 10}, notify=False)  # 1: completed, its notify never ran
    start(h, coord, {TP0: 20})
    ack_all(h, coord, C2)
    claim = OutcomeRecord.completed_by(1, 1, "dead")  # 2: claimed, then the completer died
    h.store.put(h.layout.outcome(C2), encode(claim))
    published = []
    kafka.ends[TP0] = 25
    started = begin(coord, kafka, publish=published.append, rerun_pending=False)
    assert started == recovery.EpochStart(C3)
    assert [m.checkpoint_id for m in published] == [C1, C2]
    assert kafka.committed == {"microcheckpoint-pipe": {TP0: 20}}
    view = coord.view()
    assert [view.records[c].notified for c in (C1, C2)] == [True, True]
    assert coord.barrier(C3).ranges == {TP0: OffsetRange(20, 25)}


def test_policy_data_interval_reads_up_to_the_interval_end_and_labels_it(h) -> None:
    coord = h.coordinator(startup_mode="earliest", barrier_policy="data_interval")
    end_ms = int(T1.timestamp() * 1000)
    kafka = MemoryOffsets({TP0: 50}, {end_ms: {TP0: 12}})
    begin(coord, kafka, interval=(T0, T1), labels={"run_id": "r1"})
    assert coord.barrier(C1).ranges == {TP0: OffsetRange(0, 12)}
    pending = coord.view().pending_record(C1)
    assert pending.labels == {"run_id": "r1"}
    assert pending.data_interval == DataInterval(T0, T1)
    assert pending.labels_json() == {
        "run_id": "r1",
        "data_interval": [T0.isoformat(), T1.isoformat()],
    }


ALIGNED_3 = InputAlignment(AlignmentMode.ALIGNED, epoch=3, upstream="up", topics=("events",))


class AligningOffsets(MemoryOffsets):
    """A stage input: ``align`` cuts at given marker offsets, or is not aligned in time."""

    def __init__(self, ends, markers):
        super().__init__(ends)
        self.markers = markers
        self.asked: list[tuple[dict, dict, float, float]] = []

    def align(self, ends, starts, config, waited_s=0):
        self.asked.append((dict(ends), dict(starts), config.timeout, waited_s))
        if any(m is None for m in self.markers.values()):
            raise NotAligned("channels events:1 have no barrier marker")
        return {tp: m + 1 for tp, m in self.markers.items()}, ALIGNED_3


def test_a_stage_input_triggers_up_to_the_markers_and_records_the_alignment(h) -> None:
    coord = h.coordinator(startup_mode="earliest", timeout="90s")
    kafka = AligningOffsets({TP0: 10, TP1: 8}, {TP0: 4, TP1: 6})
    begin(coord, kafka, labels={"run_id": "r1"}, aligned_waited_s=4.5)
    assert kafka.asked == [({TP0: 10, TP1: 8}, {}, 90.0, 4.5)]
    assert coord.barrier(C1).ranges == {TP0: OffsetRange(0, 5), TP1: OffsetRange(0, 7)}
    pending = coord.view().pending_record(C1)
    assert (pending.labels, pending.alignment) == ({"run_id": "r1"}, ALIGNED_3)
    assert pending.labels_json()["alignment"] == {
        "mode": "aligned",
        "unaligned": False,
        "waited_ms": 0,
        "epoch": 3,
        "upstream": "up",
        "topics": ["events"],
        "inflight": [],
    }


class ProbedOffsets(MemoryOffsets):
    """A stage input whose ``probe`` says what it waits for (None: ready)."""

    def __init__(self, ends, answer):
        super().__init__(ends)
        self.answer = answer
        self.asked: list[tuple[dict, dict, float]] = []

    def probe(self, ends, starts, config, waited_s):
        self.asked.append((dict(ends), dict(starts), waited_s))
        return self.answer


def test_alignment_wait_probes_from_the_next_epochs_start_without_triggering(h) -> None:
    coord = h.coordinator(startup_mode="earliest")
    h.epoch(coord, {TP0: 10})
    port = ProbedOffsets({TP0: 12}, "waiting for channel events:0")
    assert recovery.alignment_wait(coord, port, ["events"], 2.5) == "waiting for channel events:0"
    assert port.asked == [({TP0: 12}, {TP0: 10}, 2.5)]
    assert recovery.alignment_wait(coord, MemoryOffsets({TP0: 12}), ["events"], 0) is None
    assert coord.view().pending == []


def test_a_stage_input_not_aligned_in_time_triggers_nothing(h) -> None:
    coord = h.coordinator(startup_mode="earliest")
    with pytest.raises(NotAligned, match="events:1"):
        begin(coord, AligningOffsets({TP0: 10, TP1: 8}, {TP0: 4, TP1: None}))
    assert coord.view().pending == [] and coord.view().completed == []


def test_policy_data_interval_reads_nothing_for_an_interval_already_processed(h) -> None:
    coord = h.coordinator(startup_mode="earliest", barrier_policy="data_interval")
    h.epoch(coord, {TP0: 30})
    end_ms = int(T1.timestamp() * 1000)
    begin(coord, MemoryOffsets({TP0: 50}, {end_ms: {TP0: 12}}), interval=(T0, T1))
    assert coord.barrier(C2).ranges == {TP0: OffsetRange(30, 30)}


def test_policy_data_interval_without_an_interval_is_refused(h) -> None:
    coord = h.coordinator(barrier_policy="data_interval")
    with pytest.raises(ConfigError, match="barrier_policy"):
        begin(coord, MemoryOffsets({TP0: 5}))
    assert coord.view().records == {}


def test_the_parallelism_of_the_latest_restore_wins(h) -> None:
    coord = h.coordinator(startup_mode="earliest")
    h.epoch(coord, {TP0: 10})
    assert recovery.parallelism(coord.view(), 2) == 2
    point = savepoints.choose_restore(h.store, "pipe")
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM, parallelism=3)
    assert recovery.parallelism(coord.view(), 2) == 3
    begin(coord, MemoryOffsets({TP0: 12}), default_parallelism=2)
    assert len(coord.view().expected_tasks(C2)) == 4


def test_complete_is_safe_to_run_again(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    with pytest.raises(AcksMissing):
        recovery.complete_checkpoint(coord, C1)
    ack_all(h, coord, C1)
    first = recovery.complete_checkpoint(coord, C1)
    assert recovery.complete_checkpoint(coord, C1) == first
    with pytest.raises(
        CheckpointNotFound, match="checkpoint 7 of 'pipe' does not exist in file://"
    ):
        recovery.complete_checkpoint(coord, CheckpointId(7))


def test_complete_past_the_timeout_expires_and_complete_of_an_aborted_one_conflicts(h) -> None:
    coord = h.coordinator(timeout=60, tolerable_failures=5)
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    h.t[0] += 61
    with pytest.raises(CheckpointExpired, match=r"expired: not complete within timeout=60\.0s"):
        recovery.complete_checkpoint(coord, C1)
    assert coord.view().records[C1].abort_reason is AbortReason.EXPIRED
    # Again (the epoch task after the timeout sensor expired it): the expiry, by name.
    with pytest.raises(CheckpointExpired, match=r"checkpoint 1 of 'pipe' expired: not complete"):
        recovery.complete_checkpoint(coord, C1)
    # A checkpoint aborted for another reason conflicts.
    start(h, coord, {TP0: 10})
    coord.abort_declined(C2, "a task failed")
    with pytest.raises(CommitConflict, match="checkpoint 2 is ABORTED, it cannot complete"):
        recovery.complete_checkpoint(coord, C2)


def test_a_failed_run_declines_its_checkpoint_and_stops_past_the_tolerance(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    start(h, coord, {TP0: 10})
    recovery.abort_failed_run(coord, C1, "task failed")
    assert coord.view().records[C1].abort_reason is AbortReason.DECLINED
    start(h, coord, {TP0: 10})
    with pytest.raises(TooManyFailures, match="2 consecutive checkpoint failures"):
        recovery.abort_failed_run(coord, C2, "task failed again")
    assert status(coord, C2) is CheckpointStatus.ABORTED
    coord.reset_failures()
    recovery.abort_failed_run(coord, None, "nothing was triggered")  # aborts nothing more
    assert coord.consecutive_failures() == 0
