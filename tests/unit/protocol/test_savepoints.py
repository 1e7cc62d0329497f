"""Savepoints and choosing what to restore (with the loud fallback of docs/protocol.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint.errors import CheckpointNotFound, IncompatibleCheckpoint, RestoreError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import savepoints
from microcheckpoint.storage.file import FileStore

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
TASKS = (SRC, AGG)
C1, C2, C3 = CheckpointId(1), CheckpointId(2), CheckpointId(3)


def state_key(h, cid: CheckpointId, task: TaskId) -> str:
    return h.layout.state_prefix(cid, 1, task) + "state.bin"


def only_savepoint(h) -> str:
    found = savepoints.list_savepoints(h.store, "pipe")
    assert len(found) == 1
    return found[0]


# ---- create -----------------------------------------------------------------------------


def test_create_savepoint_copies_every_state_file(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10, TP1: 4})
    originals = {t: h.store.get(state_key(h, C1, t)).data for t in TASKS}
    url = savepoints.create_savepoint(h.store, "pipe")
    prefix = only_savepoint(h)
    assert prefix.startswith("pipe/savepoints/savepoint-0000000001-")
    assert prefix.endswith("/")
    assert url == f"{h.store.url}/{prefix.rstrip('/')}"
    relative = {t: "files/" + state_key(h, C1, t).split("/", 1)[1] for t in TASKS}
    assert h.keys(prefix) == sorted(
        [prefix + "_metadata"] + [prefix + rel for rel in relative.values()]
    )
    for task in TASKS:
        assert h.store.get(prefix + relative[task]).data == originals[task]

    point = savepoints.read_savepoint(h.store, prefix)
    meta = point.metadata
    assert meta.kind == "savepoint"
    assert meta.relative is True
    assert meta.checkpoint_id == C1
    assert meta.pipeline == "pipe"
    assert meta.offsets == {TP0: 10, TP1: 4}
    assert {t: [x.key for x in a.handles] for t, a in meta.acks.items()} == {
        t: [relative[t]] for t in TASKS
    }
    assert sorted(point.handle_keys()) == sorted(prefix + r for r in relative.values())
    assert point.location == url


def test_create_savepoint_of_a_named_checkpoint_into_another_store(h, tmp_path: Path) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    target = FileStore((tmp_path / "exports").as_uri())
    url = savepoints.create_savepoint(h.store, "pipe", C1, target=target, target_prefix="keep/")
    (metadata_key,) = [k for k in target.list("keep/") if k.endswith("/_metadata")]
    folder = metadata_key[: -len("_metadata")]
    assert folder.startswith("keep/savepoint-0000000001-")
    assert url == f"{target.url}/{folder.rstrip('/')}"
    point = savepoints.choose_restore(h.store, "pipe", savepoint=(target, folder))
    assert point.metadata.offsets == {TP0: 10}
    for task in TASKS:
        copied = target.get(folder + "files/" + state_key(h, C1, task).split("/", 1)[1])
        assert copied.data == h.store.get(state_key(h, C1, task)).data
    assert savepoints.list_savepoints(h.store, "pipe") == []


def test_create_savepoint_needs_a_completed_checkpoint(h) -> None:
    with pytest.raises(CheckpointNotFound) as caught:
        savepoints.create_savepoint(h.store, "pipe")
    assert str(caught.value).startswith(
        "pipeline 'pipe' has no completed checkpoint to take a savepoint from (completed: [])"
    )
    coord = h.coordinator()
    h.epoch(coord, {TP0: 10})
    with pytest.raises(CheckpointNotFound, match=r"\(completed: \[1\]\)"):
        savepoints.create_savepoint(h.store, "pipe", C2)


def test_savepoint_survives_retention_and_restores(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10})
    originals = {t: h.store.get(state_key(h, C1, t)).data for t in TASKS}
    savepoints.create_savepoint(h.store, "pipe")
    prefix = only_savepoint(h)
    h.epoch(coord, {TP0: 20})
    h.epoch(coord, {TP0: 30})
    assert coord.view().completed == [C3]
    assert h.keys(h.layout.chk(C1)) == []

    point = savepoints.choose_restore(h.store, "pipe", savepoint=(h.store, prefix))
    assert point.note == ""
    assert point.metadata.checkpoint_id == C1
    assert {h.store.get(k).data for k in point.handle_keys()} == set(originals.values())
    marker = savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM).to_json()
    assert marker["kind"] == "savepoint"
    assert marker["pipeline_checkpoint"] is None
    assert marker["first_snapshot_full"] is True
    assert marker["after_id"] == 3
    assert marker["offsets"] == {"events:0": 10}
    assert sorted(marker["handle_keys"]) == sorted(point.handle_keys())

    fourth = coord.trigger(TASKS, {TP0: 35})
    assert fourth.checkpoint_id == CheckpointId(4)
    assert coord.barrier(fourth.checkpoint_id).to_json() == {"events:0": [10, 35]}
    # Later retention leaves the savepoint whole.
    before = h.contents(prefix)
    for task in TASKS:
        h.ack(coord, fourth.checkpoint_id, task)
    coord.complete(fourth.checkpoint_id)
    coord.notify(fourth.checkpoint_id)
    assert h.contents(prefix) == before


def test_savepoint_of_another_pipeline_is_refused(h) -> None:
    coord = h.coordinator()
    h.epoch(coord, {TP0: 10})
    savepoints.create_savepoint(h.store, "pipe")
    prefix = only_savepoint(h)
    with pytest.raises(IncompatibleCheckpoint) as caught:
        savepoints.choose_restore(h.store, "other", savepoint=(h.store, prefix))
    assert str(caught.value) == (
        f"{h.store.url}/{prefix.rstrip('/')} belongs to pipeline 'pipe', not 'other'; "
        "restore a savepoint taken from this pipeline"
    )
    point = savepoints.choose_restore(h.store, "pipe", savepoint=(h.store, prefix))
    with pytest.raises(IncompatibleCheckpoint, match="belongs to pipeline 'pipe', not 'other'"):
        savepoints.restore(h.store, "other", point, savepoints.ClaimMode.CLAIM)
    assert not h.store.exists("other/_restore")


def test_read_savepoint_of_a_missing_folder(h) -> None:
    with pytest.raises(CheckpointNotFound) as caught:
        savepoints.read_savepoint(h.store, "pipe/savepoints/nope")
    assert str(caught.value) == (
        f"no _metadata at {h.store.url}/pipe/savepoints/nope/_metadata; "
        "give the folder of a savepoint or checkpoint"
    )


# ---- choose_restore -----------------------------------------------------------------------


def test_nothing_to_restore(h) -> None:
    assert savepoints.choose_restore(h.store, "pipe") is None


def test_latest_completed_is_chosen(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    coord.trigger(TASKS, {TP0: 30})  # pending: never chosen
    point = savepoints.choose_restore(h.store, "pipe")
    assert point.metadata.checkpoint_id == C2
    assert point.metadata.offsets == {TP0: 20}
    assert point.note == ""
    assert point.prefix == "pipe/chk-0000000002/"
    assert point.location == f"{h.store.url}/pipe/chk-0000000002"
    assert sorted(point.handle_keys()) == sorted(state_key(h, C2, t) for t in TASKS)


def test_falls_back_when_a_state_file_is_missing(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    lost = state_key(h, C2, AGG)
    h.store.delete(lost)
    point = savepoints.choose_restore(h.store, "pipe")
    assert point.metadata.checkpoint_id == C1
    assert point.metadata.offsets == {TP0: 10}
    assert point.note == (
        "FELL BACK to checkpoint 1 because checkpoint 2: "
        f"state file {h.store.url}/{lost} is missing"
    )


def test_falls_back_when_metadata_is_corrupt(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    h.store.put(h.layout.metadata(C2), b'{"format": truncated')
    point = savepoints.choose_restore(h.store, "pipe")
    assert point.metadata.checkpoint_id == C1
    assert point.note.startswith(
        f"FELL BACK to checkpoint 1 because checkpoint 2: {h.store.url}/pipe/chk-0000000002/"
        "_metadata is corrupt (not JSON: "
    )


def test_no_usable_checkpoint(h) -> None:
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 10})
    h.store.put(h.layout.metadata(C1), b"[]")
    with pytest.raises(RestoreError) as caught:
        savepoints.choose_restore(h.store, "pipe")
    assert str(caught.value).startswith(
        "no completed checkpoint of 'pipe' is usable: checkpoint 1: "
        f"{h.store.url}/pipe/chk-0000000001/_metadata is not a microcheckpoint _metadata"
    )


def test_named_checkpoint_must_be_completed(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    coord.trigger(TASKS, {TP0: 30})
    for missing in (C3, CheckpointId(9)):
        with pytest.raises(CheckpointNotFound) as caught:
            savepoints.choose_restore(h.store, "pipe", checkpoint=missing)
        assert str(caught.value) == (
            f"checkpoint {missing} of 'pipe' is not a completed checkpoint (completed: [1, 2])"
        )
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    assert point.metadata.offsets == {TP0: 10}


def test_restore_leaves_stored_checkpoints_byte_identical(h) -> None:
    coord = h.coordinator(retained=2)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})
    savepoints.create_savepoint(h.store, "pipe", C1)
    before = h.contents()
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    marker = savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.CLAIM).to_json()
    after = h.contents()
    (event,) = h.keys(h.layout.restore_events)  # the restores history's row
    assert set(after) == set(before) | {h.layout.restore, event}
    assert {k: v for k, v in after.items() if k not in (h.layout.restore, event)} == before
    assert marker["pipeline_checkpoint"] == 1
    assert marker["claim_mode"] == "CLAIM"
    assert marker["first_snapshot_full"] is False
    assert marker["after_id"] == 2
