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
  <seconds>`` and is removed when the delay starts;
- ``MICROCHECKPOINT_HOLD_AT=<file>``: the first process to reach hold point ``<point>``
  (one of ``HOLD_POINTS``: ``reading``, once a split's first batch has been read;
  ``publishing``, once the Kafka sink has published an epoch's first target partition and
  before the rest) waits there until the test releases it. The file holds ``<point>
  <seconds>``: the holder renames it to ``<file>.held`` (so exactly one process holds, and
  the test sees that the point was reached), then waits until ``<file>.held`` is removed,
  at most ``<seconds>``. Tests restart a broker while an epoch is held (``harness.faults``).

Unset, every point is a no-op. ``Faults`` is captured on the driver and shipped to the
executors (it is picklable), so they know which process is the driver.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = [
    "CRASH_ENV",
    "HOLD_ENV",
    "HOLD_POINTS",
    "POINTS",
    "SLOW_CHANNEL_ENV",
    "SLOW_ENV",
    "Faults",
    "channel_delay",
    "hold_point",
    "slow_point",
]

CRASH_ENV = "MICROCHECKPOINT_CRASH_AT"
SLOW_ENV = "MICROCHECKPOINT_SLOW_ONCE"
SLOW_CHANNEL_ENV = "MICROCHECKPOINT_SLOW_CHANNEL"
HOLD_ENV = "MICROCHECKPOINT_HOLD_AT"
_sleep = time.sleep  # the slow point's own sleep (tests replace this, not time.sleep)
# Where a job can be killed, in the order an epoch reaches them.
POINTS = ("reading", "after_snapshot", "after_acks", "after_metadata")
# Where a job can be held while a test breaks something around it (a broker restart).
HOLD_POINTS = ("reading", "publishing")
_HOLD_POLL_S = 0.05

T = TypeVar("T")


@dataclass(frozen=True)
class Faults:
    """The faults armed for one job; ``Faults()`` arms none."""

    crash_at: str | None = None
    driver_pid: int = 0
    slow_flag: str | None = None
    hold_flag: str | None = None

    @classmethod
    def from_env(cls) -> Faults:
        """The faults the environment arms, with this process as the driver."""
        return cls(
            os.environ.get(CRASH_ENV) or None,
            os.getpid(),
            os.environ.get(SLOW_ENV),
            os.environ.get(HOLD_ENV) or None,
        )

    def point(self, name: str, reached: Callable[[], object] | None = None) -> None:
        """Kill the driver and this process if the crash is armed at ``name``; ``reached``
        waits until the point is passed (``after_metadata``: the ``_metadata`` write that
        ``complete(then_notify=True)`` sent in the background)."""
        if self.crash_at != name:
            return
        if reached is not None:
            reached()
        if self.driver_pid and self.driver_pid != os.getpid():
            os.kill(self.driver_pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def reading_batches(self, batches: Iterable[T]) -> Iterable[T]:
        """``batches``, with the ``reading`` point (crash or hold) once the first of them
        has been consumed."""
        if self.crash_at != "reading" and not self.hold_flag:
            return batches
        return self._after_first(batches)

    def _after_first(self, batches: Iterable[T]) -> Iterator[T]:
        first = True
        for batch in batches:
            yield batch
            if first:
                first = False
                self.hold("reading")
            self.point("reading")

    def hold(self, name: str, before: Callable[[], object] | None = None) -> None:
        """The hold point ``name``: wait while a test holds it (see ``hold_point``)."""
        hold_point(self.hold_flag, name, before)

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


def hold_point(flag: str | None, point: str, before: Callable[[], object] | None = None) -> bool:
    """Hold here if file ``flag`` (``<point> <seconds>``) arms ``point``; True if it held.

    Steps: 1. unless the file names ``point``, return at once (nothing is called);
    2. call ``before`` (a sink flushes what it sent, so the hold is between two published
    parts); 3. rename the file to ``<flag>.held``: one process wins, the others pass by;
    4. wait until ``<flag>.held`` is removed (the test's release), at most ``<seconds>``.
    """
    # Step 1
    if not flag:
        return False
    try:
        name, seconds = Path(flag).read_text().split()
        limit = float(seconds)
    except (FileNotFoundError, ValueError):
        return False
    if name != point:
        return False
    # Step 2
    if before is not None:
        before()
    # Step 3
    held = Path(f"{flag}.held")
    try:
        os.rename(flag, held)
    except FileNotFoundError:
        return False  # another process holds it
    # Step 4
    deadline = time.monotonic() + limit
    while held.exists() and time.monotonic() < deadline:
        time.sleep(_HOLD_POLL_S)
    return True


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
