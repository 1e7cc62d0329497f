"""How long a subtask's snapshot took, split as Flink splits it, for its ``Ack``.

Flink reports, per subtask, the synchronous part of a checkpoint (from the barrier to the
snapshot taken locally) and the asynchronous part (writing it to checkpoint storage). Here a
subtask's barrier is the start of its epoch: the barrier fixed the epoch's ranges before
any record was read, so the synchronous part covers restore, apply and serialize, and the
asynchronous part the uploads (``ObjectStore.put``) of its files. The end to end of a
subtask (trigger to ack) is computed by the history from the ack's ``acked_at_ms``.

The timer also records when the subtask's code began (``started_at_ms``, wall clock) and,
inside the ``reading()`` blocks, the time it spent receiving and decoding its rows
(``read_ms``), which is not part of the sync part: ``protocol.slowest`` splits a
subtask's end to end into waiting to start, read, keyed (sync), snapshot upload (async)
and ack with them.

Pure timing with ``time.perf_counter``: no I/O, and nothing here can fail a snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from microcheckpoint.ids import TaskId
from microcheckpoint.protocol.records.checkpoint import Ack

__all__ = ["AckTimer"]


class AckTimer:
    """Started when a subtask's code begins; ``reading()`` wraps receiving and decoding its
    rows, ``uploading()`` each write to storage.

    Edge cases: a subtask that writes nothing has an async part of 0 ms, one that is given
    no rows to read a read part of 0 ms; the parts are rounded to a microsecond, so a very
    fast sync part may read ``0.001`` but never less than 0.
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.started_at_ms = int(time.time() * 1000)
        self._upload_s = 0.0
        self._read_s = 0.0

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Count the time of the ``with`` block as reading the subtask's rows (not sync)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self._read_s += time.perf_counter() - began

    @contextmanager
    def uploading(self) -> Iterator[None]:
        """Count the time of the ``with`` block as upload (the async part)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self._upload_s += time.perf_counter() - began

    def parts(self) -> tuple[float, float]:
        """``(sync_ms, async_ms)`` as of now: elapsed since the start minus the reads and
        the uploads, and the uploads."""
        elapsed = time.perf_counter() - self._start
        sync_ms = round(max(0.0, elapsed - self._read_s - self._upload_s) * 1000, 3)
        return sync_ms, round(self._upload_s * 1000, 3)

    @property
    def read_ms(self) -> float:
        """The time spent in ``reading()`` blocks so far, in ms."""
        return round(self._read_s * 1000, 3)

    def ack(
        self,
        task: TaskId,
        attempt: int,
        handles: Iterable[Any] = (),
        operator_state: Mapping[str, Any] | None = None,
    ) -> Ack:
        """The subtask's ``Ack`` with its sync and async parts (call it when the snapshot
        is written, just before acknowledging)."""
        sync_ms, async_ms = self.parts()
        return Ack(
            task,
            attempt,
            tuple(handles),
            dict(operator_state or {}),
            duration_ms=round(sync_ms + async_ms),
            sync_ms=sync_ms,
            async_ms=async_ms,
            started_at_ms=self.started_at_ms,
            read_ms=self.read_ms,
        )
