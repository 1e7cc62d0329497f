"""Flink's checkpoint timeout, enforced in the process that runs the epoch.

A checkpoint not complete within ``timeout`` of its trigger is aborted as EXPIRED at that
moment, whatever the epoch's job is doing: acks that arrive later are discarded, and the
complete step then fails with ``CheckpointExpired``. ``DeadlineWatch`` does this from a
thread beside the epoch, with a coordinator of its own (none of the epoch's caches are
shared between the two threads; the outcome's put-if-absent decides between the abort and
a completion that comes at the same moment).

A process that dies takes its watch with it: then whoever looks next aborts the expired
checkpoint (the failed task's clean-up, the next trigger's gate), and a late completion
expires instead (``recovery.complete_checkpoint``).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from microcheckpoint.errors import CheckpointExpired
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.view import CheckpointStatus

__all__ = ["DeadlineWatch"]

log = logging.getLogger(__name__)

# The longest real wait between two looks at the coordinator's clock: a clock that is not
# the wall clock (a test's) is seen to pass the deadline within this.
RECHECK_S = 1.0
# How long leaving the watch waits for an abort under way to finish.
JOIN_S = 60.0


class DeadlineWatch:
    """Aborts checkpoint ``cid`` as EXPIRED at trigger time + the configured timeout, unless
    it is decided first or the watch is left first.

    Use it as a context manager around the epoch's processing and its complete step::

        with DeadlineWatch(coordinator, cid, plan.trigger_time_ms) as deadline:
            ...  # process, then complete

    ``expired`` is the error to report once this watch aborted the checkpoint (None
    otherwise). Leaving the watch stops it and waits for an abort under way.

    Steps of the thread: 1. wait until the deadline by the coordinator's clock (or until
    the watch is left); 2. abort the checkpoint as EXPIRED when it is still pending
    (``CheckpointCoordinator.expire_if_late``, on a listing of now); 3. when it was still
    within its timeout by a clock that moved back, wait again.
    """

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        cid: CheckpointId,
        trigger_time_ms: int,
    ) -> None:
        # A coordinator of its own: the epoch's coordinator caches records and plans that
        # its own thread reads and writes.
        self._coordinator = CheckpointCoordinator(
            coordinator.store, coordinator.config, clock=coordinator.clock
        )
        self.cid = cid
        self.deadline_ms = trigger_time_ms + int(coordinator.config.timeout * 1000)
        self.expired: CheckpointExpired | None = None
        self._left = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name=f"deadline-{coordinator.config.pipeline}-{cid}", daemon=True
        )

    def __enter__(self) -> DeadlineWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._left.set()
        self._thread.join(JOIN_S)

    def _watch(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the complete step checks the timeout again
            log.warning("checkpoint %s: the timeout's watch failed: %s", self.cid, exc)

    def _run(self) -> None:
        coord = self._coordinator
        while True:
            # Step 1: one millisecond past the deadline (``expire_if_late`` is strict).
            left_s = (self.deadline_ms + 1 - coord.now_ms()) / 1000
            if left_s > 0:
                if self._left.wait(min(left_s, RECHECK_S)):
                    return
                continue
            if self._left.is_set():
                return
            # Step 2
            view = coord.view()
            record = view.records.get(self.cid)
            if record is None or record.status is not CheckpointStatus.PENDING:
                return  # decided (or gone) before its deadline
            self.expired = coord.expire_if_late(self.cid, view)
            if self.expired is not None:
                log.warning(
                    "checkpoint %s of %r: its timeout (%gs) passed while the epoch ran: "
                    "aborted as EXPIRED; acks sent from now on are discarded",
                    self.cid,
                    coord.config.pipeline,
                    coord.config.timeout,
                )
                return
            # Step 3: completed meanwhile, or the clock stepped back.
            if coord.view().records[self.cid].status is not CheckpointStatus.PENDING:
                return
