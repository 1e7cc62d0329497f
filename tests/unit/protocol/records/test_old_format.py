"""Records stored before alignment, statistics, the data interval, ``restored_from`` and the
``_global`` manifest were typed still read, and still show as they were stored.

``old_store/`` was written by the code before the change (its README says how); each test
works on a copy, and checks the copy is byte-identical afterwards.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.global_savepoints import (
    StageInput,
    choose_cut,
    read_global_savepoint,
)
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import read_point_metadata
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    FanInAlignment,
    InflightChannel,
    InputAlignment,
)
from microcheckpoint.protocol.records.interval import DataInterval
from microcheckpoint.protocol.records.statistics import SubtaskStatistics
from microcheckpoint.protocol.view import PipelineView, scan
from microcheckpoint.storage import FileStore

OLD = Path(__file__).parent / "old_store"


def _bytes(store: FileStore) -> dict[str, bytes]:
    return {key: store.get(key).data for key in store.list("")}  # type: ignore[union-attr]


@pytest.fixture
def store(tmp_path: Path):
    root = tmp_path / "old_store"
    shutil.copytree(OLD, root)
    copy = FileStore(root.as_uri())
    before = _bytes(copy)
    yield copy
    assert _bytes(copy) == before  # reading never rewrites an old record


def _stored_labels(store: FileStore, pipeline: str, cid: int) -> dict:
    obj = store.get(Layout(pipeline).pending(CheckpointId(cid)))
    assert obj is not None
    return json.loads(obj.data)["labels"]


def _down(store: FileStore) -> PipelineView:
    return scan(store, Layout("down"))


def test_old_alignments_read_as_typed_records(store) -> None:
    view = _down(store)
    fan_in = view.pending_record(CheckpointId(1)).alignment
    assert isinstance(fan_in, FanInAlignment) and fan_in.unaligned is False
    assert [p.mode for p in fan_in.parts] == [AlignmentMode.ALIGNED, AlignmentMode.AT_LEAST_ONCE]
    assert fan_in.inputs["a"] == InputAlignment(
        AlignmentMode.ALIGNED, 120, 1, "up", ("mid",), 2, 30, 250, (), 0
    )
    unaligned = view.pending_record(CheckpointId(3)).alignment
    assert isinstance(unaligned, InputAlignment)
    assert (unaligned.mode, unaligned.switched) == (AlignmentMode.UNALIGNED, "aligned_timeout 1 s")
    assert unaligned.inflight == (InflightChannel("mid:1", 6, 2),)
    # Before the mode and the topics were recorded: aligned (it says unaligned: false).
    legacy = view.pending_record(CheckpointId(4)).alignment
    assert legacy == InputAlignment(
        AlignmentMode.ALIGNED,
        waited_ms=0,
        epoch=2,
        upstream="up",
        channels=2,
        alignment_duration_ms=12,
        start_delay_ms=80,
    )


def test_old_statistics_read_typed_and_equal_the_pending_alignment(store) -> None:
    view = _down(store)
    for cid in view.completed:
        statistics = view.metadata(cid).statistics
        assert statistics is not None and statistics.checkpoint_id == cid.value
        assert statistics.alignment == view.pending_record(cid).alignment
        assert (statistics.end_to_end_duration_ms, statistics.full_size) == (3000, 7)
    three = view.metadata(CheckpointId(3)).statistics
    assert three is not None
    assert three.subtasks == {"source#0": SubtaskStatistics(40, 7, 7, 30, 250, True, 0)}
    # A savepoint keeps its checkpoint's statistics, and they read the same.
    point = read_global_savepoint(store, _global_prefix(store))
    saved = read_point_metadata(store, point.prefix + point.stage("down").folder)
    assert saved.statistics == view.metadata(CheckpointId(2)).statistics


def test_old_data_intervals_and_restored_from_read_typed(store) -> None:
    view = scan(store, Layout("up"))
    first = view.pending_record(CheckpointId(1))
    assert first.data_interval == DataInterval(
        datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC)
    )
    assert (first.labels, first.restored_from) == ({"run_id": "scheduled__0"}, None)
    third = view.pending_record(CheckpointId(3))
    assert third.restored_from is not None
    assert third.restored_from.endswith("/up/chk-0000000001")
    assert (third.data_interval, third.labels) == (None, {"run_id": "manual__r"})


def test_the_history_shows_old_labels_and_statistics_as_stored(store) -> None:
    for pipeline in ("up", "down"):
        rows = checkpoint_history(store, pipeline)["checkpoints"]
        assert [r["id"] for r in rows] == ([3, 2, 1] if pipeline == "up" else [4, 3, 2, 1])
        for row in rows:
            assert "error" not in row
            stored = _stored_labels(store, pipeline, row["id"])
            if pipeline == "down" and row["id"] == 4:
                continue  # the legacy alignment gains its mode and topics
            assert row["labels"] == stored
            obj = store.get(Layout(pipeline).metadata(CheckpointId(row["id"])))
            assert row["statistics"] == json.loads(obj.data)["statistics"]  # type: ignore[union-attr]
    history = checkpoint_history(store, "up")
    assert history["counts"]["restored"] == 1
    assert history["restored_from"].endswith("/up/chk-0000000001")


def _global_prefix(store: FileStore) -> str:
    (key,) = [k for k in store.list("global/") if k.endswith("/_global")]
    return key.removesuffix("_global")


def test_an_old_global_manifest_reads_and_the_cut_passes_over_what_it_cannot_use(store) -> None:
    point = read_global_savepoint(store, _global_prefix(store))
    assert [(p.pipeline, p.checkpoint_id, p.inputs) for p in point.stages] == [
        ("up", 2, ()),
        ("down", 2, (StageInput("up", 2, ("mid",)),)),
    ]
    assert all(store.get(point.prefix + p.folder + "/_metadata") for p in point.stages)
    # The old code's choose_cut failed on down 4 (KeyError 'topics'); now it is passed
    # over, as are the unaligned 3 and the at-least-once input of 1.
    assert choose_cut({"up": store, "down": store}) == {
        "down": (2, (StageInput("up", 2, ("mid",)),)),
        "up": (2, ()),
    }
