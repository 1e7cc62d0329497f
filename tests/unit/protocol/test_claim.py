"""Claim modes of a restore, as in Flink: under ``CLAIM`` the pipeline owns the restored
savepoint, and retention deletes it once no retained checkpoint references it; under
``NO_CLAIM`` it is never touched, byte for byte."""

from __future__ import annotations

from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.records import ClaimMode
from microcheckpoint.protocol.retention import enforce_retention
from microcheckpoint.state.handles import StateHandle

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
C1, C5 = CheckpointId(1), CheckpointId(5)


def restored(h, mode: ClaimMode, target_prefix: str | None = None):
    """Checkpoint 1 (offset 10), a savepoint of it, then a restore from the savepoint.

    Returns the coordinator (2 retained), the savepoint's folder and its agg state file."""
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    url = savepoints.create_savepoint(h.store, "pipe", target_prefix=target_prefix)
    folder = url.removeprefix(h.store.url + "/") + "/"
    point = savepoints.choose_restore(h.store, "pipe", savepoint=(h.store, folder))
    assert point is not None
    savepoints.restore(h.store, "pipe", point, mode)
    agg = next(k for k in point.handle_keys() if "/agg/" in k)
    return coord, folder, StateHandle(agg, len(h.store.get(agg).data), (0,))


def test_claim_deletes_the_savepoint_once_no_retained_checkpoint_references_it(h) -> None:
    coord, folder, agg = restored(h, ClaimMode.CLAIM)
    saved = h.contents(folder)
    assert len(saved) == 3  # _metadata and two state files
    # Checkpoints 2 and 3 are incremental: agg's key group did not change, so both
    # reference the savepoint's file (CLAIM lets them).
    h.epoch(coord, {TP0: 20}, files={AGG: [agg]})
    assert h.contents(folder) == saved  # one checkpoint after the restore: still needed
    h.epoch(coord, {TP0: 30}, files={AGG: [agg]})
    assert h.contents(folder) == saved  # two retained (2, 3), both reference it
    # Checkpoint 4 writes its own agg state; 3 is still retained and references the file.
    h.epoch(coord, {TP0: 40})
    assert h.contents(folder) == saved
    assert savepoints.list_savepoints(h.store, "pipe") == [folder]
    # Checkpoint 5: the retained ones (4, 5) reference nothing of it: the savepoint goes.
    h.epoch(coord, {TP0: 50})
    assert h.contents(folder) == {}
    assert savepoints.list_savepoints(h.store, "pipe") == []
    assert coord.view().completed == [CheckpointId(4), C5]
    # The retained checkpoints are whole and the next restore of the latest works.
    point = savepoints.choose_restore(h.store, "pipe")
    assert point is not None and point.metadata.checkpoint_id == C5 and not point.note
    assert enforce_retention(h.store, h.layout, 2) == []  # again: nothing more to do


def test_claim_keeps_the_savepoint_while_fewer_than_retained_checkpoints_follow(h) -> None:
    coord, folder, _ = restored(h, ClaimMode.CLAIM)
    saved = h.contents(folder)
    h.epoch(coord, {TP0: 20})  # a full snapshot references nothing of the savepoint ...
    assert h.contents(folder) == saved  # ... but it is still among the two "retained"
    h.epoch(coord, {TP0: 30})
    assert h.contents(folder) == {}


def test_no_claim_never_touches_the_savepoint(h) -> None:
    coord, folder, _ = restored(h, ClaimMode.NO_CLAIM)
    saved = h.contents(folder)
    for offset in (20, 30, 40, 50, 60):
        h.epoch(coord, {TP0: offset})
    assert coord.view().completed == [CheckpointId(5), CheckpointId(6)]
    assert h.contents(folder) == saved
    assert savepoints.list_savepoints(h.store, "pipe") == [folder]


def test_claim_leaves_a_savepoint_outside_the_pipeline_folder_alone(h) -> None:
    # A target chosen on the form (or a global savepoint's stage) may be shared.
    coord, folder, _ = restored(h, ClaimMode.CLAIM, target_prefix="shared/points")
    assert folder.startswith("shared/points/savepoint-")
    saved = h.contents(folder)
    for offset in (20, 30, 40, 50):
        h.epoch(coord, {TP0: offset})
    assert h.contents(folder) == saved
