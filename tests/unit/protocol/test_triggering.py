"""The coordinator's trigger: ids, barriers, min pause and max concurrent."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import (
    KafkaSourceError,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.decider import Verdict
from tests.unit.protocol.helpers import (
    C1,
    C2,
    C3,
    TASKS,
    TP0,
    TP1,
    ack_all,
    barrier_json,
    read,
    start,
)

# ---- trigger ------------------------------------------------------------------------------


def test_trigger_allocates_dense_ids_and_chains_barriers(h) -> None:
    coord = h.coordinator()
    first = coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    assert first.checkpoint_id == C1
    assert first.attempt == 1
    assert first.expected == frozenset(TASKS)
    assert first.trigger_time_ms == 1_000_000
    assert barrier_json(h, C1) == {"events:0": [0, 10]}
    pending = read(h, h.layout.pending(C1))
    assert pending["checkpoint_id"] == 1
    assert pending["expected"] == ["agg#0", "source#0"]
    assert pending["base"] is None
    assert pending["trigger_time_ms"] == 1_000_000
    ack_all(h, coord, C1)
    coord.complete(C1)

    # A new partition appears: only it is asked for startup offsets.
    h.t[0] = 1010.0
    second = coord.trigger(TASKS, {TP0: 25, TP1: 7}, h.startup({TP0: 999, TP1: 3}))
    assert second.checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 25], "events:1": [3, 7]}
    assert read(h, h.layout.pending(C2))["base"] == 1
    ack_all(h, coord, C2)
    coord.complete(C2)

    third = coord.trigger(TASKS, {TP0: 25, TP1: 9}, h.startup({}))
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [25, 25], "events:1": [7, 9]}
    assert read(h, h.layout.pending(C3))["base"] == 2
    assert h.startup_calls == [[TP0], [TP1]]  # not called when nothing is new
    assert coord.view().ids() == [C1, C2, C3]


def test_trigger_without_startup_offsets_for_a_new_partition(h) -> None:
    coord = h.coordinator()
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP1: 5, TP0: 5})
    assert str(caught.value) == "partitions events:1, events:0 have no start offset"
    assert h.keys() == []


def test_trigger_when_a_checkpointed_partition_vanished(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 4, TP1: 4})
    ack_all(h, coord, C1)
    coord.complete(C1)
    with pytest.raises(KafkaSourceError, match=r"^partition events:1 has a start offset 4"):
        coord.trigger(TASKS, {TP0: 9})
    assert coord.view().ids() == [C1]


def test_max_records_per_epoch_caps_each_partition(h) -> None:
    coord = h.coordinator(max_records_per_epoch=4)
    expected = [
        {"events:0": [0, 4], "events:1": [0, 2]},
        {"events:0": [4, 8], "events:1": [2, 2]},
        {"events:0": [8, 10], "events:1": [2, 2]},
    ]
    for n, barrier in enumerate(expected, start=1):
        pending = start(h, coord, {TP0: 10, TP1: 2})
        assert pending.checkpoint_id == CheckpointId(n)
        assert barrier_json(h, pending.checkpoint_id) == barrier
        ack_all(h, coord, pending.checkpoint_id)
        meta = coord.complete(pending.checkpoint_id)
        assert meta.offsets == {TP0: barrier["events:0"][1], TP1: barrier["events:1"][1]}


# ---- min pause and max concurrent -------------------------------------------------------


def test_min_pause(h) -> None:
    coord = h.coordinator(min_pause="30s")
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    h.t[0] = 1005.0
    assert coord.complete(C1).completed_time_ms == 1_005_000

    h.t[0] = 1015.0
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MIN_PAUSE
    assert decision.wait_s == 20.0
    assert decision.allowed is False
    assert decision.reason == "10.0s since checkpoint 1 completed, min_pause=30.0s"
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP0: 20})
    assert str(caught.value) == (
        "pipeline 'pipe': 10.0s since checkpoint 1 completed, min_pause=30.0s"
    )
    assert coord.view().ids() == [C1]

    h.t[0] = 1034.75
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MIN_PAUSE
    assert decision.wait_s == 0.25

    h.t[0] = 1035.0
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.TRIGGER
    assert decision.wait_s == 0.0
    assert decision.allowed is True
    assert coord.trigger(TASKS, {TP0: 20}).checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 20]}


def test_min_pause_without_a_completed_checkpoint(h) -> None:
    coord = h.coordinator(min_pause="1h")
    assert coord.trigger_decision().verdict is Verdict.TRIGGER


def test_max_concurrent_one(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "1 checkpoint(s) in flight, max_concurrent=1"
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP0: 20})
    assert str(caught.value) == "pipeline 'pipe': 1 checkpoint(s) in flight, max_concurrent=1"
    assert coord.view().ids() == [C1]


def test_max_concurrent_two_chains_barriers(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 10})
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    second = coord.trigger(TASKS, {TP0: 25})
    assert second.checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 25]}
    assert read(h, h.layout.pending(C2))["base"] == 1

    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "2 checkpoint(s) in flight, max_concurrent=2"
    with pytest.raises(TriggerRefused):
        coord.trigger(TASKS, {TP0: 30})

    ack_all(h, coord, C1)
    coord.complete(C1)
    third = coord.trigger(TASKS, {TP0: 30})
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [25, 30]}
    assert read(h, h.layout.pending(C3))["base"] == 2
    assert coord.view().pending == [C2, C3]


def test_min_pause_forces_one_in_flight(h) -> None:
    coord = h.coordinator(max_concurrent=3, min_pause="1s")
    start(h, coord, {TP0: 10})
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "1 checkpoint(s) in flight, max_concurrent=1"
