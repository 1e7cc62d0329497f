"""Savepoint targets and restore points as a form or the CLI names them (``ops.Locations``
and ``protocol.savepoints.resolve_point``), over real file stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint.errors import CheckpointNotFound, ConfigError, IncompatibleCheckpoint
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.ops import Locations
from microcheckpoint.protocol.savepoints import RestorePoint, create_savepoint, resolve_point
from microcheckpoint.storage import ObjectStore
from microcheckpoint.storage.file import FileStore

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
C1, C2, C3, C4 = (CheckpointId(n) for n in (1, 2, 3, 4))
ROOTS = ["file:///a/b", "s3://bkt/pre"]


def no_other_root(root: str) -> ObjectStore:
    raise AssertionError(f"open_root({root!r}) called for a point in the pipeline's storage")


@pytest.fixture
def three(h):
    """Pipeline ``pipe`` with checkpoints 1..3 completed (offsets 10, 20, 30) and 4 pending."""
    coord = h.coordinator(retained=5)
    for end in (10, 20, 30):
        h.epoch(coord, {TP0: end})
    coord.trigger((SRC, AGG), {TP0: 40})
    return h


def split_location(url: str, roots: list[str], what: str) -> tuple[str, str]:
    return Locations(roots[0], savepoint_roots=tuple(roots[1:])).split(url, what)


def resolve(h, value, roots=None, open_root=no_other_root) -> RestorePoint:
    roots = roots or [h.store.url]

    def locate(url: str) -> tuple[ObjectStore, str]:
        root, prefix = split_location(url, roots, "point")
        return (h.store if root == roots[0].rstrip("/") else open_root(root)), prefix

    return resolve_point(str(value if value is not None else "latest"), "pipe", h.store, locate)


# ---- split_location ----------------------------------------------------------------------


def test_split_location_inside_a_root() -> None:
    assert split_location("file:///a/b/pipe/savepoints/sp", ROOTS, "target") == (
        "file:///a/b",
        "pipe/savepoints/sp",
    )
    assert split_location("  s3://bkt/pre/x/y/ ", ROOTS, "target") == ("s3://bkt/pre", "x/y")


def test_split_location_of_exactly_a_root() -> None:
    assert split_location("file:///a/b", ROOTS, "target") == ("file:///a/b", "")
    assert split_location("s3://bkt/pre/", ROOTS, "target") == ("s3://bkt/pre", "")


@pytest.mark.parametrize(
    "url",
    [
        "file:///elsewhere/x",
        "file:///a/bc/x",  # root file:///a/b is a string prefix, not a folder prefix
        "file:///a/bc",
        "s3://bkt/prefix/x",
        "s3://bkt",
        "file:///a",
    ],
)
def test_split_location_refuses_a_url_outside_every_root(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        split_location(url, ROOTS, "target")
    assert caught.value.field == "target"
    assert caught.value.value == url
    assert str(caught.value) == (
        f"config field 'target' = {url!r} is invalid: a location under one of the configured "
        "roots (file:///a/b, s3://bkt/pre); add its root to savepoint_roots (Airflow) or "
        "--savepoint-root (CLI) to allow it"
    )


def test_split_location_refuses_a_url_that_climbs_out_of_its_root() -> None:
    with pytest.raises(ConfigError):
        split_location("file:///a/b/../c", ROOTS, "target")


# ---- resolve_point: the pipeline's own checkpoints ----------------------------------------


@pytest.mark.parametrize("value", ["latest", "", None, "  latest  "])
def test_latest_is_the_latest_completed_checkpoint(three, value) -> None:
    point = resolve(three, value)
    assert point.metadata.checkpoint_id == C3
    assert point.metadata.kind == "checkpoint"
    assert point.metadata.offsets == {TP0: 30}
    assert point.location == f"{three.store.url}/pipe/chk-0000000003"
    assert point.prefix == "pipe/chk-0000000003/"
    assert point.store is three.store
    assert point.note == ""


@pytest.mark.parametrize("value", ["3", "chk-3", "chk-0000000003", " 3 ", 3])
def test_a_checkpoint_id_in_any_spelling(three, value) -> None:
    point = resolve(three, value)
    assert point.metadata.checkpoint_id == C3
    assert point.metadata.offsets == {TP0: 30}
    assert point.location == f"{three.store.url}/pipe/chk-0000000003"


def test_an_older_checkpoint_id(three) -> None:
    point = resolve(three, "chk-1")
    assert point.metadata.checkpoint_id == C1
    assert point.metadata.offsets == {TP0: 10}


@pytest.mark.parametrize("value", ["4", "9"])
def test_a_checkpoint_that_is_not_completed(three, value) -> None:
    with pytest.raises(CheckpointNotFound) as caught:
        resolve(three, value)
    assert str(caught.value) == (
        f"checkpoint {value} of 'pipe' is not a completed checkpoint (completed: [1, 2, 3])"
    )


@pytest.mark.parametrize("value", ["0", "chk-0"])
def test_checkpoint_id_zero_is_a_config_error(three, value) -> None:
    with pytest.raises(ConfigError):
        resolve(three, value)


def test_latest_falls_back_loudly_when_its_state_is_missing(three) -> None:
    lost = three.layout.state_prefix(C3, 1, SRC) + "state.bin"
    three.store.delete(lost)
    point = resolve(three, "latest")
    assert point.metadata.checkpoint_id == C2
    assert point.note == (
        f"FELL BACK to checkpoint 2 because checkpoint 3: state file {three.store.url}/{lost} "
        "is missing"
    )


def test_latest_without_a_completed_checkpoint(h) -> None:
    h.coordinator().trigger((SRC, AGG), {TP0: 10}, h.startup({TP0: 0}))  # pending only
    with pytest.raises(CheckpointNotFound) as caught:
        resolve(h, "latest")
    assert str(caught.value) == (
        "pipeline 'pipe' has no completed checkpoint to restore; give a savepoint URL"
    )


@pytest.mark.parametrize("value", ["yesterday", "chk-x", "7.5", "-1", "chk-"])
def test_garbage_is_a_config_error(three, value) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(three, value)
    assert caught.value.field == "point"
    assert str(caught.value) == (
        f"config field 'point' = {value!r} is invalid: latest, a checkpoint id (7 or chk-7), "
        "or a savepoint folder URL"
    )


# ---- resolve_point: URLs -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", "/", "/_metadata"])
def test_a_savepoint_url_in_the_pipelines_storage(three, suffix) -> None:
    url = create_savepoint(three.store, "pipe", C2)
    assert url.startswith(f"{three.store.url}/pipe/savepoints/savepoint-0000000002-")
    point = resolve(three, url + suffix)
    assert point.metadata.kind == "savepoint"
    assert point.metadata.checkpoint_id == C2
    assert point.metadata.offsets == {TP0: 20}
    assert point.location == url
    assert point.prefix == url[len(three.store.url) + 1 :] + "/"
    assert point.store is three.store


def test_a_checkpoint_folder_url(three) -> None:
    point = resolve(three, f"{three.store.url}/pipe/chk-0000000002")
    assert point.metadata.kind == "checkpoint"
    assert point.metadata.checkpoint_id == C2
    assert point.prefix == "pipe/chk-0000000002/"


def test_a_savepoint_in_a_second_root_is_opened_through_open_root(three, tmp_path: Path) -> None:
    exports = FileStore((tmp_path / "exports").as_uri())
    url = create_savepoint(three.store, "pipe", C1, target=exports, target_prefix="keep/")
    opened: list[str] = []

    def open_root(root: str) -> ObjectStore:
        opened.append(root)
        return exports

    point = resolve(three, url, [three.store.url, exports.url], open_root)
    assert opened == [exports.url]
    assert point.store is exports
    assert point.location == url
    assert point.metadata.checkpoint_id == C1
    assert point.metadata.offsets == {TP0: 10}
    assert point.prefix.startswith("keep/savepoint-0000000001-")

    # Without that root listed, the same URL is refused.
    with pytest.raises(ConfigError, match=r"^config field 'point' = 'file://"):
        resolve(three, url)


def test_a_savepoint_of_another_pipeline_is_incompatible(three) -> None:
    other = three.coordinator(pipeline="other")
    three.epoch(other, {TP0: 99}, files={SRC: [], AGG: []})
    url = create_savepoint(three.store, "other")
    assert url.startswith(f"{three.store.url}/other/savepoints/")
    with pytest.raises(IncompatibleCheckpoint) as caught:
        resolve(three, url)
    assert str(caught.value) == (
        f"{url} belongs to pipeline 'other', not 'pipe'; restore a savepoint taken from "
        "this pipeline"
    )


def test_a_url_without_a_savepoint(three) -> None:
    url = f"{three.store.url}/pipe/savepoints/nothing"
    with pytest.raises(CheckpointNotFound) as caught:
        resolve(three, url)
    assert str(caught.value) == (
        f"no _metadata at {url}/_metadata; give the folder of a savepoint or checkpoint"
    )


def test_a_url_outside_the_roots(three, tmp_path: Path) -> None:
    url = (tmp_path / "elsewhere" / "sp").as_uri()
    with pytest.raises(ConfigError) as caught:
        resolve(three, url)
    assert caught.value.field == "point"
    assert caught.value.value == url
