"""Arming the named fault points of ``microcheckpoint.faults`` for a job a test starts."""

from __future__ import annotations

from pathlib import Path

from microcheckpoint.faults import CRASH_ENV, POINTS, SLOW_ENV

__all__ = ["crash_env", "slow_once"]


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
