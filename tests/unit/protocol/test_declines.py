"""A failed task declines its checkpoint, and the abort names the task and the cause, as
Flink's DeclineCheckpoint does (``protocol.declines``, ``recovery.abort_failed_run``)."""

from __future__ import annotations

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.declines import decline, read_decline
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history
from microcheckpoint.protocol.records import AbortReason, OutcomeRecord, read
from microcheckpoint.protocol.recovery import abort_failed_run
from tests.unit.conftest import AGG, SRC, TP0

EDGE = "a task of Airflow run manual__x failed"


def pending(h, tolerable: int = 5):  # type: ignore[no-untyped-def]
    """A triggered checkpoint whose processing attempt (2) began."""
    coord = h.coordinator(tolerable_failures=tolerable)
    cid = coord.trigger((SRC, AGG), {TP0: 4}, h.startup({TP0: 0})).checkpoint_id
    return coord, cid, coord.begin_attempt(cid)


def test_the_first_decline_of_an_attempt_is_kept(h) -> None:
    _, cid, attempt = pending(h)
    first = decline(h.store, h.layout, cid, attempt, "agg#0", "ValueError: bad row 3")
    second = decline(h.store, h.layout, cid, attempt, "driver", "PythonException: ...")
    assert first is not None and second == first
    assert (second.task, second.attempt, second.cause) == ("agg#0", 2, "ValueError: bad row 3")
    assert read_decline(h.store, h.layout, cid, attempt + 1) is None  # another attempt's


def test_an_abort_after_a_declined_attempt_names_the_task_and_the_cause(h) -> None:
    coord, cid, attempt = pending(h)
    decline(h.store, h.layout, cid, attempt, "agg#0", "ValueError: bad row 3")
    # Before the abort: the pending checkpoint shows who declined its current attempt.
    row = checkpoint_history(h.store, "pipe")["checkpoints"][0]
    assert (row["status"], row["failed_task"], row["cause"]) == (
        "PENDING",
        "agg#0",
        "ValueError: bad row 3",
    )
    abort_failed_run(coord, cid, EDGE)
    outcome = read(h.store, h.layout.outcome(cid), OutcomeRecord)
    assert outcome is not None and outcome.reason is AbortReason.DECLINED
    assert outcome.detail == "task agg#0: ValueError: bad row 3"
    assert (outcome.task, outcome.cause) == ("agg#0", "ValueError: bad row 3")
    history = checkpoint_history(h.store, "pipe")
    row = history["checkpoints"][0]
    assert {k: row[k] for k in ("status", "reason", "detail", "failed_task", "cause")} == {
        "status": "ABORTED",
        "reason": "DECLINED",
        "detail": "task agg#0: ValueError: bad row 3",
        "failed_task": "agg#0",
        "cause": "ValueError: bad row 3",
    }
    latest = history["latest"]["failed"]
    assert (latest["failed_task"], latest["cause"]) == ("agg#0", "ValueError: bad row 3")
    assert checkpoint_detail(h.store, "pipe", cid.value)["failed_task"] == "agg#0"


def test_without_a_decline_the_abort_keeps_the_edges_detail(h) -> None:
    coord, cid, _ = pending(h)
    abort_failed_run(coord, cid, EDGE)
    row = checkpoint_history(h.store, "pipe")["checkpoints"][0]
    assert row["detail"] == EDGE and "failed_task" not in row
    # An outcome stored before declines existed reads without a task.
    body = OutcomeRecord.aborted(AbortReason.DECLINED, EDGE, 5, "w").to_json()
    assert "task" not in body
    assert OutcomeRecord.from_json(body).task is None


def test_a_decline_of_an_older_attempt_is_not_the_current_attempts(h) -> None:
    coord, cid, attempt = pending(h)
    decline(h.store, h.layout, cid, attempt, "agg#0", "ValueError: bad row 3")
    coord.begin_attempt(cid)  # the next run re-runs the checkpoint
    assert "failed_task" not in checkpoint_history(h.store, "pipe")["checkpoints"][0]
    abort_failed_run(coord, cid, EDGE)
    assert checkpoint_history(h.store, "pipe")["checkpoints"][0]["detail"] == EDGE
    assert CheckpointId(1) == cid
