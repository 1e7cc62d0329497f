"""Zombies: two attempts or two completers of one checkpoint, late acks and late commits.

Each story interleaves two coordinators (two writers, as two processes would be) over one
store at the moment that matters, by running the other writer's step just before this
one's put-if-absent of a given file. In every story exactly one ``_metadata`` is written,
by one attempt, and what the loser writes afterwards changes nothing that counts.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from microcheckpoint.errors import AcksMissing, CommitConflict
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import WriteOutcome
from tests.unit.protocol.helpers import C1, C2, SRC, TASKS, TP0, ack_all, start, status


class Interleaved(FileStore):
    """The harness's store, seen by a writer whose put-if-absent of the first key ending in
    ``suffix`` is preceded by ``other`` (another writer's step)."""

    def __init__(self, url: str, suffix: str, other: Callable[[], object]) -> None:
        super().__init__(url)
        self.suffix, self.other = suffix, other

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        if self.other is not None and key.endswith(self.suffix):
            other, self.other = self.other, None
            other()
        return super().put_if_absent(key, data)


def zombie(h, suffix: str, other: Callable[[], object]):
    """A second coordinator of the harness's pipeline, interleaved as ``Interleaved`` says."""
    coord = h.coordinator()
    coord.store = Interleaved(h.store.url, suffix, other)
    return coord


def metadata_files(h) -> list[str]:
    return [k for k in h.store.list("") if k.endswith("/_metadata")]


def test_an_old_attempt_completing_as_a_new_one_begins_wins_alone(h) -> None:
    """Attempt 1 is fully acked; attempt 2 begins between its completer's read of the acks
    and its claim of ``_outcome``: the claim wins, attempt 2 can neither ack nor complete."""
    new = h.coordinator()
    start(h, new, {TP0: 10})
    ack_all(h, new, C1, attempt=1)
    began: list[int] = []
    old = zombie(h, "/_outcome", lambda: began.append(new.begin_attempt(C1)))

    meta = old.complete(C1)

    assert began == [2]  # the new attempt did begin before the claim
    assert meta.attempt == 1 and {a.attempt for a in meta.acks.values()} == {1}
    assert status(new, C1) is CheckpointStatus.COMPLETED
    # The new attempt's work is too late: its acks are discarded, its commit conflicts.
    late = h.write_state(C1, SRC, "s.bin", b"attempt 2", attempt=2)
    assert h.ack(new, C1, SRC, attempt=2, handles=[late]) is AckResult.DISCARDED
    with pytest.raises(CommitConflict):
        new.complete(C1)
    assert metadata_files(h) == [h.layout.metadata(C1)]
    # Notify keeps what _metadata references and deletes the loser's snapshot.
    new.notify(C1)
    assert not h.store.exists(late.key)
    assert all(h.store.exists(h_.key) for h_ in meta.handles)


def test_a_new_attempt_begun_first_makes_the_old_completer_fail_cleanly(h) -> None:
    """Attempt 2 begins before attempt 1's completer reads the acks: attempt 1 cannot
    complete (its acks no longer count), attempt 2 completes, attempt 1's retry conflicts."""
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1, attempt=1)
    old = h.coordinator()
    assert coord.begin_attempt(C1) == 2
    before = h.contents()
    with pytest.raises(AcksMissing):
        old.complete(C1)
    assert h.contents() == before  # the loser wrote nothing
    ack_all(h, coord, C1, attempt=2)
    assert coord.complete(C1).attempt == 2
    with pytest.raises(CommitConflict):
        old.complete(C1)
    for task in TASKS:  # the zombie's acks, late
        assert h.ack(old, C1, task, attempt=1) is AckResult.DISCARDED
    assert metadata_files(h) == [h.layout.metadata(C1)]


def test_two_completers_of_one_attempt_write_one_metadata(h) -> None:
    """Two processes complete the same fully acked attempt; the second's claim of
    ``_outcome`` comes after the first completed: one ``_metadata``, the first's."""
    first = h.coordinator()
    start(h, first, {TP0: 10})
    ack_all(h, first, C1)
    written = []
    second = zombie(h, "/_outcome", lambda: written.append(first.complete(C1)))
    with pytest.raises(CommitConflict) as caught:
        second.complete(C1)
    assert "already decided by another writer: COMPLETED" in str(caught.value)
    stored = h.coordinator().view().metadata(C1)
    assert stored == written[0] and stored.writer == first.token != second.token


def test_a_late_commit_after_an_abort_completes_nothing(h) -> None:
    """The checkpoint expired while its attempt was still acking; the zombie's last ack and
    its commit come after the abort: neither lands, and the range is read again by the
    next checkpoint."""
    coord = h.coordinator(tolerable_failures=1)
    start(h, coord, {TP0: 10})
    assert h.ack(coord, C1, TASKS[0]) is AckResult.SUCCESS
    h.t[0] += 601.0
    assert coord.abort_expired() == [C1]
    before = h.contents()
    assert h.ack(coord, C1, TASKS[1]) is AckResult.DISCARDED
    with pytest.raises(CommitConflict) as caught:
        h.coordinator().complete(C1)
    assert str(caught.value) == "checkpoint 1 is ABORTED, it cannot complete"
    assert h.contents() == before
    assert coord.view().records[C1].abort_reason is AbortReason.EXPIRED
    again = coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    assert again.checkpoint_id == C2 and coord.barrier(C2).starts == {TP0: 0}


def test_an_abort_racing_a_completion_loses_to_the_claim(h) -> None:
    """A timeout abort and a completion race for ``_outcome``: the completion claims first,
    so the abort finds ALREADY_COMPLETED and removes nothing."""
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    meta = []
    h.t[0] += 601.0
    aborter = zombie(h, "/_outcome", lambda: meta.append(h.coordinator().complete(C1)))
    assert aborter.abort_expired() == []
    assert status(coord, C1) is CheckpointStatus.COMPLETED
    assert all(h.store.exists(handle.key) for handle in meta[0].handles)


def test_a_zombie_write_after_notify_goes_at_the_next_retention(h) -> None:
    """A killed attempt's executor writes its snapshot and ack after the winner notified:
    the ack is discarded, and the next retention pass deletes the stray file."""
    coord = h.coordinator(retained=2)
    start(h, coord, {TP0: 10})
    assert coord.begin_attempt(C1) == 2
    ack_all(h, coord, C1, attempt=2)
    coord.complete(C1)
    coord.notify(C1)
    stray = h.write_state(C1, SRC, "late.bin", b"attempt 1, late", attempt=1)
    assert h.ack(coord, C1, SRC, attempt=1, handles=[stray]) is AckResult.DISCARDED
    assert h.store.exists(stray.key)
    h.epoch(coord, {TP0: 20})
    assert not h.store.exists(stray.key)
    kept = {handle.key for handle in coord.view().metadata(C1).handles}
    assert kept and all(h.store.exists(k) for k in kept)
    assert coord.view().completed == [C1, CheckpointId(2)]
