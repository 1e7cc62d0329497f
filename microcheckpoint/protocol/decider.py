"""The trigger decider: may a checkpoint be triggered now? (Flink's CheckpointRequestDecider.)

Pure: it reads a ``PipelineView`` and the facts the coordinator gathered (the stop record,
the failure count, the clock) and answers with a ``TriggerDecision``. The sensors ask it
before a run triggers, and ``trigger`` asks it again before allocating an id.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.protocol.records import StopRecord
from microcheckpoint.protocol.view import PipelineView

__all__ = ["TriggerDecision", "Verdict", "decide"]


class Verdict(Enum):
    TRIGGER = "TRIGGER"
    WAIT_MIN_PAUSE = "WAIT_MIN_PAUSE"
    WAIT_MAX_CONCURRENT = "WAIT_MAX_CONCURRENT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"


@dataclass(frozen=True)
class TriggerDecision:
    """Whether a checkpoint may be triggered now; ``wait_s`` is the min-pause remainder."""

    verdict: Verdict
    reason: str
    wait_s: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.TRIGGER


def decide(
    view: PipelineView,
    config: CheckpointConfig,
    *,
    stop: StopRecord | None,
    failures: int,
    now_ms: int,
) -> TriggerDecision:
    """The decision, checked in this order:

    1. stopped with a savepoint (``SUSPENDED``, until a restore);
    2. consecutive failures above ``tolerable_failures`` (``STOPPED``, until a reset);
    3. ``max_concurrent`` checkpoints in flight (``WAIT_MAX_CONCURRENT``);
    4. less than ``min_pause`` since the latest completed checkpoint (``WAIT_MIN_PAUSE``).
    """
    if stop is not None:
        return TriggerDecision(Verdict.SUSPENDED, f"stopped: {stop.reason}; restore to resume")
    if failures > config.tolerable_failures:
        return TriggerDecision(Verdict.STOPPED, f"{failures} consecutive failures")
    in_flight = len(view.in_flight)
    limit = config.effective_max_concurrent
    if in_flight >= limit:
        return TriggerDecision(
            Verdict.WAIT_MAX_CONCURRENT,
            f"{in_flight} checkpoint(s) in flight, max_concurrent={limit}",
        )
    latest = view.latest_completed
    if config.min_pause > 0 and latest is not None:
        since = (now_ms - view.metadata(latest).completed_time_ms) / 1000
        if since < config.min_pause:
            return TriggerDecision(
                Verdict.WAIT_MIN_PAUSE,
                f"{since:.1f}s since checkpoint {latest} completed, min_pause={config.min_pause}s",
                config.min_pause - since,
            )
    return TriggerDecision(Verdict.TRIGGER, "ok")
