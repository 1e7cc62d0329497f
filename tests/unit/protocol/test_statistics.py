"""Checkpoint statistics: incremental vs full size, per subtask, a stage's alignment."""

from __future__ import annotations

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    FanInAlignment,
    InflightChannel,
    InputAlignment,
)
from microcheckpoint.protocol.records.checkpoint import Ack
from microcheckpoint.protocol.records.statistics import CheckpointStatistics, SubtaskStatistics
from microcheckpoint.protocol.statistics import checkpoint_statistics
from microcheckpoint.state.handles import StateHandle

C5 = CheckpointId(5)
SRC, AGG0, AGG1 = TaskId.of("src", 0), TaskId.of("agg", 0), TaskId.of("agg", 1)
OWN = "p/chk-00005/"


def _acks() -> dict:
    return {
        SRC: Ack(SRC, 1, (), {"t:0": 10}, duration_ms=3),
        AGG0: Ack(
            AGG0,
            1,
            (
                StateHandle("p/chk-00002/state/agg/00000-a00001/base.parquet", 1000, (0,)),
                StateHandle(f"{OWN}state/agg/00000-a00001/delta.parquet", 40, (0,)),
            ),
            duration_ms=120,
        ),
        AGG1: Ack(AGG1, 1, (StateHandle("p/chk-00004/x/base.parquet", 500, (1,)),)),
    }


def test_sizes_separate_what_this_checkpoint_wrote_from_what_it_references() -> None:
    stats = checkpoint_statistics(C5, _acks(), None, 1_000, 1_750, OWN)
    assert stats.end_to_end_duration_ms == 750
    assert (stats.checkpointed_size, stats.full_size) == (40, 1540)
    assert stats.alignment is None
    assert stats.subtasks == {
        "agg#0": SubtaskStatistics(120, 40, 1040),
        "agg#1": SubtaskStatistics(0, 0, 500),
        "src#0": SubtaskStatistics(3, 0, 0),
    }
    # Stored as it always was; read back equal.
    assert stats.to_json()["subtasks"]["agg#0"] == {
        "ack_duration_ms": 120,
        "checkpointed_size": 40,
        "full_size": 1040,
    }
    assert CheckpointStatistics.from_json(stats.to_json()) == stats
    assert CheckpointStatistics.from_json({}) is None  # a savepoint's


def test_a_stage_checkpoint_carries_its_alignment_to_every_subtask() -> None:
    alignment = InputAlignment(
        AlignmentMode.UNALIGNED,
        waited_ms=1000,
        epoch=5,
        alignment_duration_ms=30,
        start_delay_ms=200,
        inflight=(InflightChannel("mid:1", 80, 5),),
        persisted_inflight_bytes=0,
    )
    stats = checkpoint_statistics(C5, _acks(), alignment, 0, 10, OWN)
    assert stats.alignment == alignment
    for subtask in stats.subtasks.values():
        assert subtask.alignment_duration_ms == 30 and subtask.start_delay_ms == 200
        assert subtask.unaligned is True and subtask.persisted_inflight_bytes == 0
    assert CheckpointStatistics.from_json(stats.to_json()) == stats
    # A fan-in gives its subtasks only whether any input was unaligned.
    fan_in = checkpoint_statistics(C5, _acks(), FanInAlignment({"a": alignment}), 0, 10, OWN)
    assert {s.unaligned for s in fan_in.subtasks.values()} == {True}
    assert {s.start_delay_ms for s in fan_in.subtasks.values()} == {None}
