"""Python workers kept warm between epochs that are more than a minute apart.

Spark 4.3 ends a Python worker that has waited a minute for a task (a constant of its
``PythonWorkerFactory``, not a setting), and each Spark Connect session has workers of its
own. An epoch after a quiet minute therefore starts new workers, which import pyarrow and
the pipeline's code before its first batch: a 100k-record epoch over Connect on 2 cores took
1.19-1.27 s after 75 s of quiet, 0.51-0.59 s warm, 0.46-0.54 s with this running
(docs/cli.md). ``keep_warm`` runs a task on each of
``parallelism`` workers of the shared session (``engine.spark.connect_spark``'s, the one
every epoch joins) more often than that, so the next epoch finds them.

What it costs: a job of ``parallelism`` tasks that do nothing but wait a moment, every
``every_s`` seconds, and the workers' memory held between epochs (about 160 MB each after a
keyed epoch; ``docs/engine.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from microcheckpoint.errors import ConfigError

__all__ = ["IDLE_LIMIT_S", "MAX_EVERY_S", "check_warm_settings", "keep_warm", "touch_workers"]

IDLE_LIMIT_S = 60.0  # Spark ends a Python worker idle this long (PythonWorkerFactory)
MAX_EVERY_S = 50.0  # rounds start at most this far apart: a round itself takes time
_HOLD_S = 0.2  # each task waits this long, so the tasks overlap and take distinct workers


def check_warm_settings(parallelism: int, every_s: float, rounds: int | None) -> None:
    """Refuse settings that cannot keep workers warm.

    Raises:
        ConfigError: ``parallelism`` below 1, ``every_s`` not in (0, 50], or ``rounds``
            below 1.
    """
    if parallelism < 1:
        raise ConfigError(
            "parallelism", parallelism, "the number of Python workers to keep, 1 or more"
        )
    if not 0 < every_s <= MAX_EVERY_S:
        raise ConfigError(
            "every",
            every_s,
            f"seconds from one round's start to the next, above 0 and at most "
            f"{MAX_EVERY_S:.0f} (Spark ends a Python worker idle for {IDLE_LIMIT_S:.0f} s), "
            "e.g. 45",
        )
    if rounds is not None and rounds < 1:
        raise ConfigError("rounds", rounds, "1 or more, or leave it out to run until stopped")


def _hold(batches: Iterator[Any]) -> Iterator[Any]:
    """A task: wait a moment, then give this worker's process id."""
    import os

    import pyarrow as pa

    time.sleep(_HOLD_S)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()] * batch.num_rows})


def touch_workers(spark: Any, parallelism: int) -> list[int]:
    """One round: a task on each of ``parallelism`` workers.

    Args:
        spark: a Spark session (the shared Connect session, for the epochs' workers).
        parallelism: how many tasks run at once, each on a worker of its own (fewer when
            the cluster has fewer task slots).

    Returns:
        The process ids of the workers the tasks ran on, sorted.
    """
    frame = spark.range(0, parallelism, 1, parallelism).mapInArrow(_hold, "pid long")
    return sorted({row.pid for row in frame.collect()})


def keep_warm(
    session: Callable[[], Any],
    parallelism: int,
    every_s: float,
    rounds: int | None = None,
    report: Callable[[int, list[int], float], None] | None = None,
    failed: Callable[[int, Exception], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[list[int] | None]:
    """Touch ``parallelism`` workers in rounds that start ``every_s`` seconds apart,
    ``rounds`` times (None: until interrupted).

    Args:
        session: gives the Spark session; called again for the round after a failed one
            (a Connect server that restarted has forgotten the session).
        parallelism, every_s, rounds: as ``check_warm_settings``.
        report: ``report(round, pids, seconds)`` after each round that ran.
        failed: ``failed(round, error)`` after a round that raised; without it the error
            ends the rounds.
        sleep, clock: time, for tests.

    Returns:
        Each round's process ids, None for a failed round (kept only when ``rounds`` is
        given).

    Raises:
        ConfigError: as ``check_warm_settings``.
    """
    check_warm_settings(parallelism, every_s, rounds)
    seen: list[list[int] | None] = []
    spark = None
    round_no = 0
    next_start = clock()
    while rounds is None or round_no < rounds:
        sleep(max(0.0, next_start - clock()))
        started = clock()
        next_start = started + every_s
        round_no += 1
        pids: list[int] | None = None
        try:
            spark = spark or session()
            pids = touch_workers(spark, parallelism)
        except Exception as exc:
            if failed is None:
                raise
            failed(round_no, exc)
            spark = None
        if rounds is not None:
            seen.append(pids)
        if pids is not None and report is not None:
            report(round_no, pids, clock() - started)
    return seen
