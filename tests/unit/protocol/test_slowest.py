"""The subtask that finished a checkpoint last, and why: its end to end split into waiting
to start, read, keyed, snapshot upload and ack, the largest named (``protocol.slowest``)."""

from __future__ import annotations

import pytest

from microcheckpoint.ids import TaskId
from microcheckpoint.protocol.history import checkpoint_detail
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.slowest import slowest_subtask, subtask_phases, why
from tests.unit.conftest import AGG, SRC, TP0

T0 = 1_000_000  # the trigger time
AGG1 = TaskId.of("agg", 1)


def ack(task: TaskId, started: int | None, read: float | None, sync: float, upload: float,
        acked: int) -> Ack:  # fmt: skip
    """An ack whose subtask started ``started`` ms after the trigger and acked at ``acked``."""
    return Ack(task, 2, (), {}, round(sync + upload), T0 + acked, sync, upload,
               None if started is None else T0 + started, read)  # fmt: skip


def test_the_phases_add_up_to_the_end_to_end() -> None:
    phases = subtask_phases(ack(AGG, 100, 20.0, 300.5, 70.25, 500), T0)
    assert phases == {
        "waiting to start": 100.0,
        "read": 20.0,
        "keyed": 300.5,
        "snapshot upload": 70.25,
        "ack": 9.25,  # 500 - 100 - 20 - 300.5 - 70.25
    }
    assert sum(v for v in phases.values() if v is not None) == 500


@pytest.mark.parametrize(
    ("started", "read", "sync", "upload", "acked", "expected"),
    [
        (100, 20.0, 300.0, 70.0, 500, "keyed"),
        (10, 400.0, 30.0, 50.0, 500, "read"),
        (10, 5.0, 30.0, 450.0, 500, "snapshot upload"),
        (400, 5.0, 30.0, 50.0, 500, "waiting to start"),  # started late after the trigger
        (10, 5.0, 30.0, 50.0, 500, "ack"),  # 405 ms between the upload's end and the ack
        (100, 100.0, 100.0, 100.0, 400, "waiting to start"),  # a tie: the earlier phase
    ],
)
def test_why_is_the_largest_phase(started, read, sync, upload, acked, expected) -> None:
    assert why(subtask_phases(ack(AGG, started, read, sync, upload, acked), T0)) == expected


def test_an_ack_stored_before_the_phases_existed_is_explained_by_what_it_has() -> None:
    old = Ack(AGG, 2, (), {}, 80, T0 + 500, 60.0, 20.0)  # no start, no read part
    phases = subtask_phases(old, T0)
    assert phases == {
        "waiting to start": None,
        "read": None,
        "keyed": 60.0,
        "snapshot upload": 20.0,
        "ack": None,
    }
    assert why(phases) == "keyed"
    older = Ack(AGG, 2, (), {}, 0, T0 + 500)  # no times at all
    assert why(subtask_phases(older, T0)) is None
    assert slowest_subtask({AGG: older}, T0) == {
        "task": "agg#0",
        "end_to_end_ms": 500,
        "phases": dict.fromkeys(subtask_phases(older, T0)),
        "why": None,
        "why_ms": None,
    }
    assert slowest_subtask({AGG: Ack(AGG, 2)}, T0) is None  # no ack time: nothing to say


def test_the_slowest_subtask_is_the_one_that_acked_last() -> None:
    acks = {
        SRC: ack(SRC, 1, 0.0, 0.5, 0.0, 3),
        AGG: ack(AGG, 50, 5.0, 100.0, 20.0, 180),
        AGG1: ack(AGG1, 60, 5.0, 400.0, 30.0, 500),
    }
    assert slowest_subtask(acks, T0) == {
        "task": "agg#1",
        "end_to_end_ms": 500,
        "phases": {
            "waiting to start": 60.0,
            "read": 5.0,
            "keyed": 400.0,
            "snapshot upload": 30.0,
            "ack": 5.0,
        },
        "why": "keyed",
        "why_ms": 400.0,
    }
    # A tie on the end to end: the first by task name.
    tied = {AGG1: ack(AGG1, 60, 5.0, 400.0, 30.0, 500), AGG: ack(AGG, 400, 5.0, 50.0, 20.0, 500)}
    assert slowest_subtask(tied, T0)["task"] == "agg#0"  # type: ignore[index]


def test_checkpoint_details_name_the_slowest_subtask_and_why(h) -> None:
    coord = h.coordinator()
    pending = coord.trigger((SRC, AGG, AGG1), {TP0: 4}, h.startup({TP0: 0}))
    cid, t0 = pending.checkpoint_id, pending.trigger_time_ms
    stored = [
        Ack(SRC, 1, (), {}, 0, t0 + 20, 0.25, 0.0, t0 + 19, 0.0),
        Ack(AGG, 1, (), {}, 30, t0 + 400, 10.0, 20.0, t0 + 300, 60.0),
        Ack(AGG1, 1, (), {}, 80, t0 + 900, 50.0, 30.0, t0 + 700, 118.0),
    ]
    for a in stored:
        coord.acknowledge(cid, a)
    coord.complete(cid)
    detail = checkpoint_detail(h.store, "pipe", cid.value)
    assert detail["slowest"] == {
        "task": "agg#1",
        "end_to_end_ms": 900,
        "phases": {
            "waiting to start": 700.0,
            "read": 118.0,
            "keyed": 50.0,
            "snapshot upload": 30.0,
            "ack": 2.0,
        },
        "why": "waiting to start",
        "why_ms": 700.0,
    }
    phases = {s["task"]: s["phases"]["read"] for s in detail["subtasks"]}
    assert phases == {"source#0": 0.0, "agg#0": 60.0, "agg#1": 118.0}
