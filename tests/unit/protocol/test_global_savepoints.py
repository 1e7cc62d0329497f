"""Choosing a global savepoint's cut, its manifest, and the global restore's markers, over
real file stores with checkpoints written through the coordinator."""

from __future__ import annotations

import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import RestoreError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.global_savepoints import (
    StageInput,
    StageRuntime,
    choose_cut,
    create_global_savepoint,
    read_global_savepoint,
    restore_global,
)
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    InflightChannel,
    InputAlignment,
)
from microcheckpoint.protocol.view import scan
from microcheckpoint.storage import FileStore
from tests.unit.protocol.test_recovery import MemoryOffsets

SRC = TaskId.of("source", 0)
IN = TopicPartition("events", 0)
MID = [TopicPartition("mid", 0), TopicPartition("mid", 1)]


def coordinator(store: FileStore, name: str) -> CheckpointCoordinator:
    config = CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url, "retained": 10})
    return CheckpointCoordinator(store, config)


def checkpoint(
    coord: CheckpointCoordinator, ends: dict, alignment: InputAlignment | None = None
) -> int:
    """One completed, notified checkpoint with a state file and the given alignment."""
    pending = coord.trigger([SRC], ends, lambda tps: dict.fromkeys(tps, 0), alignment=alignment)
    cid = pending.checkpoint_id
    from microcheckpoint.protocol.records import Ack
    from microcheckpoint.state.handles import StateHandle

    key = Layout(coord.config.pipeline).state_prefix(cid, 1, SRC) + "state.bin"
    data = f"{coord.config.pipeline}@{cid}".encode()
    coord.store.put(key, data)
    coord.acknowledge(cid, Ack(SRC, 1, (StateHandle.of(key, data, (0,)),), {}, 5))
    coord.complete(cid)
    coord.notify(cid)
    return cid.value


def aligned(epoch: int, **more) -> InputAlignment:
    return InputAlignment(
        **{"mode": AlignmentMode.ALIGNED, "epoch": epoch, "upstream": "up", "topics": ("mid",)}
        | more
    )


@pytest.fixture
def stages(tmp_path):
    store = FileStore((tmp_path / "chk").as_uri())
    up, down = coordinator(store, "up"), coordinator(store, "down")
    for end in (10, 20, 30, 40):
        checkpoint(up, {IN: end})
    checkpoint(down, {m: 2 for m in MID}, aligned(1))
    checkpoint(down, {m: 5 for m in MID}, aligned(2))
    unaligned = aligned(3, mode=AlignmentMode.UNALIGNED, inflight=(InflightChannel("mid:1", 6, 3),))
    checkpoint(down, {MID[0]: 8, MID[1]: 6}, unaligned)
    return store, up, down


def test_the_newest_aligned_cut_passes_over_an_unaligned_checkpoint(stages) -> None:
    store, _, _ = stages
    cut = choose_cut({"up": store, "down": store})
    assert cut == {"down": (2, (StageInput("up", 2, ("mid",)),)), "up": (2, ())}


def test_no_cut_names_what_each_candidate_lacked(stages, tmp_path) -> None:
    store, _, down = stages
    checkpoint(down, {m: 9 for m in MID}, aligned(9))  # an epoch `up` never completed
    at_least_once = InputAlignment(AlignmentMode.AT_LEAST_ONCE)
    checkpoint(down, {m: 10 for m in MID}, at_least_once)
    cut = choose_cut({"up": store, "down": store})
    assert cut["down"][0] == 2  # still the newest aligned one
    other = FileStore((tmp_path / "other").as_uri())
    lone = coordinator(other, "down")
    checkpoint(lone, {m: 9 for m in MID}, aligned(9))
    checkpoint(lone, {m: 10 for m in MID}, at_least_once)
    checkpoint(coordinator(other, "up"), {IN: 1})
    with pytest.raises(RestoreError) as err:
        choose_cut({"up": other, "down": other})
    assert str(err.value) == (
        "no retained checkpoints of 'down' and its upstream stages form an aligned cut "
        "(2: 'down' checkpoint 2 is at-least-once (no alignment); "
        "1: 'up' no longer retains its checkpoint 9); let the stages complete an aligned "
        "checkpoint, or raise the upstream stages' `retained`"
    )
    with pytest.raises(RestoreError, match=r"upstream stage\(s\) up that are not in the global"):
        choose_cut({"down": store})


def test_a_global_savepoint_and_its_restore_skip_the_abandoned_epochs(stages, tmp_path) -> None:
    store, up, down = stages
    target = FileStore((tmp_path / "savepoints").as_uri())
    before = {k: store.get(k).data for k in store.list("")}
    point = create_global_savepoint({"up": store, "down": store}, target, "global")
    assert point.location.startswith(target.url + "/global/global-2-2-")
    again = read_global_savepoint(target, point.prefix)
    assert again.stages == point.stages
    assert [(p.pipeline, p.checkpoint_id) for p in again.stages] == [("up", 2), ("down", 2)]
    assert all(p.folder.startswith(f"{p.pipeline}/savepoint-000000000") for p in again.stages)
    # Stored checkpoints stay untouched.
    assert {k: store.get(k).data for k in store.list("")} == before
    # The stages go on (abandoned epochs), then everything is restored at the cut.
    checkpoint(up, {IN: 50})
    ports = {"up": MemoryOffsets({IN: 60}), "down": MemoryOffsets({MID[0]: 30, MID[1]: 31})}
    runtimes = {n: StageRuntime(c, ports[n], None) for n, c in (("up", up), ("down", down))}
    markers = restore_global(point, runtimes, parallelism={"up": 3})
    assert markers["up"].offsets == {IN: 20} and markers["up"].parallelism == 3
    assert markers["down"].offsets == {MID[0]: 30, MID[1]: 31}  # the internal topic's end
    assert markers["down"].parallelism is None
    assert "start at their end" in markers["down"].note
    for name in ("up", "down"):
        view = scan(store, Layout(name))
        assert view.restore_marker == markers[name]
    # Refusals: a stage in flight, a stage missing, a folder without a manifest.
    up.trigger([SRC], {IN: 70}, lambda tps: dict.fromkeys(tps, 0))
    with pytest.raises(RestoreError, match=r"stage 'up' has checkpoint\(s\) \[6\] in flight"):
        restore_global(point, runtimes)
    with pytest.raises(RestoreError, match=r"holds stages \['down', 'up'\]; restore exactly"):
        restore_global(point, {"up": runtimes["up"]})
    with pytest.raises(RestoreError, match="is not a global savepoint"):
        read_global_savepoint(target, "global")
    target.put(point.prefix + "_broken/_global", b"{")
    with pytest.raises(RestoreError, match="is not a global savepoint manifest of version 1"):
        read_global_savepoint(target, point.prefix + "_broken")
    assert CheckpointId(2) in scan(store, Layout("up")).completed
