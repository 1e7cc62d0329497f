"""The sensors' checks over a real file store, with a clock moved by hand.

``run_check`` builds its own coordinator with the real clock, so the time-dependent
cases call the per-kind functions with the ``h`` harness's coordinator (clock ``h.t``).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from microcheckpoint.errors import CommitConflict
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint_airflow import checks
from microcheckpoint_airflow.checks import Check, CheckState
from microcheckpoint_airflow.triggers import CheckpointConditionTrigger

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
TASKS = (SRC, AGG)
C1, C2, C3 = CheckpointId(1), CheckpointId(2), CheckpointId(3)

READY_OK = Check(CheckState.READY, "ok")
GATES = (checks.check_min_pause, checks.check_concurrency)


def trigger(h, coord: CheckpointCoordinator, end: int = 10) -> CheckpointId:
    return coord.trigger(TASKS, {TP0: end}, h.startup({TP0: 0})).checkpoint_id


def ack(h, coord: CheckpointCoordinator, cid: CheckpointId, *tasks: TaskId, attempt=1) -> None:
    for task in tasks:
        assert h.ack(coord, cid, task, attempt) is AckResult.SUCCESS


def record(coord: CheckpointCoordinator, cid: CheckpointId):
    return coord.view().records[cid]


# ---- events ------------------------------------------------------------------------------


def test_check_event_round_trip() -> None:
    for state in CheckState:
        check = Check(state, f"message of {state.value}")
        event = check.to_event()
        assert event == {"state": state.value, "message": f"message of {state.value}"}
        # Trigger events are stored as JSON.
        assert Check.from_event(json.loads(json.dumps(event))) == check
    assert Check.from_event({"state": "SKIP"}) == Check(CheckState.SKIP, "")
    with pytest.raises(ValueError, match="'MAYBE' is not a valid CheckState"):
        Check.from_event({"state": "MAYBE", "message": ""})


# ---- min pause ---------------------------------------------------------------------------


def test_min_pause_waits_with_the_elapsed_time_then_is_ready(h) -> None:
    coord = h.coordinator(min_pause=30)
    assert checks.check_min_pause(coord, None) == READY_OK  # nothing completed yet
    h.epoch(coord, {TP0: 10})  # completes checkpoint 1 at t=1000

    assert checks.check_min_pause(coord, None) == Check(
        CheckState.WAIT, "0.0s since checkpoint 1 completed, min_pause=30.0s"
    )
    assert coord.trigger_decision().wait_s == 30.0
    h.t[0] = 1012.5
    assert checks.check_min_pause(coord, None) == Check(
        CheckState.WAIT, "12.5s since checkpoint 1 completed, min_pause=30.0s"
    )
    assert coord.trigger_decision().wait_s == 17.5  # the remaining time
    # The concurrency gate waits for the min pause too.
    assert checks.check_concurrency(coord, None) == Check(
        CheckState.WAIT, "12.5s since checkpoint 1 completed, min_pause=30.0s"
    )
    h.t[0] = 1030.0
    assert checks.check_min_pause(coord, None) == READY_OK
    assert checks.check_concurrency(coord, None) == READY_OK


# ---- concurrency -------------------------------------------------------------------------


def test_concurrency_waits_at_max_concurrent_and_is_ready_below(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    assert checks.check_concurrency(coord, None) == READY_OK
    trigger(h, coord)
    assert checks.check_concurrency(coord, None) == READY_OK  # 1 < 2
    trigger(h, coord, end=20)
    at_max = "2 checkpoint(s) in flight, max_concurrent=2"
    assert checks.check_concurrency(coord, None) == Check(CheckState.WAIT, at_max)
    # The min-pause gate lets the run through; the concurrency gate is the one that waits.
    assert checks.check_min_pause(coord, None) == Check(CheckState.READY, at_max)
    ack(h, coord, C1, *TASKS)
    coord.complete(C1)
    assert checks.check_concurrency(coord, None) == READY_OK  # checkpoint 2 is in flight
    assert coord.view().pending == [C2]


def test_concurrency_aborts_an_expired_checkpoint_as_expired(h) -> None:
    coord = h.coordinator(timeout=60, tolerable_failures=1)
    trigger(h, coord)
    h.t[0] = 1060.0  # exactly the timeout: not expired yet
    assert checks.check_concurrency(coord, None) == Check(
        CheckState.WAIT, "1 checkpoint(s) in flight, max_concurrent=1"
    )
    assert record(coord, C1).status is CheckpointStatus.PENDING
    h.t[0] = 1060.5
    assert checks.check_concurrency(coord, None) == READY_OK
    aborted = record(coord, C1)
    assert aborted.status is CheckpointStatus.ABORTED
    assert aborted.abort_reason is AbortReason.EXPIRED
    assert aborted.outcome.detail == "timeout 60.0s"
    assert coord.consecutive_failures() == 1


# ---- acks --------------------------------------------------------------------------------


def test_acks_wait_lists_the_missing_tasks_then_ready(h) -> None:
    coord = h.coordinator(timeout=60)
    trigger(h, coord)
    assert checks.check_acks(coord, C1) == Check(
        CheckState.WAIT, "checkpoint 1: waiting for 2 ack(s): ['agg#0', 'source#0']"
    )
    ack(h, coord, C1, SRC)
    assert checks.check_acks(coord, C1) == Check(
        CheckState.WAIT, "checkpoint 1: waiting for 1 ack(s): ['agg#0']"
    )
    ack(h, coord, C1, AGG)
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1: all acks in")
    assert record(coord, C1).status is CheckpointStatus.PENDING  # a check never completes


def test_acks_count_only_the_current_attempt(h) -> None:
    coord = h.coordinator()
    trigger(h, coord)
    ack(h, coord, C1, *TASKS)
    assert coord.begin_attempt(C1) == 2
    assert checks.check_acks(coord, C1) == Check(
        CheckState.WAIT, "checkpoint 1: waiting for 2 ack(s): ['agg#0', 'source#0']"
    )
    ack(h, coord, C1, *TASKS, attempt=2)
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1: all acks in")


def test_acks_fail_as_expired_past_the_timeout_even_with_every_ack_in(h) -> None:
    coord = h.coordinator(timeout=60, tolerable_failures=5)
    trigger(h, coord)
    ack(h, coord, C1, *TASKS)
    h.t[0] = 1060.0
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1: all acks in")
    h.t[0] = 1060.5
    assert checks.check_acks(coord, C1) == Check(
        CheckState.FAIL,
        "checkpoint 1 of 'pipe' expired: not complete within timeout=60.0s of its trigger "
        "(aborted as EXPIRED; the next epoch re-reads its range)",
    )
    assert record(coord, C1).abort_reason is AbortReason.EXPIRED
    # The decision is stored: the global ack can no longer happen, and a re-check says so.
    with pytest.raises(CommitConflict, match="checkpoint 1 is ABORTED, it cannot complete"):
        coord.complete(C1)
    assert checks.check_acks(coord, C1) == Check(
        CheckState.FAIL, "checkpoint 1 was aborted: EXPIRED"
    )


def test_acks_ready_for_a_completed_checkpoint_even_past_the_timeout(h) -> None:
    coord = h.coordinator(timeout=60)
    trigger(h, coord)
    ack(h, coord, C1, *TASKS)
    coord.complete(C1)
    h.t[0] = 5000.0
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1 is COMPLETED")
    assert record(coord, C1).status is CheckpointStatus.COMPLETED


def test_acks_ready_for_a_completing_checkpoint(h) -> None:
    coord = h.coordinator()
    trigger(h, coord)
    # A writer claimed COMPLETED and died before writing _metadata.
    h.store.put(h.layout.outcome(C1), json.dumps({"outcome": "COMPLETED", "attempt": 1}).encode())
    assert record(coord, C1).status is CheckpointStatus.COMPLETING
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1 is COMPLETING")


def test_acks_fail_for_an_aborted_or_unknown_checkpoint(h) -> None:
    coord = h.coordinator(tolerable_failures=5)
    trigger(h, coord)
    coord.abort_declined(C1, "a task failed")
    assert checks.check_acks(coord, C1) == Check(
        CheckState.FAIL, "checkpoint 1 was aborted: DECLINED"
    )
    assert checks.check_acks(coord, CheckpointId(7)) == Check(
        CheckState.FAIL, "checkpoint 7 of 'pipe' is gone"
    )


# ---- base state --------------------------------------------------------------------------


def test_base_state_ready_without_a_base(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    trigger(h, coord)
    assert checks.check_base_state(coord, C1) == Check(CheckState.READY, "no base checkpoint")


def test_base_state_waits_for_the_base_acks_then_ready(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    trigger(h, coord)
    trigger(h, coord, end=20)
    assert coord.view().pending_record(C2).base == C1
    waiting = Check(CheckState.WAIT, "waiting for the state of checkpoint 1")
    assert checks.check_base_state(coord, C2) == waiting
    ack(h, coord, C1, SRC)
    assert checks.check_base_state(coord, C2) == waiting
    ack(h, coord, C1, AGG)
    assert checks.check_base_state(coord, C2) == Check(
        CheckState.READY, "base 1 fully acknowledged"
    )
    coord.complete(C1)
    assert checks.check_base_state(coord, C2) == Check(CheckState.READY, "base 1 completed")


def test_base_state_ready_when_the_base_completed_before_the_trigger(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    h.epoch(coord, {TP0: 10}, notify=False)
    trigger(h, coord, end=20)
    assert checks.check_base_state(coord, C2) == Check(CheckState.READY, "base 1 completed")


def test_base_state_fails_when_the_base_was_aborted(h) -> None:
    coord = h.coordinator(max_concurrent=2, tolerable_failures=5)
    trigger(h, coord)
    trigger(h, coord, end=20)
    coord.abort_declined(C1, "a task failed")
    assert checks.check_base_state(coord, C2) == Check(
        CheckState.FAIL, "checkpoint 2 continues from aborted 1"
    )
    assert record(coord, C2).abort_reason is AbortReason.BASE_ABORTED


# ---- quiet -------------------------------------------------------------------------------


def test_quiet_waits_while_a_checkpoint_is_in_flight(h) -> None:
    coord = h.coordinator()
    quiet = Check(CheckState.READY, "no checkpoint in flight")
    assert checks.check_quiet(coord, None) == quiet
    trigger(h, coord)
    assert checks.check_quiet(coord, None) == Check(CheckState.WAIT, "checkpoint(s) in flight: [1]")
    ack(h, coord, C1, *TASKS)
    coord.complete(C1)
    assert checks.check_quiet(coord, None) == quiet


def test_quiet_waits_for_a_completing_checkpoint(h) -> None:
    coord = h.coordinator()
    trigger(h, coord)
    h.store.put(h.layout.outcome(C1), json.dumps({"outcome": "COMPLETED", "attempt": 1}).encode())
    assert checks.check_quiet(coord, None) == Check(CheckState.WAIT, "checkpoint(s) in flight: [1]")


def test_quiet_aborts_an_expired_checkpoint(h) -> None:
    coord = h.coordinator(timeout=60)
    trigger(h, coord)
    h.t[0] = 1061.0
    assert checks.check_quiet(coord, None) == Check(CheckState.READY, "no checkpoint in flight")
    assert record(coord, C1).abort_reason is AbortReason.EXPIRED


# ---- stop with savepoint, and too many failures -------------------------------------------


def test_every_gate_skips_while_suspended_and_is_ready_after_resume(h) -> None:
    coord = h.coordinator()
    coord.suspend("x")
    for gate in GATES:
        assert gate(coord, None) == Check(CheckState.SKIP, "stopped: x; restore to resume")
    coord.resume()
    for gate in GATES:
        assert gate(coord, None) == READY_OK


def test_suspend_does_not_skip_the_checks_of_checkpoints_in_flight(h) -> None:
    # Stop with savepoint waits for the checkpoints in flight: their checks go on.
    coord = h.coordinator()
    trigger(h, coord)
    coord.suspend("stop with savepoint")
    assert checks.check_quiet(coord, None) == Check(CheckState.WAIT, "checkpoint(s) in flight: [1]")
    ack(h, coord, C1, *TASKS)
    assert checks.check_acks(coord, C1) == Check(CheckState.READY, "checkpoint 1: all acks in")


def test_gates_fail_past_tolerable_failures_until_reset(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    trigger(h, coord)
    coord.abort_declined(C1, "a task failed")
    for gate in GATES:
        assert gate(coord, None) == READY_OK  # 1 failure is tolerated
    trigger(h, coord)
    coord.abort_declined(C2, "a task failed")
    too_many = Check(
        CheckState.FAIL,
        "pipeline 'pipe': 2 consecutive checkpoint failures exceed tolerable_failures=1; "
        "triggering is stopped. Fix the cause, then reset the failure count (reset_failures) "
        "to resume",
    )
    for gate in GATES:
        assert gate(coord, None) == too_many
    coord.suspend("x")  # a stop with savepoint wins over the failure stop
    assert checks.check_min_pause(coord, None).state is CheckState.SKIP
    coord.resume()
    coord.reset_failures()
    for gate in GATES:
        assert gate(coord, None) == READY_OK
    assert trigger(h, coord) == C3


def test_an_expiry_found_by_the_concurrency_gate_counts_as_a_failure(h) -> None:
    coord = h.coordinator(timeout=60)  # tolerable_failures=0
    trigger(h, coord)
    h.t[0] = 1061.0
    assert checks.check_concurrency(coord, None) == Check(
        CheckState.FAIL,
        "pipeline 'pipe': 1 consecutive checkpoint failures exceed tolerable_failures=0; "
        "triggering is stopped. Fix the cause, then reset the failure count (reset_failures) "
        "to resume",
    )
    assert record(coord, C1).abort_reason is AbortReason.EXPIRED


# ---- run_check: the entry point of the sensors and the trigger ------------------------------


def test_run_check_quiet_end_to_end(h) -> None:
    config = {"pipeline": "pipe", "storage": h.store.url}
    assert checks.run_check("quiet", config, {}) == Check(
        CheckState.READY, "no checkpoint in flight"
    )
    live = CheckpointCoordinator(h.store, h.config())  # the real clock, as run_check's own
    cid = live.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0})).checkpoint_id
    assert cid == C1
    assert checks.run_check("quiet", config, {}) == Check(
        CheckState.WAIT, "checkpoint(s) in flight: [1]"
    )
    assert checks.run_check("acks", config, {}, 1) == Check(
        CheckState.WAIT, "checkpoint 1: waiting for 2 ack(s): ['agg#0', 'source#0']"
    )
    ack(h, live, C1, *TASKS)
    live.complete(C1)
    assert checks.run_check("quiet", config, {}) == Check(
        CheckState.READY, "no checkpoint in flight"
    )
    live.suspend("x")
    assert checks.run_check("min_pause", config, {}) == Check(
        CheckState.SKIP, "stopped: x; restore to resume"
    )


def test_run_check_quiet_expires_a_checkpoint_triggered_long_ago(h) -> None:
    # The harness clock says 1970-01-01T00:16:40: to the real clock the checkpoint is expired.
    config = {"pipeline": "pipe", "storage": h.store.url, "timeout": "10min"}
    trigger(h, h.coordinator(timeout="10min"))
    assert checks.run_check("quiet", config, {}) == Check(
        CheckState.READY, "no checkpoint in flight"
    )
    assert record(h.coordinator(), C1).abort_reason is AbortReason.EXPIRED


def test_trigger_serializes_its_kwargs_and_yields_the_first_non_wait(h) -> None:
    config = {"pipeline": "pipe", "storage": h.store.url}
    trigger_ = CheckpointConditionTrigger("quiet", config, {}, None, 0.01)
    path, kwargs = trigger_.serialize()
    assert path == "microcheckpoint_airflow.triggers.CheckpointConditionTrigger"
    assert kwargs == {
        "kind": "quiet",
        "config": config,
        "store_options": {},
        "checkpoint_id": None,
        "poll_interval": 0.01,
        "stage": None,
    }

    async def first_event():
        async for event in CheckpointConditionTrigger(**kwargs).run():
            return event.payload

    assert asyncio.run(first_event()) == {"state": "READY", "message": "no checkpoint in flight"}
