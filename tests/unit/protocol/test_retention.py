"""Retention: keep ``retained`` checkpoints, delete exactly what nothing references (I5)."""

from __future__ import annotations

import pytest

from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.retention import enforce_retention
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.state.handles import StateHandle

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
TASKS = (SRC, AGG)
C1, C2, C3, C4, C5 = (CheckpointId(n) for n in range(1, 6))


def state_key(h, cid: CheckpointId, task: TaskId, attempt: int = 1, name: str = "state.bin"):
    return h.layout.state_prefix(cid, attempt, task) + name


def completed_keys(h, cid: CheckpointId, *files: str, notified: bool = True) -> set[str]:
    """Keys a completed (and notified) checkpoint keeps: its markers and its own state files."""
    markers = {h.layout.pending(cid), h.layout.outcome(cid), h.layout.metadata(cid)}
    if notified:
        markers.add(h.layout.notified(cid))
    return markers | set(files)


def own_files(h, cid: CheckpointId) -> set[str]:
    return {state_key(h, cid, task) for task in TASKS}


def pipeline_keys(h) -> set[str]:
    """Everything under the pipeline except the savepoints folder."""
    return {k for k in h.keys("pipe/") if not k.startswith(h.layout.savepoints)}


@pytest.mark.parametrize("retained", [1, 2, 3])
def test_keeps_exactly_the_newest_n(h, retained: int) -> None:
    coord = h.coordinator(retained=retained)
    for offset in (10, 20, 30, 40):
        h.epoch(coord, {TP0: offset})
    kept = [CheckpointId(n) for n in range(5 - retained, 5)]
    assert coord.view().completed == kept
    expected = set()
    for cid in kept:
        expected |= completed_keys(h, cid, *own_files(h, cid))
    assert pipeline_keys(h) == expected
    assert set(coord.view().records) == set(kept)


def test_enforce_retention_returns_dropped_ids(h) -> None:
    coord = h.coordinator(retained=5)
    for offset in (10, 20, 30, 40):
        h.epoch(coord, {TP0: offset})
    assert enforce_retention(h.store, h.layout, 2) == [C1, C2]
    assert enforce_retention(h.store, h.layout, 2) == []
    assert coord.view().completed == [C3, C4]


def test_shared_file_is_reference_counted(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    shared = state_key(h, C2, AGG)
    assert pipeline_keys(h) == completed_keys(h, C2, *own_files(h, C2))

    # Checkpoint 3 is incremental: its agg key group did not change, so it references
    # the file written under chk-2.
    reuse = h.store.get(shared)
    assert reuse is not None
    handle = StateHandle(shared, len(reuse.data), (0,))
    h.epoch(coord, {TP0: 30}, files={AGG: [handle]})
    assert pipeline_keys(h) == {shared} | completed_keys(h, C3, state_key(h, C3, SRC))
    assert h.store.get(shared).data == reuse.data
    assert coord.view().records[C2].status is CheckpointStatus.DISCARDED

    # Checkpoint 4 references it too: dropping 3 keeps it.
    h.epoch(coord, {TP0: 40}, files={AGG: [handle]})
    assert pipeline_keys(h) == {shared} | completed_keys(h, C4, state_key(h, C4, SRC))

    # Checkpoint 5 writes its own agg state: the last reference goes, and so does the file.
    h.epoch(coord, {TP0: 50})
    assert pipeline_keys(h) == completed_keys(h, C5, *own_files(h, C5))


def test_in_flight_ack_protects_a_file_of_a_dropped_checkpoint(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20}, notify=False)
    reused = state_key(h, C1, AGG)
    coord.trigger(TASKS, {TP0: 30})
    assert h.ack(coord, C3, AGG, handles=[StateHandle(reused, 7)]) is AckResult.SUCCESS
    coord.notify(C2)
    assert pipeline_keys(h) == (
        {reused, h.layout.pending(C3), h.layout.ack(C3, 1, AGG)}
        | completed_keys(h, C2, *own_files(h, C2))
    )


def test_files_of_non_winning_attempts_are_deleted(h) -> None:
    coord = h.coordinator()
    coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    for task in TASKS:
        old = h.write_state(C1, task, "state.bin", b"attempt one")
        assert h.ack(coord, C1, task, handles=[old]) is AckResult.SUCCESS
    assert coord.begin_attempt(C1) == 2
    winners = set()
    for task in TASKS:
        new = h.write_state(C1, task, "state.bin", b"attempt two", attempt=2)
        winners.add(new.key)
        assert h.ack(coord, C1, task, attempt=2, handles=[new]) is AckResult.SUCCESS
    # A zombie of attempt 1 writes late.
    h.write_state(C1, SRC, "late.bin", b"zombie")
    meta = coord.complete(C1)
    assert {h.key for h in meta.handles} == winners
    coord.notify(C1)
    assert pipeline_keys(h) == completed_keys(h, C1, *winners) | {h.layout.attempt(C1, 2)}
    for key in winners:
        assert h.store.get(key).data == b"attempt two"


def test_declined_checkpoint_files_are_deleted(h) -> None:
    coord = h.coordinator(tolerable_failures=1)
    coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    h.ack(coord, C1, SRC, handles=[h.write_state(C1, SRC, "state.bin", b"s")])
    h.write_state(C1, AGG, "state.bin", b"partial")
    coord.abort_declined(C1, "agg#0 failed")
    assert pipeline_keys(h) == {h.layout.pending(C1), h.layout.outcome(C1)}
    # Once a later checkpoint completes, the aborted one is history below it: dropped.
    h.epoch(coord, {TP0: 10})
    assert pipeline_keys(h) == completed_keys(h, C2, *own_files(h, C2))


def test_expired_checkpoint_files_are_deleted(h) -> None:
    coord = h.coordinator(timeout="10s", tolerable_failures=1)
    coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    for task in TASKS:
        h.ack(coord, C1, task, handles=[h.write_state(C1, task, "state.bin", b"s")])
    h.t[0] += 11
    assert coord.abort_expired() == [C1]
    assert pipeline_keys(h) == {h.layout.pending(C1), h.layout.outcome(C1)}


def test_subsumed_checkpoint_files_go_unless_the_winner_references_them(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    coord.trigger(TASKS, {TP0: 20})
    first = {t: h.write_state(C1, t, "state.bin", f"{t}@1".encode()) for t in TASKS}
    for task in TASKS:
        h.ack(coord, C1, task, handles=[first[task]])
    own = h.write_state(C2, SRC, "state.bin", b"src@2")
    h.ack(coord, C2, SRC, handles=[own])
    h.ack(coord, C2, AGG, handles=[first[AGG]])  # unchanged key group: reused
    coord.complete(C2)
    record = coord.view().records[C1]
    assert record.abort_reason is AbortReason.SUBSUMED
    # Subsuming deletes nothing by itself: the winner may reference the files.
    assert h.store.exists(first[SRC].key)
    coord.notify(C2)
    assert pipeline_keys(h) == {first[AGG].key} | completed_keys(h, C2, own.key)


def test_restored_checkpoint_is_kept_until_a_checkpoint_completes_after_the_restore(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10}, notify=False)
    h.epoch(coord, {TP0: 20}, notify=False)
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.CLAIM)
    coord.notify(C2)
    assert coord.view().completed == [C1, C2]
    assert h.store.exists(state_key(h, C1, SRC))
    h.epoch(coord, {TP0: 15})
    assert coord.view().completed == [C3]
    assert coord.view().metadata(C3).offsets == {TP0: 15}
    # The restore's event (the restores history) is never retention's to delete.
    (event,) = h.keys(h.layout.restore_events)
    assert pipeline_keys(h) == completed_keys(h, C3, *own_files(h, C3)) | {
        h.layout.restore,
        event,
    }


def test_savepoint_folders_are_never_touched(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10})
    url = savepoints.create_savepoint(h.store, "pipe")
    before = h.contents(h.layout.savepoints)
    assert len(before) == 3  # two state files and _metadata
    assert (
        url
        == h.store.url + "/" + next(iter(before)).rsplit("/files/", 1)[0].rsplit("/_metadata", 1)[0]
    )
    for offset in (20, 30):
        h.epoch(coord, {TP0: offset})
    enforce_retention(h.store, h.layout, 1)
    assert coord.view().completed == [C3]
    assert h.contents(h.layout.savepoints) == before


def test_late_notify_of_a_dropped_checkpoint_leaves_nothing(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10}, notify=False)
    h.epoch(coord, {TP0: 20}, notify=False)
    coord.notify(C1)
    assert pipeline_keys(h) == completed_keys(h, C2, *own_files(h, C2), notified=False)
