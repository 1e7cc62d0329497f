"""Acks, the global ack, attempts, subsumption (I2) and notify."""

from __future__ import annotations

import json

import pytest

from microcheckpoint.errors import (
    AcksMissing,
    CheckpointNotFound,
    CommitConflict,
)
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason, OutcomeRecord, decode_metadata, encode
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.state.verify import verify_chain
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import WriteOutcome
from tests.unit.protocol.helpers import (
    AGG,
    C1,
    C2,
    C3,
    SRC,
    TASKS,
    TP0,
    TP1,
    ack_all,
    barrier_json,
    complete_one,
    read,
    start,
    status,
)

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
    # Written on behalf of the claim: the checkpoint's one writer is the claimer, so the
    # lineage's writer check passes (it would name a zombie otherwise).
    assert meta.writer == "crashed" != coord.token
    [row] = [c for c in verify_chain(h.store, "pipe", 1, 1)[1] if c.check == "chk-1"]
    assert row.ok and row.detail.startswith("one writer (crashed, attempt 1)"), row
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


def test_a_claim_left_by_a_dead_completer_subsumes_the_lower_checkpoints_too(h) -> None:
    """Found by the property test: a completer of 3 died after its claim, before step 3; the
    recovery that writes 3's ``_metadata`` must also subsume 1 and 2, or 2 could complete
    after 3 (I2)."""
    coord = h.coordinator(max_concurrent=3, tolerable_failures=5)
    start(h, coord, {TP0: 10})
    coord.trigger(TASKS, {TP0: 20})
    coord.trigger(TASKS, {TP0: 30})
    for cid in (C1, C2, C3):
        ack_all(h, coord, cid)
    claim = OutcomeRecord.completed_by(1, 1, "dead")
    h.store.put_if_absent(h.layout.outcome(C3), encode(claim))
    coord.finish_completing()
    assert [status(coord, c) for c in (C1, C2, C3)] == [
        CheckpointStatus.ABORTED,
        CheckpointStatus.ABORTED,
        CheckpointStatus.COMPLETED,
    ]
    assert coord.view().records[C2].abort_reason is AbortReason.SUBSUMED
    with pytest.raises(CommitConflict):
        coord.complete(C2)
