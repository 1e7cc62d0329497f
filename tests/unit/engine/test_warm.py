"""``engine.warm.keep_warm``: rounds start ``every_s`` apart, a failed round is reported and
the next one asks for a new session, and the settings are checked first."""

from __future__ import annotations

from typing import Any

import pytest

from microcheckpoint.engine import warm
from microcheckpoint.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_rounds_start_every_seconds_apart_whatever_a_round_takes(monkeypatch) -> None:
    clock = Clock()
    took = iter([3.0, 0.5, 10.0])

    def touch(spark: Any, parallelism: int) -> list[int]:
        clock.now += next(took)
        return [11, 12][:parallelism]

    monkeypatch.setattr(warm, "touch_workers", touch)
    reports: list[tuple[int, list[int], float]] = []
    seen = warm.keep_warm(
        lambda: "spark", 2, 45, 3, lambda *r: reports.append(r), None, clock.sleep, clock.time
    )
    assert seen == [[11, 12]] * 3
    assert clock.slept == [0.0, 42.0, 44.5]  # each round starts 45 s after the one before
    assert reports == [(1, [11, 12], 3.0), (2, [11, 12], 0.5), (3, [11, 12], 10.0)]


def test_a_failed_round_is_reported_and_the_next_asks_for_a_new_session(monkeypatch) -> None:
    clock = Clock()
    sessions: list[str] = []
    outcomes = iter([RuntimeError("server restarting"), [7], [7]])

    def session() -> str:
        sessions.append(f"s{len(sessions) + 1}")
        return sessions[-1]

    def touch(spark: Any, parallelism: int) -> list[int]:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(warm, "touch_workers", touch)
    failures: list[tuple[int, str]] = []
    seen = warm.keep_warm(
        session, 1, 10, 3, None, lambda n, e: failures.append((n, str(e))), clock.sleep, clock.time
    )
    assert seen == [None, [7], [7]]
    assert failures == [(1, "server restarting")]
    assert sessions == ["s1", "s2"]  # a new session after the failure, then kept


def test_without_a_failure_handler_the_error_ends_the_rounds(monkeypatch) -> None:
    def touch(spark: Any, parallelism: int) -> list[int]:
        raise RuntimeError("gone")

    monkeypatch.setattr(warm, "touch_workers", touch)
    with pytest.raises(RuntimeError, match="gone"):
        warm.keep_warm(lambda: "spark", 1, 10, 2, sleep=lambda s: None)


@pytest.mark.parametrize(
    ("parallelism", "every", "rounds", "field"),
    [(0, 45, None, "parallelism"), (2, 0, None, "every"), (2, 50.5, None, "every"),
     (2, -1, None, "every"), (2, 45, 0, "rounds")],
)  # fmt: skip
def test_settings_that_cannot_keep_workers_warm_are_refused_first(
    monkeypatch, parallelism: int, every: float, rounds: int | None, field: str
) -> None:
    monkeypatch.setattr(warm, "touch_workers", lambda *a: pytest.fail("a round ran"))
    with pytest.raises(ConfigError) as info:
        warm.keep_warm(lambda: pytest.fail("connected"), parallelism, every, rounds)
    assert info.value.field == field


def test_fifty_seconds_is_the_longest_gap_allowed() -> None:
    warm.check_warm_settings(1, warm.MAX_EVERY_S, 1)  # no error
    assert warm.MAX_EVERY_S < warm.IDLE_LIMIT_S
