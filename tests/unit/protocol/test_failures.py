"""Expiry, declines and the failure count (tolerable_failures, reset)."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import (
    TooManyFailures,
)
from microcheckpoint.protocol.coordinator import AbortOutcome
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.view import CheckpointStatus
from tests.unit.protocol.helpers import (
    C1,
    C2,
    C3,
    C4,
    SRC,
    TASKS,
    TP0,
    ack_all,
    barrier_json,
    complete_one,
    expire_one,
    read,
    start,
    status,
)

# ---- expiry and failures ----------------------------------------------------------------


def test_abort_expired_boundary(h) -> None:
    coord = h.coordinator(timeout="60s")
    start(h, coord, {TP0: 10})
    h.ack(coord, C1, SRC, handles=[h.write_state(C1, SRC, "s.bin", b"s")])
    h.t[0] = 1060.0
    assert coord.abort_expired() == []
    assert status(coord, C1) is CheckpointStatus.PENDING
    h.t[0] = 1060.25
    assert coord.abort_expired() == [C1]
    record = coord.view().records[C1]
    assert record.status is CheckpointStatus.ABORTED
    assert record.abort_reason is AbortReason.EXPIRED
    assert record.outcome.detail == "timeout 60.0s"
    # The failed checkpoint keeps only its markers.
    assert h.keys(h.layout.chk(C1)) == [h.layout.outcome(C1), h.layout.pending(C1)]
    assert coord.abort_expired() == []
    assert coord.consecutive_failures() == 1


def test_abort_expired_only_aborts_old_checkpoints(h) -> None:
    coord = h.coordinator(timeout="60s", max_concurrent=2, tolerable_failures=5)
    start(h, coord, {TP0: 10})
    h.t[0] = 1030.0
    coord.trigger(TASKS, {TP0: 20})
    h.t[0] = 1060.25
    assert coord.abort_expired() == [C1]
    view = coord.view()
    assert view.records[C1].abort_reason is AbortReason.EXPIRED
    # Checkpoint 2 was not expired; it continued from checkpoint 1, so it cannot complete.
    assert view.records[C2].abort_reason is AbortReason.BASE_ABORTED
    assert coord.consecutive_failures() == 1
    h.t[0] = 1100.0
    assert coord.abort_expired() == []


def test_abort_outcomes(h) -> None:
    coord = h.coordinator(tolerable_failures=3)
    start(h, coord, {TP0: 10})
    assert coord.abort_declined(C1, "task failed") is AbortOutcome.ABORTED
    assert coord.abort_declined(C1, "again") is AbortOutcome.ALREADY_ABORTED
    assert coord.view().records[C1].outcome.detail == "task failed"
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C2)
    coord.complete(C2)
    assert coord.abort_declined(C2, "too late") is AbortOutcome.ALREADY_COMPLETED
    assert status(coord, C2) is CheckpointStatus.COMPLETED


def test_tolerable_failures_stop_triggering(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    assert expire_one(h, coord, {TP0: 10}) == C1
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C2
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.STOPPED
    assert decision.reason == "2 consecutive failures"
    with pytest.raises(TooManyFailures) as caught:
        coord.trigger(TASKS, {TP0: 10})
    assert str(caught.value).startswith(
        "pipeline 'pipe': 2 consecutive checkpoint failures exceed tolerable_failures=1; "
    )
    assert coord.view().ids() == [C1, C2]


def test_declined_counts_as_failure(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    coord.abort_declined(C1, "boom")
    assert coord.trigger_decision().verdict is Verdict.STOPPED
    with pytest.raises(TooManyFailures):
        coord.ensure_can_continue()


def test_completed_checkpoint_resets_the_failure_count(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    assert expire_one(h, coord, {TP0: 10}) == C1
    assert complete_one(h, coord, {TP0: 10}) == C2
    assert coord.consecutive_failures() == 0
    assert expire_one(h, coord, {TP0: 20}) == C3
    assert coord.consecutive_failures() == 1
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert coord.trigger(TASKS, {TP0: 20}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [10, 20]}


def test_reset_failures_resumes_triggering(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    expire_one(h, coord, {TP0: 10})
    expire_one(h, coord, {TP0: 10})
    assert coord.trigger_decision().verdict is Verdict.STOPPED
    coord.reset_failures()
    assert read(h, h.layout.failures_reset)["after_id"] == 2
    assert coord.consecutive_failures() == 0
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C3
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C4
    assert coord.trigger_decision().verdict is Verdict.STOPPED
