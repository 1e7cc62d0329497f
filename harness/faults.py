"""Arming the named fault points of ``microcheckpoint.faults`` for a job a test starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from microcheckpoint.faults import CRASH_ENV, HOLD_ENV, HOLD_POINTS, POINTS, SLOW_ENV

__all__ = ["Hold", "crash_env", "slow_once"]


def crash_env(point: str) -> dict[str, str]:
    """Environment variables that SIGKILL a job at ``point`` (one of ``POINTS``)."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
    return {CRASH_ENV: point}


def slow_once(flag: Path, seconds: float, pipeline: str | None = None) -> dict[str, str]:
    """Write ``flag`` so the first epoch (of ``pipeline``, if given) to reach the slow point
    sleeps ``seconds``; returns the environment variable that points the job at it."""
    flag.write_text(f"{pipeline} {seconds}" if pipeline else f"{seconds}")
    return {SLOW_ENV: str(flag)}


class Hold:
    """Arms hold point ``point`` for a job and lets the test wait for it and release it.

    ``env`` points the job at the flag file; ``wait_reached`` returns once a process holds
    the point; ``release`` lets it go on. ``limit_s`` bounds the hold if the test never
    releases it (a failed test does not leave a job waiting for ever).
    """

    def __init__(self, flag: Path, point: str, limit_s: float = 300.0) -> None:
        if point not in HOLD_POINTS:
            raise ValueError(f"unknown hold point {point!r}; known: {', '.join(HOLD_POINTS)}")
        self.flag, self.held = flag, Path(f"{flag}.held")
        flag.write_text(f"{point} {limit_s}")
        self.env = {HOLD_ENV: str(flag)}

    @property
    def reached(self) -> bool:
        return self.held.exists()

    def wait_reached(self, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
        """Wait until a process holds the point.

        Raises:
            TimeoutError: no process reached it within ``timeout_s``, or ``alive``
                answered False first (the job ended without reaching it).
        """
        deadline = time.monotonic() + timeout_s
        while not self.reached:
            if time.monotonic() > deadline or (alive is not None and not alive()):
                raise TimeoutError(f"no process reached the hold point of {self.flag}")
            time.sleep(0.05)

    def release(self) -> None:
        """Let the holder go on (and disarm the point if nothing reached it)."""
        self.held.unlink(missing_ok=True)
        self.flag.unlink(missing_ok=True)
