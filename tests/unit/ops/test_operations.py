"""The core operations (``microcheckpoint.ops``) on a file store: each refuses bad input
before it writes, and each sequence leaves storage as the protocol says."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint.errors import (
    CheckpointNotFound,
    ConfigError,
    IncompatibleCheckpoint,
    RestoreError,
)
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.ops import (
    Locations,
    PipelineTarget,
    StorageSettings,
    cancel_pipeline,
    dispose_savepoint,
    list_pipelines,
    load_pipeline,
    plan_restore,
    restore_pipeline,
    stop_with_savepoint,
    take_savepoint,
)
from microcheckpoint.protocol.records import AbortReason, ClaimMode
from microcheckpoint.protocol.savepoints import choose_restore, create_savepoint, list_savepoints
from microcheckpoint.protocol.view import CheckpointStatus
from tests.unit.conftest import SRC, Harness

TP0 = TopicPartition("events", 0)


def target(h: Harness, *roots: str, **settings) -> PipelineTarget:
    """The ops target over the harness's store (the same clock for its coordinators)."""
    found = PipelineTarget.of("pipe", h.store.url, savepoint_roots=roots, checkpointing=settings)
    found.locations._open[h.store.url] = h.store
    found.coordinator = lambda: h.coordinator(**settings)  # type: ignore[method-assign]
    return found


def two_epochs(h: Harness, **settings) -> None:
    coord = h.coordinator(**settings)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 20})


# ---- a point is named one way --------------------------------------------------------------


def test_the_url_create_savepoint_returns_is_what_choose_restore_takes(h: Harness) -> None:
    two_epochs(h)
    url = create_savepoint(h.store, "pipe")
    point = choose_restore(h.store, "pipe", savepoint=url)
    assert point is not None and point.location == url
    assert point.metadata.kind == "savepoint"
    with pytest.raises(ConfigError, match=r"a folder URL inside file://"):
        choose_restore(h.store, "pipe", savepoint="file:///elsewhere/sp")


def test_restoring_a_savepoint_of_the_pipeline_twice_copies_nothing(h: Harness) -> None:
    two_epochs(h)
    url = take_savepoint(target(h))
    before = h.contents("pipe/savepoints/")
    for _ in range(2):
        marker = restore_pipeline(target(h), plan_restore(target(h), url), sleep=lambda s: None)
        assert marker.source == url
    assert h.contents("pipe/savepoints/") == before
    assert len(list_savepoints(h.store, "pipe")) == 1


def test_a_savepoint_url_through_a_root_above_the_storage_is_used_in_place(
    h: Harness, tmp_path: Path
) -> None:
    two_epochs(h)
    url = take_savepoint(target(h))
    parent = Path(h.store.url.removeprefix("file://")).parent.as_uri()
    above = target(h, parent)
    marker = restore_pipeline(above, plan_restore(above, url), sleep=lambda s: None)
    assert marker.source == url
    assert not [k for k in h.keys("pipe/savepoints/") if "imported-" in k]


# ---- restore checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"), [(999, "999"), (0, "0"), ("x", "'x'"), (True, "True"), ("2.5", "'2.5'")]
)
def test_a_parallelism_outside_1_to_max_parallelism_is_refused_and_nothing_changes(
    h: Harness, value, shown: str
) -> None:
    two_epochs(h)
    before = h.contents()
    with pytest.raises(ConfigError) as caught:
        restore_pipeline(
            target(h), plan_restore(target(h), "latest", parallelism=value), sleep=lambda s: None
        )
    assert str(caught.value) == (
        f"config field 'parallelism' = {shown} is invalid: an integer in 1..128 (the "
        "pipeline's max_parallelism)"
    )
    assert h.contents() == before


def test_the_limit_is_the_max_parallelism_stored_with_the_point(h: Harness) -> None:
    two_epochs(h, max_parallelism=16)
    with pytest.raises(ConfigError, match=r"an integer in 1\.\.16 "):
        plan_restore(target(h), "latest", parallelism=17)
    assert plan_restore(target(h), "latest", parallelism=16).parallelism == 16


def test_state_of_an_operator_the_pipeline_lacks_needs_allow_non_restored_state(
    h: Harness,
) -> None:
    two_epochs(h)
    with pytest.raises(IncompatibleCheckpoint, match=r"holds state of operator\(s\) agg"):
        plan_restore(target(h), "latest", uids=["source"])
    request = plan_restore(target(h), "latest", uids=["source"], allow_non_restored_state=True)
    assert request.dropped == ("agg",)


def test_a_point_outside_every_root_is_refused(h: Harness) -> None:
    two_epochs(h)
    before = h.contents()
    with pytest.raises(ConfigError, match=r"a location under one of the configured roots"):
        restore_pipeline(
            target(h), plan_restore(target(h), "file:///elsewhere/sp"), sleep=lambda s: None
        )
    assert h.contents() == before


# ---- savepoints ----------------------------------------------------------------------------


def test_a_savepoint_target_outside_the_roots_is_refused_and_nothing_is_written(
    h: Harness, tmp_path: Path
) -> None:
    two_epochs(h)
    before = h.contents()
    outside = (tmp_path / "elsewhere").as_uri()
    for call in (
        lambda: take_savepoint(target(h), outside + "/sp"),
        lambda: stop_with_savepoint(target(h), outside + "/sp", sleep=lambda s: None),
    ):
        with pytest.raises(ConfigError, match=r"config field 'target' = 'file://"):
            call()
    assert h.contents() == before
    assert not (tmp_path / "elsewhere").exists()
    exports = (tmp_path / "exports").as_uri()
    url = take_savepoint(target(h, exports), exports + "/keep")
    assert url.startswith(exports + "/keep/savepoint-0000000002-")
    # The root itself is a folder too: the savepoint lies right under it.
    url = take_savepoint(target(h, exports), exports)
    assert url.rsplit("/", 1)[0] == exports and "/savepoint-0000000002-" in url


def test_stop_with_savepoint_stops_triggering_and_pauses(h: Harness) -> None:
    two_epochs(h)
    paused = []
    url = stop_with_savepoint(target(h), pause=lambda: paused.append(True), sleep=lambda s: None)
    assert paused == [True]
    assert h.coordinator().suspended() is not None
    assert url in [h.store.child_url(p.rstrip("/")) for p in list_savepoints(h.store, "pipe")]


def test_a_pause_that_fails_names_the_savepoint_it_took(h: Harness) -> None:
    from microcheckpoint.errors import ServiceError

    two_epochs(h)

    def refused() -> None:
        raise ServiceError("Airflow API at http://127.0.0.1:9/ is unreachable")

    with pytest.raises(ServiceError) as caught:
        stop_with_savepoint(target(h), pause=refused, sleep=lambda s: None)
    (folder,) = list_savepoints(h.store, "pipe")
    assert str(caught.value) == (
        f"savepoint {h.store.child_url(folder.rstrip('/'))} was taken and triggering of 'pipe' "
        "is stopped, but the scheduler was not paused: Airflow API at http://127.0.0.1:9/ is "
        "unreachable"
    )
    assert h.coordinator().suspended() is not None


def test_a_failed_stop_with_savepoint_keeps_the_pipeline_running(h: Harness) -> None:
    coord = h.coordinator()
    h.epoch(coord, {TP0: 10})
    coord.trigger([SRC], {TP0: 20}, h.startup({TP0: 0}))  # in flight, never acked
    with pytest.raises(RestoreError, match=r"still in flight after 0 s"):
        stop_with_savepoint(target(h), timeout_s=0, sleep=lambda s: None)
    assert h.coordinator().suspended() is None


def test_dispose_deletes_a_savepoint_and_refuses_what_is_not_one(h: Harness) -> None:
    two_epochs(h)
    url = take_savepoint(target(h))
    with pytest.raises(ConfigError, match=r"a savepoint folder; checkpoints are deleted"):
        dispose_savepoint(target(h), f"{h.store.url}/pipe/chk-0000000002")
    with pytest.raises(CheckpointNotFound):
        dispose_savepoint(target(h), f"{h.store.url}/pipe/savepoints/nothing-here")
    restore_pipeline(target(h), plan_restore(target(h), url), sleep=lambda s: None)
    with pytest.raises(RestoreError, match=r"no checkpoint has completed since"):
        dispose_savepoint(target(h), url)
    h.epoch(h.coordinator(), {TP0: 30})
    before = h.contents("pipe/chk-")
    assert dispose_savepoint(target(h), url) >= 2
    assert list_savepoints(h.store, "pipe") == []
    assert h.contents("pipe/chk-") == before


# ---- cancel --------------------------------------------------------------------------------


def test_cancel_retains_checkpoints_aborts_the_one_in_flight_and_a_restore_resumes(
    h: Harness,
) -> None:
    two_epochs(h)
    coord = h.coordinator()
    flying = coord.trigger([SRC], {TP0: 30}, h.startup({TP0: 0})).checkpoint_id
    paused = []
    record = cancel_pipeline(target(h), pause=lambda: paused.append(True), now=lambda: 5.0)
    assert paused == [True]
    assert (record.cleanup, record.aborted, record.retained) == (
        "RETAIN_ON_CANCELLATION",
        (flying.value,),
        (2,),
    )
    view = h.coordinator().view()
    assert view.records[flying].status is CheckpointStatus.ABORTED
    assert view.records[flying].abort_reason is AbortReason.CANCELLED
    assert view.completed == [CheckpointId(2)]
    assert "cancelled" in h.coordinator().suspended().reason
    marker = restore_pipeline(target(h), plan_restore(target(h), "latest"), sleep=lambda s: None)
    assert marker.source == f"{h.store.url}/pipe/chk-0000000002"
    assert h.coordinator().suspended() is None
    assert h.epoch(h.coordinator(), {TP0: 40}).checkpoint_id == CheckpointId(4)


def test_cancel_with_delete_removes_every_checkpoint_never_a_savepoint(h: Harness) -> None:
    two_epochs(h)
    url = take_savepoint(target(h))
    savepoints = h.contents("pipe/savepoints/")
    record = cancel_pipeline(target(h), cleanup="delete_on_cancellation")
    assert record.cleanup == "DELETE_ON_CANCELLATION" and record.retained == ()
    assert h.keys("pipe/chk-") == []
    assert h.contents("pipe/savepoints/") == savepoints
    with pytest.raises(CheckpointNotFound, match=r"no completed checkpoint to restore"):
        restore_pipeline(target(h), plan_restore(target(h), "latest"), sleep=lambda s: None)
    restore_pipeline(target(h), plan_restore(target(h), url), sleep=lambda s: None)
    # Ids are never reused: sinks publish each epoch once per id.
    assert h.epoch(h.coordinator(), {TP0: 30}).checkpoint_id == CheckpointId(3)


def test_cancel_applies_the_policy_stored_with_the_latest_checkpoint(h: Harness) -> None:
    two_epochs(h, externalized_cleanup="DELETE_ON_CANCELLATION")
    record = cancel_pipeline(target(h))
    assert record.cleanup == "DELETE_ON_CANCELLATION"
    assert h.keys("pipe/chk-") == []


def test_cancel_refuses_an_unknown_policy_before_it_stops_anything(h: Harness) -> None:
    two_epochs(h)
    before = h.contents()
    with pytest.raises(ConfigError, match=r"one of RETAIN_ON_CANCELLATION"):
        cancel_pipeline(target(h), cleanup="KEEP")
    assert h.contents() == before


# ---- pipelines, stores, loading -----------------------------------------------------------


def test_a_misspelt_pipeline_is_refused_with_the_closest_name(h: Harness) -> None:
    two_epochs(h)
    assert list_pipelines(h.store) == ["pipe"]
    typo = PipelineTarget.of("pip", h.store.url)
    with pytest.raises(CheckpointNotFound) as caught:
        typo.require_known()
    assert str(caught.value) == (
        f"pipeline 'pip' has nothing stored in {h.store.url}; did you mean 'pipe'? "
        "pipelines there: pipe"
    )


def test_one_endpoint_setting_reaches_every_s3_client(monkeypatch) -> None:
    monkeypatch.setenv("MICROCHECKPOINT_S3_ENDPOINT", "http://127.0.0.1:9")
    settings = StorageSettings.from_env()
    assert settings.options("s3://b/p") == {"endpoint_url": "http://127.0.0.1:9"}
    assert settings.options("file:///x") == {}
    explicit = StorageSettings.from_env("http://127.0.0.1:8")
    assert explicit.s3_options() == {"endpoint_url": "http://127.0.0.1:8"}
    from microcheckpoint.sinks.files import FileSink

    sink = FileSink("out", "s3://bucket/out")
    pipeline = load_pipeline("examples.wordcount:build", {"topic": "t"})
    pipeline.then(sink)
    pipeline.use_storage(explicit.s3_options())
    assert sink.store_options == {"endpoint_url": "http://127.0.0.1:8"}
    own = FileSink("own", "s3://bucket/own", store_options={"endpoint_url": "http://x:1"})
    own.use_storage(explicit.s3_options())
    assert own.store_options == {"endpoint_url": "http://x:1"}


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("examples.nope:pipeline", "module 'examples.nope' is not importable"),
        ("examples.wordcount:nope", "module 'examples.wordcount' has no attribute 'nope'"),
        ("examples.wordcount:HAMLET", "a Pipeline or a function returning one, not str"),
        ("examples.wordcount:pipeline", "the name of the pipeline that"),
    ],
)
def test_load_pipeline_names_what_is_wrong(ref: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_pipeline(ref, name="other")


def test_locations_pick_the_deepest_root_and_refuse_dot_segments(tmp_path: Path) -> None:
    root = (tmp_path / "a").as_uri()
    places = Locations(root + "/chk", savepoint_roots=(root,))
    assert places.split(root + "/chk/pipe/savepoints/x", "point") == (
        root + "/chk",
        "pipe/savepoints/x",
    )
    assert places.split(root + "/other/x", "point") == (root, "other/x")
    with pytest.raises(ConfigError, match=r"without empty, '\.' or '\.\.' segments"):
        places.split(root + "/chk/../x", "point")


def test_claim_mode_is_parsed_once(h: Harness) -> None:
    two_epochs(h)
    assert plan_restore(target(h), "2", claim_mode="claim").claim_mode is ClaimMode.CLAIM
    assert plan_restore(target(h), "2", claim_mode=True).claim_mode is ClaimMode.CLAIM
    with pytest.raises(ConfigError, match=r"NO_CLAIM or CLAIM"):
        plan_restore(target(h), "2", claim_mode="grab")
