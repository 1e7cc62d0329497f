"""What the sensors and their deferrable triggers wait for, as one function per condition.

Each check reads checkpoint storage through the coordinator and answers READY, WAIT,
SKIP (the pipeline was stopped with a savepoint: nothing to do) or FAIL (with the
message the task fails with). Checks that find an expired checkpoint abort it as
EXPIRED, so expiry does not depend on which task notices first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import NotAligned
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops import in_flight_now
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.records import AbortReason, PendingRecord, read
from microcheckpoint.protocol.recovery import alignment_wait
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView

__all__ = [
    "IN_TASK_WAIT_S",
    "AlignmentProbe",
    "Check",
    "CheckState",
    "KINDS",
    "deadline_checker",
    "run_check",
    "wait_out_short_pause",
]

# A min pause with at most this left is waited out in the task, not deferred: a deferral
# costs the triggerer's round trip and a second task start, and Airflow 3.3.2 can kill an
# attempt resumed within seconds of its deferral (the deferring process's stale "success"
# drained after the resumed attempt is running: apache/airflow#72716, seen at 6 s on a
# busy machine). Longer waits, and waits for a checkpoint in flight, defer.
IN_TASK_WAIT_S = 10.0


class CheckState(str, Enum):
    READY = "READY"
    WAIT = "WAIT"
    SKIP = "SKIP"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    """A check's answer; ``wait_s`` is what is left of the min pause when it is known
    (not carried by the trigger's event, not compared)."""

    state: CheckState
    message: str
    wait_s: float | None = field(default=None, compare=False)

    def to_event(self) -> dict[str, str]:
        return {"state": self.state.value, "message": self.message}

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Check:
        return cls(CheckState(event["state"]), str(event.get("message", "")))


def wait_out_short_pause(
    look: Callable[[], Check],
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Check:
    """``look()``, and while it waits for a min pause with at most ``IN_TASK_WAIT_S`` left:
    sleep that out (saying so through ``say``) and look again. Returns the first other
    answer, which may still be WAIT (a longer pause, a checkpoint in flight): that one
    defers."""
    check = look()
    while (
        check.state is CheckState.WAIT
        and check.wait_s is not None
        and check.wait_s <= IN_TASK_WAIT_S
    ):
        say(f"{check.message}; waiting {check.wait_s:.1f} s in the task")
        sleep(check.wait_s + 0.05)
        check = look()
    return check


def _coordinator(config: dict[str, Any], store_options: dict[str, Any]) -> CheckpointCoordinator:
    cfg = CheckpointConfig.from_mapping(config)
    return CheckpointCoordinator(open_store(cfg.storage, **store_options), cfg)


def _gate(
    coord: CheckpointCoordinator, waits: tuple[Verdict, ...], view: PipelineView | None = None
) -> Check:
    decision = coord.trigger_decision(view)
    if decision.verdict is Verdict.SUSPENDED:
        return Check(CheckState.SKIP, decision.reason)
    if decision.verdict is Verdict.STOPPED:
        try:
            coord.ensure_can_continue()
        except Exception as exc:
            return Check(CheckState.FAIL, str(exc))
    if decision.verdict in waits:
        pause = decision.wait_s if decision.verdict is Verdict.WAIT_MIN_PAUSE else None
        return Check(CheckState.WAIT, decision.reason, pause)
    return Check(CheckState.READY, decision.reason)


def check_min_pause(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """The min pause since the last completed checkpoint has passed (and not stopped)."""
    return _gate(coord, (Verdict.WAIT_MIN_PAUSE,))


def check_concurrency(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """Fewer than max_concurrent checkpoints in flight (expired ones are aborted first).
    One listing serves both steps unless an abort changed what it shows."""
    view = coord.view()
    if coord.abort_expired(view):
        view = coord.view()
    return _gate(coord, (Verdict.WAIT_MAX_CONCURRENT, Verdict.WAIT_MIN_PAUSE), view)


def expire_if_late(coord: CheckpointCoordinator, cid: CheckpointId) -> Check | None:
    """Abort ``cid`` as EXPIRED when its timeout has passed; the FAIL to report, else None."""
    expired = coord.expire_if_late(cid)
    return None if expired is None else Check(CheckState.FAIL, str(expired))


def check_acks(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """Every expected task acked checkpoint ``cid``'s current attempt within the timeout."""
    assert cid is not None
    view = coord.view()
    record = view.records.get(cid)
    if record is None:
        return Check(CheckState.FAIL, f"checkpoint {cid} of {coord.config.pipeline!r} is gone")
    if record.status in (CheckpointStatus.COMPLETED, CheckpointStatus.COMPLETING):
        return Check(CheckState.READY, f"checkpoint {cid} is {record.status.value}")
    if record.status is not CheckpointStatus.PENDING:
        reason = record.abort_reason.value if record.abort_reason else record.status.value
        if record.abort_reason is AbortReason.SUBSUMED:
            # A newer checkpoint completed first and covers this one: not a failure.
            return Check(CheckState.SKIP, f"checkpoint {cid} was subsumed by a newer one")
        return Check(CheckState.FAIL, f"checkpoint {cid} was aborted: {reason}")
    late = expire_if_late(coord, cid)
    if late is not None:
        return late
    missing = coord.load_pending(cid, view).missing
    if missing:
        return Check(
            CheckState.WAIT,
            f"checkpoint {cid}: waiting for {len(missing)} ack(s): {sorted(map(str, missing))}",
        )
    return Check(CheckState.READY, f"checkpoint {cid}: all acks in")


def check_deadline(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """Checkpoint ``cid`` is decided within ``timeout`` of its trigger; at the deadline it is
    aborted as EXPIRED here, so acks that arrive later are discarded (Flink's checkpoint
    timeout, run beside the epoch task).

    Reads ``_outcome`` (and ``_pending`` while undecided): two small reads per look.
    READY: completed (or its completion claimed). WAIT: undecided, before the deadline.
    FAIL: expired, by this check or another writer (the message of ``CheckpointExpired``).
    SKIP: gone, or aborted for another reason (the task that aborted it says why).
    """
    assert cid is not None
    outcome = coord.outcome(cid)
    if outcome is None:
        pending = read(coord.store, coord.layout.pending(cid), PendingRecord)
        if pending is None:
            return Check(CheckState.SKIP, f"checkpoint {cid} of {coord.config.pipeline!r} is gone")
        left_ms = pending.trigger_time_ms + coord.config.timeout * 1000 - coord.now_ms()
        if left_ms >= 0:
            return Check(
                CheckState.WAIT, f"checkpoint {cid}: {left_ms / 1000:.1f} s to its deadline"
            )
        late = expire_if_late(coord, cid)
        if late is not None:
            return late
        outcome = coord.outcome(cid)  # it completed meanwhile
    if outcome is not None and outcome.completed:
        return Check(CheckState.READY, f"checkpoint {cid} completed within its timeout")
    if outcome is not None and outcome.reason is AbortReason.EXPIRED:
        late = expire_if_late(coord, cid)  # the error's message, for the task's failure
        if late is not None:
            return late
    reason = "ABORTED" if outcome is None or outcome.reason is None else outcome.reason.value
    return Check(CheckState.SKIP, f"checkpoint {cid} was aborted ({reason}): nothing to expire")


def check_base_state(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """The checkpoint ``cid`` continues from has all its state (acked or completed)."""
    assert cid is not None
    view = coord.view()
    base_id = view.pending_record(cid).base
    if base_id is None:
        return Check(CheckState.READY, "no base checkpoint")
    record = view.records.get(base_id)
    if record is None or record.status is CheckpointStatus.COMPLETED:
        return Check(CheckState.READY, f"base {base_id} completed")
    if record.status is CheckpointStatus.ABORTED:
        return Check(CheckState.FAIL, f"checkpoint {cid} continues from aborted {base_id}")
    if record.status is CheckpointStatus.COMPLETING or not coord.load_pending(base_id).missing:
        return Check(CheckState.READY, f"base {base_id} fully acknowledged")
    return Check(CheckState.WAIT, f"waiting for the state of checkpoint {base_id}")


def check_quiet(coord: CheckpointCoordinator, cid: CheckpointId | None) -> Check:
    """No checkpoint is in flight (expired ones are aborted first)."""
    busy = in_flight_now(coord)
    if busy:
        return Check(CheckState.WAIT, f"checkpoint(s) in flight: {[c.value for c in busy]}")
    return Check(CheckState.READY, "no checkpoint in flight")


class AlignmentProbe:
    """A stage's source port, opened once and kept across the polls of one wait, so each
    channel is read on from where the previous look stopped.

    ``stage``: ``{"pipeline": "module:attr", "pipeline_kwargs": {...}, "bootstrap":
    "host:port", "since": <epoch seconds the wait began>}`` (JSON, for the trigger's kwargs).
    """

    def __init__(self, stage: dict[str, Any], store_options: dict[str, Any]) -> None:
        self.stage = stage
        self.store_options = store_options
        self.kafka: Any = None
        self.port: Any = None
        self.topics: tuple[str, ...] = ()

    def open(self, config: CheckpointConfig) -> Any:
        if self.port is None:
            from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
            from microcheckpoint.engine.sources import source_offsets
            from microcheckpoint_airflow.spec import PipelineSpec

            spec = PipelineSpec(
                name=config.pipeline,
                pipeline=self.stage["pipeline"],
                checkpointing=config.to_mapping(),
                pipeline_kwargs=dict(self.stage.get("pipeline_kwargs") or {}),
            )
            pipeline = spec.load_pipeline()
            self.kafka = KafkaOffsets(self.stage["bootstrap"])
            self.port = source_offsets(pipeline.source, self.kafka, self.store_options)
            self.topics = tuple(config.topics or pipeline.source.topics)
        return self.port

    def close(self) -> None:
        if self.kafka is not None:
            self.kafka.close()
            self.kafka = self.port = None


def check_aligned(coord: CheckpointCoordinator, probe: AlignmentProbe) -> Check:
    """Every input channel of a stage has the upstream's next barrier marker (aligned), or
    one has (unaligned), or ``aligned_timeout`` passed: the trigger would not wait."""
    gate = _gate(coord, ())
    if gate.state is not CheckState.READY:
        return gate
    port = probe.open(coord.config)
    waited = max(0.0, time.time() - float(probe.stage["since"]))
    try:
        waiting = alignment_wait(coord, port, probe.topics, waited)
    except NotAligned as exc:
        return Check(CheckState.FAIL, str(exc))
    if waiting is not None:
        return Check(CheckState.WAIT, waiting)
    return Check(CheckState.READY, f"stage inputs ready to cut after {waited:.1f} s")


KINDS = {
    "min_pause": check_min_pause,
    "concurrency": check_concurrency,
    "acks": check_acks,
    "deadline": check_deadline,
    "base_state": check_base_state,
    "quiet": check_quiet,
    "aligned": check_aligned,
}


def deadline_checker(config: dict[str, Any], store_options: dict[str, Any]) -> Any:
    """``check_deadline`` for one pipeline as a function of the checkpoint id, with its
    store opened once (it is polled every second)."""
    coord = _coordinator(config, store_options)
    return lambda checkpoint_id: check_deadline(coord, CheckpointId(int(checkpoint_id)))


def run_check(
    kind: str,
    config: dict[str, Any],
    store_options: dict[str, Any],
    checkpoint_id: int | None = None,
    probe: AlignmentProbe | None = None,
) -> Check:
    """Run the check ``kind`` (one of ``KINDS``) for the pipeline configured by ``config``;
    ``aligned`` looks through ``probe``."""
    coord = _coordinator(config, store_options)
    if kind == "aligned":
        assert probe is not None
        return check_aligned(coord, probe)
    cid = None if checkpoint_id is None else CheckpointId(int(checkpoint_id))
    return KINDS[kind](coord, cid)
