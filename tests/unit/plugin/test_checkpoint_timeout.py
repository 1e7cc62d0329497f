"""The checkpoint timeout beside the epoch task: ``check_deadline`` and its trigger.

The check runs over a real file store with the ``h`` harness's clock moved by hand; the
trigger runs its real loop with the two Airflow look-ups (the epoch task's XCom and state)
replaced by a script, since only the triggerer can answer them (the e2e module runs it in
Airflow's real triggerer).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from microcheckpoint.errors import CheckpointExpired
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.recovery import complete_checkpoint
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint_airflow import checks
from microcheckpoint_airflow.checks import Check, CheckState
from microcheckpoint_airflow.triggers import CheckpointDeadlineTrigger

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
C1 = CheckpointId(1)
EXPIRED = (
    "checkpoint 1 of 'pipe' expired: not complete within timeout=60.0s of its trigger "
    "(aborted as EXPIRED; the next epoch re-reads its range)"
)


def trigger(h, coord: CheckpointCoordinator) -> CheckpointId:
    return coord.trigger((SRC, AGG), {TP0: 10}, h.startup({TP0: 0})).checkpoint_id


def test_waits_until_the_deadline_then_expires_and_late_acks_are_discarded(h) -> None:
    coord = h.coordinator(timeout=60, tolerable_failures=5)
    trigger(h, coord)  # at t = 1000 s: the deadline is 1060 s
    assert h.ack(coord, C1, AGG, handles=[h.write_state(C1, AGG, "s.bin", b"a")]) is (
        AckResult.SUCCESS
    )
    h.t[0] = 1059.75
    assert checks.check_deadline(coord, C1) == Check(
        CheckState.WAIT, "checkpoint 1: 0.2 s to its deadline"
    )
    h.t[0] = 1060.0
    assert checks.check_deadline(coord, C1).state is CheckState.WAIT  # the deadline itself
    h.t[0] = 1060.5
    assert checks.check_deadline(coord, C1) == Check(CheckState.FAIL, EXPIRED)
    outcome = coord.outcome(C1)
    assert outcome is not None and outcome.reason is AbortReason.EXPIRED
    assert outcome.at_ms == 1_060_500  # aborted at the look past the deadline
    # The late ack is discarded: nothing is written, and the checkpoint cannot complete.
    before = h.contents()
    assert before.keys() == {h.layout.pending(C1), h.layout.outcome(C1)}
    assert h.ack(coord, C1, SRC) is AckResult.DISCARDED
    assert h.ack(coord, C1, AGG, attempt=2) is AckResult.DISCARDED
    assert h.contents() == before
    # The epoch task's own complete step then fails naming the expiry, not a bare abort.
    with pytest.raises(CheckpointExpired) as caught:
        complete_checkpoint(coord, C1)
    assert str(caught.value) == EXPIRED
    # Looking again says the same, and writes nothing.
    assert checks.check_deadline(coord, C1) == Check(CheckState.FAIL, EXPIRED)
    assert h.contents() == before


def test_ready_when_completed_in_time_even_if_looked_at_after_the_deadline(h) -> None:
    coord = h.coordinator(timeout=60)
    trigger(h, coord)
    for task in (SRC, AGG):
        assert h.ack(coord, C1, task) is AckResult.SUCCESS
    coord.complete(C1)
    h.t[0] = 5000.0
    assert checks.check_deadline(coord, C1) == Check(
        CheckState.READY, "checkpoint 1 completed within its timeout"
    )
    assert coord.view().records[C1].status is CheckpointStatus.COMPLETED


def test_skips_a_checkpoint_aborted_for_another_reason_or_gone(h) -> None:
    coord = h.coordinator(timeout=60, tolerable_failures=5)
    trigger(h, coord)
    coord.abort_declined(C1, "a task failed")
    h.t[0] = 5000.0
    assert checks.check_deadline(coord, C1) == Check(
        CheckState.SKIP, "checkpoint 1 was aborted (DECLINED): nothing to expire"
    )
    assert coord.outcome(C1).reason is AbortReason.DECLINED
    assert checks.check_deadline(coord, CheckpointId(7)) == Check(
        CheckState.SKIP, "checkpoint 7 of 'pipe' is gone"
    )


class Scripted(CheckpointDeadlineTrigger):
    """The real trigger loop; the epoch task's XCom and state come from a script."""

    def __init__(self, ids: list[Any], states: list[str | None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ids, self.states = ids, states
        self.asked = 0
        self.task_instance = SimpleNamespace(  # as in the triggerer
            dag_id="d", run_id="r", task_id="checkpoint_timeout", map_index=-1, try_number=1
        )

    async def checkpoint_id(self) -> int | None:
        self.asked += 1
        return self.ids.pop(0) if len(self.ids) > 1 else self.ids[0]

    async def id_task_state(self) -> str | None:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def run(trigger_: CheckpointDeadlineTrigger) -> list[Any]:
    async def events() -> list[Any]:
        return [event async for event in trigger_.run()]

    return asyncio.run(events())


def kwargs(h, timeout: float) -> dict[str, Any]:
    config = {"pipeline": "pipe", "storage": h.store.url, "timeout": timeout}
    return {
        "config": config,
        "storage_conn_id": "none",
        "id_task": "process_epoch",
        "id_key": "checkpoint_id",
        "poll_interval": 0.05,
    }


def test_run_in_line_by_dag_test_the_trigger_hands_back_to_the_sensor(h) -> None:
    # dag.test() runs a trigger without a task instance, after the epoch task ended.
    events = run(CheckpointDeadlineTrigger(**kwargs(h, 60)))
    assert [e.payload for e in events] == [{"inline": True}]


def test_the_trigger_serializes_only_what_the_dag_gives_it(h) -> None:
    given = kwargs(h, 60)
    path, stored = CheckpointDeadlineTrigger(**given).serialize()
    assert path == "microcheckpoint_airflow.triggers.CheckpointDeadlineTrigger"
    assert stored == given
    assert CheckpointDeadlineTrigger(**stored).store_options() == {}  # file://: no connection


def test_the_trigger_waits_for_the_id_then_expires_at_the_deadline(h) -> None:
    # The epoch task pushes the id only after two looks; its checkpoint then hangs.
    coord = h.coordinator(timeout=1)
    coord.clock = time.time
    started = time.time()
    trigger(h, coord)
    scripted = Scripted([None, None, 1], ["running"], **kwargs(h, 1))
    events = run(scripted)
    assert [type(e) for e in events] == [TaskFailedEvent]
    assert scripted.asked == 3  # the XCom, asked while the task runs, has it the third time
    outcome = coord.outcome(C1)
    assert outcome is not None and outcome.reason is AbortReason.EXPIRED
    trigger_ms = coord.view().trigger_time_ms(C1)
    # Aborted at its deadline, within one poll (and the store's latency).
    assert trigger_ms + 1000 < outcome.at_ms <= trigger_ms + 1000 + 500
    assert time.time() - started < 3


def test_the_trigger_succeeds_when_the_checkpoint_completes_in_time(h) -> None:
    coord = h.coordinator(timeout=60)
    trigger(h, coord)
    for task in (SRC, AGG):
        h.ack(coord, C1, task)
    coord.complete(C1)
    assert [type(e) for e in run(Scripted([1], ["success"], **kwargs(h, 60)))] == [TaskSuccessEvent]


def test_the_trigger_skips_when_the_epoch_task_ends_without_a_checkpoint(h) -> None:
    # Queued, then a failure before the barrier: retried (up_for_retry keeps it waiting),
    # then failed. The XCom is asked for only while it runs and once it has ended.
    states = ["queued", "running", "up_for_retry", "failed"]
    scripted = Scripted([None], states, **kwargs(h, 60))
    assert [type(e) for e in run(scripted)] == [TaskSkippedEvent]
    assert scripted.asked == 2
    assert h.contents() == {}
