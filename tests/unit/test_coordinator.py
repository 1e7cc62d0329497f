"""The checkpoint coordinator over a real file store, with a clock moved by hand."""

from __future__ import annotations

import json

import pytest

from microcheckpoint.errors import (
    AcksMissing,
    CheckpointNotFound,
    CommitConflict,
    KafkaSourceError,
    TooManyFailures,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.coordinator import AbortOutcome, CheckpointCoordinator
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason, decode_metadata
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import WriteOutcome

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
TASKS = (SRC, AGG)
C1, C2, C3, C4 = (CheckpointId(n) for n in (1, 2, 3, 4))


def read(h, key: str) -> dict:
    obj = h.store.get(key)
    assert obj is not None, key
    return json.loads(obj.data)


def barrier_json(h, cid: CheckpointId) -> dict:
    """Barrier n as stored (it lives in ``_pending``; read through the coordinator)."""
    return h.coordinator().barrier(cid).to_json()


def status(coord: CheckpointCoordinator, cid: CheckpointId) -> CheckpointStatus:
    return coord.view().records[cid].status


def ack_all(h, coord, cid, attempt: int = 1, tasks=TASKS) -> None:
    for task in tasks:
        handle = h.write_state(cid, task, "s.bin", f"{task}/{attempt}".encode(), attempt)
        assert h.ack(coord, cid, task, attempt, [handle]) is AckResult.SUCCESS


def start(h, coord, ends, **offsets):
    """Trigger with every partition starting at 0 unless given."""
    return coord.trigger(TASKS, ends, h.startup({tp: offsets.get(str(tp), 0) for tp in ends}))


# ---- trigger ------------------------------------------------------------------------------


def test_trigger_allocates_dense_ids_and_chains_barriers(h) -> None:
    coord = h.coordinator()
    first = coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    assert first.checkpoint_id == C1
    assert first.attempt == 1
    assert first.expected == frozenset(TASKS)
    assert first.trigger_time_ms == 1_000_000
    assert barrier_json(h, C1) == {"events:0": [0, 10]}
    pending = read(h, h.layout.pending(C1))
    assert pending["checkpoint_id"] == 1
    assert pending["expected"] == ["agg#0", "source#0"]
    assert pending["base"] is None
    assert pending["trigger_time_ms"] == 1_000_000
    ack_all(h, coord, C1)
    coord.complete(C1)

    # A new partition appears: only it is asked for startup offsets.
    h.t[0] = 1010.0
    second = coord.trigger(TASKS, {TP0: 25, TP1: 7}, h.startup({TP0: 999, TP1: 3}))
    assert second.checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 25], "events:1": [3, 7]}
    assert read(h, h.layout.pending(C2))["base"] == 1
    ack_all(h, coord, C2)
    coord.complete(C2)

    third = coord.trigger(TASKS, {TP0: 25, TP1: 9}, h.startup({}))
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [25, 25], "events:1": [7, 9]}
    assert read(h, h.layout.pending(C3))["base"] == 2
    assert h.startup_calls == [[TP0], [TP1]]  # not called when nothing is new
    assert coord.view().ids() == [C1, C2, C3]


def test_trigger_without_startup_offsets_for_a_new_partition(h) -> None:
    coord = h.coordinator()
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP1: 5, TP0: 5})
    assert str(caught.value) == "partitions events:1, events:0 have no start offset"
    assert h.keys() == []


def test_trigger_when_a_checkpointed_partition_vanished(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 4, TP1: 4})
    ack_all(h, coord, C1)
    coord.complete(C1)
    with pytest.raises(KafkaSourceError, match=r"^partition events:1 has a start offset 4"):
        coord.trigger(TASKS, {TP0: 9})
    assert coord.view().ids() == [C1]


def test_max_records_per_epoch_caps_each_partition(h) -> None:
    coord = h.coordinator(max_records_per_epoch=4)
    expected = [
        {"events:0": [0, 4], "events:1": [0, 2]},
        {"events:0": [4, 8], "events:1": [2, 2]},
        {"events:0": [8, 10], "events:1": [2, 2]},
    ]
    for n, barrier in enumerate(expected, start=1):
        pending = start(h, coord, {TP0: 10, TP1: 2})
        assert pending.checkpoint_id == CheckpointId(n)
        assert barrier_json(h, pending.checkpoint_id) == barrier
        ack_all(h, coord, pending.checkpoint_id)
        meta = coord.complete(pending.checkpoint_id)
        assert meta.offsets == {TP0: barrier["events:0"][1], TP1: barrier["events:1"][1]}


# ---- min pause and max concurrent -------------------------------------------------------


def test_min_pause(h) -> None:
    coord = h.coordinator(min_pause="30s")
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    h.t[0] = 1005.0
    assert coord.complete(C1).completed_time_ms == 1_005_000

    h.t[0] = 1015.0
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MIN_PAUSE
    assert decision.wait_s == 20.0
    assert decision.allowed is False
    assert decision.reason == "10.0s since checkpoint 1 completed, min_pause=30.0s"
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP0: 20})
    assert str(caught.value) == (
        "pipeline 'pipe': 10.0s since checkpoint 1 completed, min_pause=30.0s"
    )
    assert coord.view().ids() == [C1]

    h.t[0] = 1034.75
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MIN_PAUSE
    assert decision.wait_s == 0.25

    h.t[0] = 1035.0
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.TRIGGER
    assert decision.wait_s == 0.0
    assert decision.allowed is True
    assert coord.trigger(TASKS, {TP0: 20}).checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 20]}


def test_min_pause_without_a_completed_checkpoint(h) -> None:
    coord = h.coordinator(min_pause="1h")
    assert coord.trigger_decision().verdict is Verdict.TRIGGER


def test_max_concurrent_one(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "1 checkpoint(s) in flight, max_concurrent=1"
    with pytest.raises(TriggerRefused) as caught:
        coord.trigger(TASKS, {TP0: 20})
    assert str(caught.value) == "pipeline 'pipe': 1 checkpoint(s) in flight, max_concurrent=1"
    assert coord.view().ids() == [C1]


def test_max_concurrent_two_chains_barriers(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 10})
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    second = coord.trigger(TASKS, {TP0: 25})
    assert second.checkpoint_id == C2
    assert barrier_json(h, C2) == {"events:0": [10, 25]}
    assert read(h, h.layout.pending(C2))["base"] == 1

    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "2 checkpoint(s) in flight, max_concurrent=2"
    with pytest.raises(TriggerRefused):
        coord.trigger(TASKS, {TP0: 30})

    ack_all(h, coord, C1)
    coord.complete(C1)
    third = coord.trigger(TASKS, {TP0: 30})
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [25, 30]}
    assert read(h, h.layout.pending(C3))["base"] == 2
    assert coord.view().pending == [C2, C3]


def test_min_pause_forces_one_in_flight(h) -> None:
    coord = h.coordinator(max_concurrent=3, min_pause="1s")
    start(h, coord, {TP0: 10})
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.WAIT_MAX_CONCURRENT
    assert decision.reason == "1 checkpoint(s) in flight, max_concurrent=1"


# ---- acks and complete ------------------------------------------------------------------


def test_ack_results(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    assert h.ack(coord, C1, SRC) is AckResult.SUCCESS
    assert h.ack(coord, C1, SRC) is AckResult.DUPLICATE
    assert h.ack(coord, C1, TaskId.of("stranger", 0)) is AckResult.UNKNOWN
    assert h.ack(coord, C1, AGG, attempt=2) is AckResult.UNKNOWN
    assert h.ack(coord, C1, AGG, attempt=0) is AckResult.DISCARDED
    assert h.ack(coord, CheckpointId(9), AGG) is AckResult.DISCARDED
    assert h.keys(h.layout.chk(C1)) == [h.layout.pending(C1), h.layout.ack(C1, 1, SRC)]
    assert coord.load_pending(C1).missing == frozenset({AGG})


def test_complete_needs_every_ack(h) -> None:
    coord = h.coordinator()
    expected = (SRC, TaskId.of("source", 1), AGG)
    coord.trigger(expected, {TP0: 10}, h.startup({TP0: 0}))
    assert h.ack(coord, C1, SRC) is AckResult.SUCCESS
    with pytest.raises(AcksMissing) as caught:
        coord.complete(C1)
    assert str(caught.value) == "checkpoint 1 is waiting for 2 task(s): agg#0, source#1"
    assert status(coord, C1) is CheckpointStatus.PENDING
    assert not h.store.exists(h.layout.outcome(C1))
    assert not h.store.exists(h.layout.metadata(C1))


def test_complete_writes_metadata_with_barrier_ends(h) -> None:
    coord = h.coordinator(retained=3)
    start(h, coord, {TP0: 10, TP1: 4}, **{"events:1": 2})
    handles = {}
    for task in TASKS:
        handles[task] = h.write_state(C1, task, "kg.bin", b"x" * 7)
        h.ack(coord, C1, task, handles=[handles[task]], operator_state={"events:0": 10})
    h.t[0] = 1002.5
    meta = coord.complete(C1)

    stored = decode_metadata(h.store.get(h.layout.metadata(C1)).data, "test")
    assert stored == meta
    assert stored.offsets == {TP0: 10, TP1: 4}
    assert stored.offsets == coord.barrier(C1).ends
    assert stored.barrier.starts == {TP0: 0, TP1: 2}
    assert stored.pipeline == "pipe"
    assert stored.checkpoint_id == C1
    assert stored.attempt == 1
    assert stored.trigger_time_ms == 1_000_000
    assert stored.completed_time_ms == 1_002_500
    assert stored.base is None
    assert stored.config == coord.config.to_mapping()
    assert {t: a.handles for t, a in stored.acks.items()} == {
        SRC: (handles[SRC],),
        AGG: (handles[AGG],),
    }
    assert stored.acks[SRC].operator_state == {"events:0": 10}
    assert read(h, h.layout.outcome(C1))["outcome"] == "COMPLETED"
    assert read(h, h.layout.outcome(C1))["attempt"] == 1
    assert status(coord, C1) is CheckpointStatus.COMPLETED
    assert coord.view().latest_completed == C1


def test_second_complete_conflicts_and_late_acks_are_discarded(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    first = coord.complete(C1)
    before = h.contents()
    with pytest.raises(CommitConflict) as caught:
        coord.complete(C1)
    assert str(caught.value) == "checkpoint 1 is already completed"
    # A zombie coordinator (another token) conflicts as well.
    with pytest.raises(CommitConflict):
        h.coordinator().complete(C1)
    assert h.ack(coord, C1, SRC) is AckResult.DISCARDED
    assert h.ack(coord, C1, TaskId.of("late", 0), attempt=5) is AckResult.DISCARDED
    assert h.contents() == before
    assert decode_metadata(before[h.layout.metadata(C1)], "x") == first


def test_complete_unknown_checkpoint(h) -> None:
    with pytest.raises(CheckpointNotFound):
        h.coordinator().complete(C1)


def test_begin_attempt_discards_old_acks(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1, attempt=1)
    assert coord.begin_attempt(C1) == 2
    assert h.ack(coord, C1, SRC, attempt=1) is AckResult.DISCARDED
    with pytest.raises(AcksMissing) as caught:
        coord.complete(C1)
    assert str(caught.value) == "checkpoint 1 is waiting for 2 task(s): agg#0, source#0"
    assert h.ack(coord, C1, SRC, attempt=3) is AckResult.UNKNOWN

    new = {t: h.write_state(C1, t, "s.bin", b"second", attempt=2) for t in TASKS}
    for task in TASKS:
        assert h.ack(coord, C1, task, attempt=2, handles=[new[task]]) is AckResult.SUCCESS
    meta = coord.complete(C1)
    assert meta.attempt == 2
    assert {t: a.attempt for t, a in meta.acks.items()} == {SRC: 2, AGG: 2}
    assert {t: a.handles for t, a in meta.acks.items()} == {t: (new[t],) for t in TASKS}
    with pytest.raises(CheckpointNotFound):
        coord.begin_attempt(C1)


def test_begin_attempt_skips_taken_attempt_numbers(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    assert coord.begin_attempt(C1) == 2
    assert coord.begin_attempt(C1) == 3
    assert h.keys(h.layout.chk(C1)) == [
        h.layout.attempt(C1, 2),
        h.layout.attempt(C1, 3),
        h.layout.pending(C1),
    ]


# ---- expiry and failures ----------------------------------------------------------------


def test_abort_expired_boundary(h) -> None:
    coord = h.coordinator(timeout="60s")
    start(h, coord, {TP0: 10})
    h.ack(coord, C1, SRC, handles=[h.write_state(C1, SRC, "s.bin", b"s")])
    h.t[0] = 1060.0
    assert coord.abort_expired() == []
    assert status(coord, C1) is CheckpointStatus.PENDING
    h.t[0] = 1060.25
    assert coord.abort_expired() == [C1]
    record = coord.view().records[C1]
    assert record.status is CheckpointStatus.ABORTED
    assert record.abort_reason is AbortReason.EXPIRED
    assert record.outcome.detail == "timeout 60.0s"
    # The failed checkpoint keeps only its markers.
    assert h.keys(h.layout.chk(C1)) == [h.layout.outcome(C1), h.layout.pending(C1)]
    assert coord.abort_expired() == []
    assert coord.consecutive_failures() == 1


def test_abort_expired_only_aborts_old_checkpoints(h) -> None:
    coord = h.coordinator(timeout="60s", max_concurrent=2, tolerable_failures=5)
    start(h, coord, {TP0: 10})
    h.t[0] = 1030.0
    coord.trigger(TASKS, {TP0: 20})
    h.t[0] = 1060.25
    assert coord.abort_expired() == [C1]
    view = coord.view()
    assert view.records[C1].abort_reason is AbortReason.EXPIRED
    # Checkpoint 2 was not expired; it continued from checkpoint 1, so it cannot complete.
    assert view.records[C2].abort_reason is AbortReason.BASE_ABORTED
    assert coord.consecutive_failures() == 1
    h.t[0] = 1100.0
    assert coord.abort_expired() == []


def test_abort_outcomes(h) -> None:
    coord = h.coordinator(tolerable_failures=3)
    start(h, coord, {TP0: 10})
    assert coord.abort_declined(C1, "task failed") is AbortOutcome.ABORTED
    assert coord.abort_declined(C1, "again") is AbortOutcome.ALREADY_ABORTED
    assert coord.view().records[C1].outcome.detail == "task failed"
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C2)
    coord.complete(C2)
    assert coord.abort_declined(C2, "too late") is AbortOutcome.ALREADY_COMPLETED
    assert status(coord, C2) is CheckpointStatus.COMPLETED


def expire_one(h, coord, ends) -> CheckpointId:
    cid = coord.trigger(TASKS, ends, h.startup(dict.fromkeys(ends, 0))).checkpoint_id
    h.t[0] += 601.0
    assert coord.abort_expired() == [cid]
    return cid


def complete_one(h, coord, ends) -> CheckpointId:
    cid = coord.trigger(TASKS, ends, h.startup(dict.fromkeys(ends, 0))).checkpoint_id
    ack_all(h, coord, cid)
    coord.complete(cid)
    return cid


def test_tolerable_failures_stop_triggering(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    assert expire_one(h, coord, {TP0: 10}) == C1
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C2
    decision = coord.trigger_decision()
    assert decision.verdict is Verdict.STOPPED
    assert decision.reason == "2 consecutive failures"
    with pytest.raises(TooManyFailures) as caught:
        coord.trigger(TASKS, {TP0: 10})
    assert str(caught.value).startswith(
        "pipeline 'pipe': 2 consecutive checkpoint failures exceed tolerable_failures=1; "
    )
    assert coord.view().ids() == [C1, C2]


def test_declined_counts_as_failure(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    coord.abort_declined(C1, "boom")
    assert coord.trigger_decision().verdict is Verdict.STOPPED
    with pytest.raises(TooManyFailures):
        coord.ensure_can_continue()


def test_completed_checkpoint_resets_the_failure_count(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    assert expire_one(h, coord, {TP0: 10}) == C1
    assert complete_one(h, coord, {TP0: 10}) == C2
    assert coord.consecutive_failures() == 0
    assert expire_one(h, coord, {TP0: 20}) == C3
    assert coord.consecutive_failures() == 1
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert coord.trigger(TASKS, {TP0: 20}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [10, 20]}


def test_reset_failures_resumes_triggering(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    expire_one(h, coord, {TP0: 10})
    expire_one(h, coord, {TP0: 10})
    assert coord.trigger_decision().verdict is Verdict.STOPPED
    coord.reset_failures()
    assert read(h, h.layout.failures_reset)["after_id"] == 2
    assert coord.consecutive_failures() == 0
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C3
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert expire_one(h, coord, {TP0: 10}) == C4
    assert coord.trigger_decision().verdict is Verdict.STOPPED


# ---- subsumption and ordering (I2) ------------------------------------------------------


def test_completing_n_subsumes_lower_pending(h) -> None:
    coord = h.coordinator(max_concurrent=3)
    start(h, coord, {TP0: 10})
    coord.trigger(TASKS, {TP0: 20})
    coord.trigger(TASKS, {TP0: 30})
    for cid in (C1, C2, C3):
        ack_all(h, coord, cid)
    coord.complete(C2)
    view = coord.view()
    assert view.records[C1].status is CheckpointStatus.ABORTED
    assert view.records[C1].abort_reason is AbortReason.SUBSUMED
    assert view.records[C1].outcome.detail == "checkpoint 2 completed"
    assert view.completed == [C2]
    assert view.pending == [C3]
    with pytest.raises(CommitConflict) as caught:
        coord.complete(C1)
    assert str(caught.value) == "checkpoint 1 is ABORTED, it cannot complete"
    assert not h.store.exists(h.layout.metadata(C1))
    assert h.ack(coord, C1, SRC, attempt=1) is AckResult.DISCARDED
    # Subsumed checkpoints are not failures.
    assert coord.consecutive_failures() == 0
    coord.complete(C3)
    assert coord.view().completed == [C2, C3]


def test_crashed_completion_is_finished_by_finish_completing(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    # A coordinator claimed COMPLETED and died before writing _metadata.
    claim = {"outcome": "COMPLETED", "attempt": 1, "at_ms": 1_000_500, "writer": "crashed"}
    h.store.put_if_absent(h.layout.outcome(C1), json.dumps(claim).encode())
    assert status(coord, C1) is CheckpointStatus.COMPLETING
    assert coord.trigger_decision().verdict is Verdict.WAIT_MAX_CONCURRENT
    with pytest.raises(CommitConflict) as caught:
        coord.complete(C1)
    assert str(caught.value) == "checkpoint 1 is COMPLETING, it cannot complete"

    h.t[0] = 1003.0
    coord.finish_completing()
    assert status(coord, C1) is CheckpointStatus.COMPLETED
    meta = coord.view().metadata(C1)
    assert meta.offsets == {TP0: 10}
    assert meta.attempt == 1
    assert meta.completed_time_ms == 1_003_000
    assert set(meta.acks) == set(TASKS)
    coord.finish_completing()  # nothing left to do
    assert coord.view().metadata(C1) == meta


def test_crashed_completion_is_finished_by_the_next_trigger(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    claim = {"outcome": "COMPLETED", "attempt": 1, "at_ms": 1_000_500, "writer": "crashed"}
    h.store.put_if_absent(h.layout.outcome(C1), json.dumps(claim).encode())
    second = h.coordinator().trigger(TASKS, {TP0: 15})
    assert second.checkpoint_id == C2
    assert status(coord, C1) is CheckpointStatus.COMPLETED
    assert barrier_json(h, C2) == {"events:0": [10, 15]}
    assert read(h, h.layout.pending(C2))["base"] == 1


def test_lower_claimed_checkpoint_gets_metadata_before_a_higher_one(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 10})
    coord.trigger(TASKS, {TP0: 20})
    ack_all(h, coord, C1)
    ack_all(h, coord, C2)
    claim = {"outcome": "COMPLETED", "attempt": 1, "at_ms": 1_000_500, "writer": "crashed"}
    h.store.put_if_absent(h.layout.outcome(C1), json.dumps(claim).encode())
    h.t[0] = 1001.0
    coord.complete(C2)
    view = coord.view()
    assert view.completed == [C1, C2]
    assert view.metadata(C1).offsets == {TP0: 10}
    assert view.metadata(C2).offsets == {TP0: 20}
    assert view.metadata(C1).completed_time_ms <= view.metadata(C2).completed_time_ms


# ---- notify -----------------------------------------------------------------------------


def test_notify_commits_only_the_latest_offsets(h) -> None:
    coord = h.coordinator(retained=2)
    committed: list[dict] = []
    complete_one(h, coord, {TP0: 10, TP1: 3})
    coord.notify(C1, committed.append)
    assert committed == [{TP0: 10, TP1: 3}]
    complete_one(h, coord, {TP0: 25, TP1: 3})
    complete_one(h, coord, {TP0: 40, TP1: 8})
    coord.notify(C2, committed.append)  # older than the latest: no commit
    assert committed == [{TP0: 10, TP1: 3}]
    coord.notify(C3, committed.append)
    assert committed == [{TP0: 10, TP1: 3}, {TP0: 40, TP1: 8}]
    assert committed[-1] == coord.view().metadata(coord.view().latest_completed).offsets
    coord.notify(C3, committed.append)  # idempotent
    assert committed[-1] == {TP0: 40, TP1: 8}
    assert len(committed) == 3
    assert h.store.exists(h.layout.notified(C3))


def test_notify_refuses_a_pending_checkpoint(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    with pytest.raises(CheckpointNotFound):
        coord.notify(C1, lambda offsets: None)


# ---- restore ----------------------------------------------------------------------------


def test_restore_marker_rebases_the_next_trigger(h) -> None:
    coord = h.coordinator(retained=2)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    marker = savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM).to_json()
    assert marker["offsets"] == {"events:0": 10}
    assert marker["after_id"] == 2
    third = coord.trigger(TASKS, {TP0: 30})
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [10, 30]}
    assert read(h, h.layout.pending(C3))["base"] is None
    ack_all(h, coord, C3)
    coord.complete(C3)
    assert coord.trigger(TASKS, {TP0: 33}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [30, 33]}
    assert read(h, h.layout.pending(C4))["base"] == 3


def test_restore_marker_survives_an_aborted_first_trigger(h) -> None:
    coord = h.coordinator(retained=2, tolerable_failures=3)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.CLAIM)
    expire_one(h, coord, {TP0: 30})
    assert coord.trigger(TASKS, {TP0: 30}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [10, 30]}


class RivalOutcomeStore(FileStore):
    """The same folder as the harness store; a rival decides ``trap`` just before us."""

    def __init__(self, url: str, trap: str, rival: bytes) -> None:
        super().__init__(url)
        self.trap = trap
        self.rival = rival

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        if key == self.trap and self.rival:
            rival, self.rival = self.rival, b""
            assert super().put_if_absent(key, rival) is WriteOutcome.OK
        return super().put_if_absent(key, data)


def test_lost_claim_does_not_subsume_lower_checkpoints(h) -> None:
    coord = h.coordinator(max_concurrent=2, tolerable_failures=3)
    start(h, coord, {TP0: 10})
    coord.trigger(TASKS, {TP0: 20})
    ack_all(h, coord, C1)
    ack_all(h, coord, C2)
    # The await-acks sensor of checkpoint 2 times out at the moment complete(2) runs.
    rival = json.dumps({"outcome": "ABORTED", "reason": "EXPIRED", "detail": "timeout"}).encode()
    racing = CheckpointCoordinator(
        RivalOutcomeStore(h.store.url, h.layout.outcome(C2), rival),
        coord.config,
        clock=lambda: h.t[0],
    )
    with pytest.raises(CommitConflict):
        racing.complete(C2)
    assert status(coord, C2) is CheckpointStatus.ABORTED
    assert status(coord, C1) is CheckpointStatus.PENDING
    assert coord.complete(C1).offsets == {TP0: 10}
