"""The trigger decider: stop, failures, max concurrent and min pause, in that order."""

from __future__ import annotations

from microcheckpoint.protocol.decider import TriggerDecision, Verdict, decide
from microcheckpoint.protocol.records import StopRecord
from tests.unit.protocol.helpers import TASKS, TP0, start


def test_an_idle_pipeline_may_trigger(h) -> None:
    coord = h.coordinator()
    assert decide(coord.view(), coord.config, stop=None, failures=0, now_ms=0) == TriggerDecision(
        Verdict.TRIGGER, "ok"
    )


def test_a_stop_wins_over_everything(h) -> None:
    coord = h.coordinator(min_pause=10)
    start(h, coord, {TP0: 1})
    decision = decide(
        coord.view(), coord.config, stop=StopRecord("savepoint", 1), failures=9, now_ms=0
    )
    assert decision.verdict is Verdict.SUSPENDED
    assert decision.reason == "stopped: savepoint; restore to resume"
    assert not decision.allowed


def test_failures_past_the_tolerance_win_over_waiting(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    start(h, coord, {TP0: 1})
    view = coord.view()
    assert decide(view, coord.config, stop=None, failures=1, now_ms=0).verdict is (
        Verdict.WAIT_MAX_CONCURRENT
    )
    stopped = decide(view, coord.config, stop=None, failures=2, now_ms=0)
    assert (stopped.verdict, stopped.reason) == (Verdict.STOPPED, "2 consecutive failures")


def test_min_pause_counts_from_the_latest_completion(h) -> None:
    coord = h.coordinator(min_pause=10)
    meta = h.epoch(coord, {TP0: 1})
    now = meta.completed_time_ms + 4_000
    waiting = decide(coord.view(), coord.config, stop=None, failures=0, now_ms=now)
    assert waiting.verdict is Verdict.WAIT_MIN_PAUSE
    assert waiting.wait_s == 6.0
    later = decide(coord.view(), coord.config, stop=None, failures=0, now_ms=now + 6_000)
    assert later.allowed


def test_max_concurrent_counts_checkpoints_in_flight(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 1})
    assert decide(coord.view(), coord.config, stop=None, failures=0, now_ms=0).allowed
    coord.trigger(TASKS, {TP0: 2})
    full = decide(coord.view(), coord.config, stop=None, failures=0, now_ms=0)
    assert (full.verdict, full.reason) == (
        Verdict.WAIT_MAX_CONCURRENT,
        "2 checkpoint(s) in flight, max_concurrent=2",
    )
