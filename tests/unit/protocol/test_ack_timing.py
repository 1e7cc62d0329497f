"""A subtask's ack carries Flink's split of its time: sync (barrier to snapshot written
locally) and async (upload), and a checkpoint's details give each subtask's end to end
(trigger to ack) with min / avg / max per operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol import ack_timing
from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.protocol.history import checkpoint_detail
from microcheckpoint.protocol.records import Ack
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.subtask import SubtaskState
from microcheckpoint.storage.file import FileStore
from tests.unit.conftest import AGG, SRC, TP0

UPLOAD_S = 0.05
APPLY_S = 0.03


class Clock:
    """``time.perf_counter`` for the timer, moved by hand: the test asserts the split exactly,
    whatever else the machine is doing."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        """The wall clock: the same clock, 1.7e9 s later (a date in 2023)."""
        return 1_700_000_000.0 + self.now


class SlowUploads(FileStore):
    """A file store whose every write takes ``UPLOAD_S`` on the clock (an upload to far
    storage)."""

    def __init__(self, url: str, clock: Clock) -> None:
        super().__init__(url)
        self.clock = clock

    def put(self, key, data, **kwargs):  # type: ignore[no-untyped-def]
        self.clock.now += UPLOAD_S
        return super().put(key, data, **kwargs)


def test_a_snapshot_counts_the_work_before_it_as_sync_and_its_upload_as_async(
    tmp_path: Path, monkeypatch
):
    clock = Clock()
    monkeypatch.setattr(ack_timing, "time", clock)
    store = SlowUploads(tmp_path.as_uri(), clock)
    timer = AckTimer()  # the subtask's barrier
    state = SubtaskState(
        store, uid="op", owned=range(4), chains={}, backend="table", prefix="p/", now_ms=1,
        timer=timer,
    )  # fmt: skip
    clock.now += APPLY_S  # restore and apply
    state.put(1, canonical_key("a"), 1)
    handles = state.snapshot()  # one delta file: serialized, then uploaded
    ack = timer.ack(TaskId.of("op", 0), 2, handles)
    assert len(ack.handles) == 1
    assert ack.async_ms == pytest.approx(UPLOAD_S * 1000)
    assert ack.sync_ms == pytest.approx(APPLY_S * 1000)
    assert ack.duration_ms == round(ack.sync_ms + ack.async_ms)
    # Stored and read back; an ack written before the times existed reads them as None.
    assert Ack.from_json(ack.to_json()) == ack
    old = {k: v for k, v in ack.to_json().items() if k not in ("sync_ms", "async_ms")}
    assert (Ack.from_json(old).sync_ms, Ack.from_json(old).async_ms) == (None, None)


def test_reading_the_rows_is_the_read_part_not_sync_and_the_start_is_wall_time(
    tmp_path: Path, monkeypatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(ack_timing, "time", clock)
    timer = AckTimer()  # the subtask's code begins
    with timer.reading():
        clock.now += 0.02  # its rows received and decoded
    clock.now += APPLY_S
    with timer.uploading():
        clock.now += UPLOAD_S
    ack = timer.ack(TaskId.of("op", 1), 2)
    assert ack.started_at_ms == 1_700_000_100_000
    assert (ack.read_ms, ack.sync_ms, ack.async_ms) == pytest.approx((20.0, 30.0, 50.0))
    assert Ack.from_json(ack.to_json()) == ack
    # Acks stored before the read part and the start existed read them as None.
    old = {k: v for k, v in ack.to_json().items() if k not in ("started_at_ms", "read_ms")}
    assert (Ack.from_json(old).started_at_ms, Ack.from_json(old).read_ms) == (None, None)


def test_a_subtask_that_uploads_nothing_has_no_async_part() -> None:
    ack = AckTimer().ack(SRC, 2, (), {"events:0": 5})
    assert ack.async_ms == 0.0 and ack.sync_ms is not None and ack.sync_ms >= 0
    assert ack.operator_state == {"events:0": 5}


def test_details_give_each_subtasks_times_and_min_avg_max_per_operator(h) -> None:
    agg1 = TaskId.of("agg", 1)
    coord = h.coordinator()
    pending = coord.trigger((SRC, AGG, agg1), {TP0: 4}, h.startup({TP0: 0}))
    cid, t0 = pending.checkpoint_id, pending.trigger_time_ms
    acks = [
        Ack(SRC, 1, (), {}, 0, t0 + 900, 0.25, 0.0),
        Ack(AGG, 1, (), {}, 30, t0 + 400, 10.0, 20.0),
        Ack(agg1, 1, (), {}, 80, t0 + 600, 50.0, 30.0),
    ]
    for ack in acks:
        coord.acknowledge(cid, ack)
    coord.complete(cid)
    detail = checkpoint_detail(h.store, "pipe", cid.value)
    times = {
        s["task"]: (s["end_to_end_ms"], s["sync_ms"], s["async_ms"]) for s in detail["subtasks"]
    }
    assert times == {
        "source#0": (900, 0.25, 0.0),
        "agg#0": (400, 10.0, 20.0),
        "agg#1": (600, 50.0, 30.0),
    }
    assert detail["operators"] == {
        "agg": {
            "subtasks": 2,
            "end_to_end_ms": {"min": 400.0, "avg": 500.0, "max": 600.0},
            "sync_ms": {"min": 10.0, "avg": 30.0, "max": 50.0},
            "async_ms": {"min": 20.0, "avg": 25.0, "max": 30.0},
        },
        "source": {
            "subtasks": 1,
            "end_to_end_ms": {"min": 900.0, "avg": 900.0, "max": 900.0},
            "sync_ms": {"min": 0.25, "avg": 0.25, "max": 0.25},
            "async_ms": {"min": 0.0, "avg": 0.0, "max": 0.0},
        },
    }


def test_acks_stored_before_the_times_existed_show_none(h) -> None:
    coord = h.coordinator()
    meta = h.epoch(coord, {TP0: 3})  # acks without sync and async parts
    detail = checkpoint_detail(h.store, "pipe", meta.checkpoint_id.value)
    assert {(s["sync_ms"], s["async_ms"]) for s in detail["subtasks"]} == {(None, None)}
    assert detail["operators"]["agg"]["sync_ms"] is None
    assert detail["operators"]["agg"]["end_to_end_ms"] == {"min": 0.0, "avg": 0.0, "max": 0.0}
    assert CheckpointId(1) == meta.checkpoint_id
