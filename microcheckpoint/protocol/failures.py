"""The failure manager: counts failed checkpoints and stops triggering past the tolerance.

(Flink's CheckpointFailureManager.) A failure is an EXPIRED or DECLINED checkpoint after
the latest completed one and after the latest reset; SUBSUMED, TRIGGER_REFUSED and
BASE_ABORTED do not count. The count is derived from storage, so every task agrees on it.
"""

from __future__ import annotations

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import TooManyFailures
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import FailuresReset, encode
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView
from microcheckpoint.storage.port import ObjectStore

__all__ = ["FailureManager"]


class FailureManager:
    """Consecutive checkpoint failures of one pipeline, and the stop they cause."""

    def __init__(self, store: ObjectStore, layout: Layout, config: CheckpointConfig) -> None:
        self.store = store
        self.layout = layout
        self.config = config

    def consecutive_failures(self, view: PipelineView) -> int:
        """Expired or declined checkpoints since the last completed one (and the last reset)."""
        floor = view.latest_completed.value if view.latest_completed else 0
        reset = view.marker(self.layout.failures_reset, FailuresReset)
        if reset is not None:
            floor = max(floor, reset.after_id)
        return sum(
            1
            for cid in view.ids(CheckpointStatus.ABORTED)
            if cid.value > floor
            and (reason := view.records[cid].abort_reason) is not None
            and reason.counts_as_failure
        )

    def ensure_can_continue(self, view: PipelineView) -> None:
        """Raise ``TooManyFailures`` once consecutive failures exceed ``tolerable_failures``."""
        failures = self.consecutive_failures(view)
        if failures > self.config.tolerable_failures:
            raise TooManyFailures(
                f"pipeline {self.config.pipeline!r}: {failures} consecutive checkpoint failures "
                f"exceed tolerable_failures={self.config.tolerable_failures}; triggering is stopped. "
                "Fix the cause, then reset the failure count (reset_failures) to resume"
            )

    def reset(self, view: PipelineView, now_ms: int) -> None:
        """A person acknowledges the failures: only later aborts count from now on."""
        after = view.max_id.value if view.max_id else 0
        self.store.put(self.layout.failures_reset, encode(FailuresReset(after, now_ms)))
