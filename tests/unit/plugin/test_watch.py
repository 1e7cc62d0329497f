"""Event-driven epochs: the spec's checks, the DAG's schedule, the watcher's apply function."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from microcheckpoint.errors import ConfigError
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint_airflow import PipelineSpec, pipeline_dags, watch
from tests.unit.conftest import TP0, TP1, Harness
from tests.unit.protocol.helpers import TASKS, ack_all

START = datetime(2026, 1, 1)


def spec(storage: str = "file:///srv/checkpoints", **overrides: Any) -> PipelineSpec:
    checkpointing = {"storage": storage, "topics": ["lines"], "timeout": "2min"}
    checkpointing.update(overrides.pop("checkpointing", {}))
    values = {"name": "wc", "pipeline": "examples.wordcount:pipeline", "watch_conn_id": "watch"}
    return PipelineSpec(checkpointing=checkpointing, **{**values, **overrides})


def test_a_watched_pipeline_runs_on_its_topics_asset_and_nothing_else() -> None:
    dag = pipeline_dags(spec(), start_date=START)["wc_pipeline"]
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable"
    (asset,) = dag.timetable.asset_condition.objects
    assert (asset.uri, asset.name) == ("kafka://watch/lines", "microcheckpoint-wc-records")
    (watcher,) = asset.watchers
    path, kwargs = watcher.trigger.serialize()
    assert path.endswith("kafka.triggers.await_message.AwaitMessageTrigger")
    assert kwargs["topics"] == ["lines"] and kwargs["kafka_config_id"] == "watch"
    assert kwargs["apply_function"] == "microcheckpoint_airflow.watch.record_arrived"
    assert kwargs["apply_function_kwargs"] == {
        "storage": "file:///srv/checkpoints",
        "pipeline": "wc",
        "storage_conn_id": "microcheckpoint_storage",
    }
    assert (kwargs["poll_interval"], kwargs["commit_offset"]) == (0, True)
    assert "Runs when records arrive on lines" in dag.doc_md


def test_with_an_interval_it_also_runs_at_least_that_often() -> None:
    dag = pipeline_dags(spec(checkpointing={"interval": "5min"}), start_date=START)["wc_pipeline"]
    assert type(dag.timetable).__name__ == "AssetOrTimeSchedule"
    assert dag.timetable.timetable._delta == timedelta(minutes=5)


def test_its_restore_dag_wakes_the_pipeline_after_resuming_it() -> None:
    restore = pipeline_dags(spec(), start_date=START)["wc_restore"]
    wake = restore.get_task("wake_pipeline")
    assert wake.trigger_dag_id == "wc_pipeline"
    assert wake.upstream_task_ids == {"resume_pipeline"}
    plain = pipeline_dags(spec(watch_conn_id=None), start_date=START)["wc_restore"]
    assert "wake_pipeline" not in plain.task_ids


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"watch_conn_id": ""}, "watch_conn_id"),
        ({"name": "totals", "after": "wc"}, "watch_conn_id"),
        ({"checkpointing": {"barrier_policy": "data_interval", "interval": "1h"}}, "watch_conn_id"),
        ({"checkpointing": {"topics": []}}, "topics"),
    ],
)
def test_a_watch_it_cannot_keep_is_refused_naming_the_field(overrides, field) -> None:
    with pytest.raises(ConfigError, match=field):
        spec(**overrides)


class Record:
    """The three things the apply function reads of a confluent_kafka.Message."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._at = (topic, partition, offset)

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]


def test_a_record_wakes_the_pipeline_until_a_completed_checkpoint_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    coord: CheckpointCoordinator = h.coordinator()
    arrived = {"storage": h.store.url, "pipeline": "pipe", "storage_conn_id": "none"}
    monkeypatch.setattr(watch, "FRESH_S", 0.0)  # read storage for every record
    monkeypatch.setattr(watch, "_READ", {})
    first = watch.record_arrived(Record("events", 0, 0), **arrived)
    assert json.loads(json.dumps(first)) == {
        "pipeline": "pipe", "topic": "events", "partition": 0, "offset": 0,
    }  # fmt: skip
    cid = coord.trigger(TASKS, {TP0: 10, TP1: 3}, h.startup({TP0: 0, TP1: 0})).checkpoint_id
    # In flight: it may abort, so its records still wake the pipeline.
    assert watch.record_arrived(Record("events", 0, 5), **arrived) is not None
    ack_all(h, coord, cid)
    coord.complete(cid)
    assert watch.record_arrived(Record("events", 0, 9), **arrived) is None
    assert watch.record_arrived(Record("events", 1, 2), **arrived) is None
    assert watch.record_arrived(Record("events", 0, 10), **arrived)["offset"] == 10
    assert watch.record_arrived(Record("events", 1, 3), **arrived)["partition"] == 1
    assert watch.record_arrived(Record("other", 0, 0), **arrived)["topic"] == "other"


def test_a_fresh_read_skips_without_reading_again_but_never_skips_a_new_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path)
    coord = h.coordinator()
    cid = coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0})).checkpoint_id
    ack_all(h, coord, cid)
    coord.complete(cid)
    reads: list[str] = []
    real = watch._processed

    def counted(*args: Any) -> Any:
        reads.append(args[1])
        return real(*args)

    monkeypatch.setattr(watch, "_processed", counted)
    monkeypatch.setattr(watch, "_READ", {})
    arrived = {"storage": h.store.url, "pipeline": "pipe", "storage_conn_id": "none"}
    assert [watch.record_arrived(Record("events", 0, o), **arrived) for o in range(10)] == [
        None
    ] * 10
    assert reads == ["pipe"]  # one read for ten processed records
    assert watch.record_arrived(Record("events", 0, 10), **arrived) is not None
    assert reads == ["pipe", "pipe"]  # a record past the ends is checked against storage
