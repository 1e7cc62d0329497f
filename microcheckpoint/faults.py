"""Named fault points: where tests kill or slow a running epoch, and nothing else.

Product code marks the points (``faults.point("after_snapshot")``, ``faults.reading_batches(...)``,
``faults.slow(...)``); whether a point fires is decided here, from two environment
variables a test sets for the job it starts (``harness.faults`` builds them):

- ``MICROCHECKPOINT_CRASH_AT=<point>``: SIGKILL the job's driver (and the executor process
  that reached the point) at ``<point>``, one of ``POINTS``;
- ``MICROCHECKPOINT_SLOW_ONCE=<file>``: the first epoch that reaches the slow point sleeps
  for the seconds written in ``<file>`` (``<seconds>``, or ``<pipeline> <seconds>`` for one
  pipeline only) and removes the file;
- ``MICROCHECKPOINT_SLOW_CHANNEL=<file>``: a stage sink delays the barrier marker of one
  internal-topic partition (a slow channel), once: the file holds ``<topic>:<partition>
  <seconds>`` and is removed when the delay starts.

Unset, every point is a no-op. ``Faults`` is captured on the driver and shipped to the
executors (it is picklable), so they know which process is the driver.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = [
    "CRASH_ENV",
    "POINTS",
    "SLOW_CHANNEL_ENV",
    "SLOW_ENV",
    "Faults",
    "channel_delay",
    "slow_point",
]

CRASH_ENV = "MICROCHECKPOINT_CRASH_AT"
SLOW_ENV = "MICROCHECKPOINT_SLOW_ONCE"
SLOW_CHANNEL_ENV = "MICROCHECKPOINT_SLOW_CHANNEL"
_sleep = time.sleep  # the slow point's own sleep (tests replace this, not time.sleep)
# Where a job can be killed, in the order an epoch reaches them.
POINTS = ("reading", "after_snapshot", "after_acks", "after_metadata")

T = TypeVar("T")


@dataclass(frozen=True)
class Faults:
    """The faults armed for one job; ``Faults()`` arms none."""

    crash_at: str | None = None
    driver_pid: int = 0
    slow_flag: str | None = None

    @classmethod
    def from_env(cls) -> Faults:
        """The faults the environment arms, with this process as the driver."""
        return cls(os.environ.get(CRASH_ENV) or None, os.getpid(), os.environ.get(SLOW_ENV))

    def point(self, name: str) -> None:
        """Kill the driver and this process if the crash is armed at ``name``."""
        if self.crash_at != name:
            return
        if self.driver_pid and self.driver_pid != os.getpid():
            os.kill(self.driver_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def reading_batches(self, batches: Iterable[T]) -> Iterable[T]:
        """``batches``, with the ``reading`` point once the first of them has been consumed."""
        if self.crash_at != "reading":
            return batches
        return self._crash_after_first(batches)

    def _crash_after_first(self, batches: Iterable[T]) -> Iterator[T]:
        for batch in batches:
            yield batch
            self.point("reading")

    def slow(self, pipeline: str) -> None:
        """The slow point: sleep once if ``MICROCHECKPOINT_SLOW_ONCE`` armed it."""
        slow_point(self.slow_flag, pipeline)


def slow_point(flag: str | None, pipeline: str) -> None:
    """Sleep once for the seconds written in file ``flag``.

    The file holds ``<seconds>`` (any pipeline) or ``<pipeline> <seconds>`` (only that
    one: other pipelines sharing the environment pass by). It is removed before sleeping,
    so only one epoch (the first to see it) is slow.
    """
    if not flag:
        return
    try:
        words = Path(flag).read_text().split()
        if len(words) == 2 and words[0] != pipeline:
            return
        seconds = float(words[-1]) if words else 0.0
        os.remove(flag)
    except (FileNotFoundError, ValueError):
        return
    _sleep(seconds)


def channel_delay(topic: str, partition: int) -> float:
    """Seconds to hold back the marker of ``topic``'s ``partition`` (0 unless
    ``MICROCHECKPOINT_SLOW_CHANNEL`` names it; the file is removed, so it fires once)."""
    flag = os.environ.get(SLOW_CHANNEL_ENV)
    if not flag:
        return 0.0
    try:
        channel, seconds = Path(flag).read_text().split()
        if channel != f"{topic}:{partition}":
            return 0.0
        os.remove(flag)
        return float(seconds)
    except (FileNotFoundError, ValueError):
        return 0.0
