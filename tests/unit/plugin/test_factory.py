"""The DAG factory: settings validated at parse time, and the exact shape of the three DAGs.

The DAG files are also imported in a subprocess that refuses the edge packages (Kafka,
boto3, Spark, Iceberg): parsing a DAG file must stay cheap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG, DeltaDataIntervalTimetable, TriggerRule

from microcheckpoint.errors import ConfigError
from microcheckpoint_airflow import (
    LocalSpark,
    PipelineSpec,
    SparkConnect,
    SparkSubmit,
    global_dags,
    pipeline_dags,
)
from microcheckpoint_airflow.operators import (
    ConnectEpochOperator,
    EpochSparkSubmitOperator,
    LocalEpochOperator,
)

REPO = Path(__file__).resolve().parents[3]
START = datetime(2026, 1, 1)
CID = "{{ ti.xcom_pull(task_ids='trigger_checkpoint') }}"
CID_IN_EPOCH = "{{ ti.xcom_pull(task_ids='process_epoch', key='checkpoint_id') }}"


def make_spec(storage: str = "file:///srv/checkpoints", **overrides) -> PipelineSpec:
    checkpointing = {"storage": storage, "interval": "90s", "timeout": "2min"}
    checkpointing.update(overrides.pop("checkpointing", {}))
    values = {"name": "wc", "pipeline": "examples.wordcount:pipeline", **overrides}
    return PipelineSpec(checkpointing=checkpointing, **values)


def edges(dag: DAG) -> dict[str, tuple[list[str], list[str]]]:
    """task id -> (sorted upstream ids, sorted downstream ids)."""
    return {
        t.task_id: (sorted(t.upstream_task_ids), sorted(t.downstream_task_ids)) for t in dag.tasks
    }


# ---- PipelineSpec --------------------------------------------------------------------------


def test_a_bad_checkpointing_value_names_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        make_spec(checkpointing={"timeout": "soon"})
    assert caught.value.field == "timeout"
    assert str(caught.value) == (
        "config field 'timeout' = 'soon' is invalid: a duration: seconds or a string like "
        "'500ms', '30s', '10min'"
    )


@pytest.mark.parametrize(
    ("parallelism", "max_parallelism", "allowed"),
    [
        (0, 128, "an integer in 1..128"),
        (129, 128, "an integer in 1..128"),
        (5, 4, "an integer in 1..4"),
    ],
)
def test_parallelism_outside_one_to_max_parallelism(parallelism, max_parallelism, allowed) -> None:
    with pytest.raises(ConfigError) as caught:
        make_spec(parallelism=parallelism, checkpointing={"max_parallelism": max_parallelism})
    assert (caught.value.field, caught.value.value, caught.value.allowed) == (
        "parallelism",
        parallelism,
        allowed,
    )
    assert make_spec(
        parallelism=max_parallelism, checkpointing={"max_parallelism": max_parallelism}
    )


def test_parallelism_must_not_be_a_boolean() -> None:
    with pytest.raises(ConfigError):
        make_spec(parallelism=True)


@pytest.mark.parametrize("root", ["/tmp/savepoints", "file://relative", "gs://bucket/x"])
def test_savepoint_roots_must_be_urls(root: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_spec(savepoint_roots=(root,))
    assert str(caught.value) == (
        f"config field 'savepoint_roots' = {root!r} is invalid: URLs s3://bucket[/prefix] or "
        "file:///path"
    )


def test_pipeline_must_be_module_colon_attribute() -> None:
    with pytest.raises(ConfigError) as caught:
        make_spec(pipeline="examples.wordcount.pipeline")
    assert str(caught.value) == (
        "config field 'pipeline' = 'examples.wordcount.pipeline' is invalid: 'module:attribute' "
        "of a Pipeline"
    )


def test_roots_and_dag_ids() -> None:
    spec = make_spec(
        storage="file:///srv/checkpoints/", savepoint_roots=("s3://bkt/sp/", "file:///keep")
    )
    assert spec.roots == ["file:///srv/checkpoints", "s3://bkt/sp", "file:///keep"]
    assert (spec.dag_id, spec.savepoint_dag_id, spec.restore_dag_id) == (
        "wc_pipeline",
        "wc_savepoint",
        "wc_restore",
    )
    assert spec.config.pipeline == "wc"
    assert spec.config_mapping["timeout"] == 120.0
    assert spec.config_mapping["interval"] == 90.0


# ---- the pipeline DAG ------------------------------------------------------------------------

# Spark in the task (local, Connect): one task waits for min pause and max concurrent
# (deferred while they do not hold), triggers, runs the epoch, completes and notifies
# (notify enforces retention); it enforces the checkpoint timeout itself.
CHAIN = {
    "process_epoch": ([], ["abort_on_failure", "done"]),
    "abort_on_failure": (["process_epoch"], []),
    # The run's outcome: a failed epoch leaves it upstream_failed, so the run fails.
    "done": (["process_epoch"], []),
}

# A separate trigger task: the gates as sensors, the barrier is placed, then the epoch runs.
TRIGGER_CHAIN = {
    "wait_min_pause": ([], ["wait_max_concurrent"]),
    "wait_max_concurrent": (["wait_min_pause"], ["trigger_checkpoint"]),
    "trigger_checkpoint": (
        ["wait_max_concurrent"],
        ["abort_on_failure", "checkpoint_timeout", "process_epoch"],
    ),
    "checkpoint_timeout": (["trigger_checkpoint"], []),
    "process_epoch": (["trigger_checkpoint"], ["abort_on_failure", "done"]),
    "abort_on_failure": (["process_epoch", "trigger_checkpoint"], []),
    "done": (["process_epoch"], []),
}

# spark-submit: the job runs elsewhere, so sensors and tasks wait for its acks and commit.
SUBMIT_CHAIN = {
    **{k: v for k, v in TRIGGER_CHAIN.items() if k != "done"},
    "process_epoch": (["trigger_checkpoint"], ["abort_on_failure", "await_acks"]),
    "await_acks": (["process_epoch"], ["abort_on_failure", "complete_checkpoint"]),
    "complete_checkpoint": (["await_acks"], ["abort_on_failure", "notify_checkpoint"]),
    "notify_checkpoint": (["complete_checkpoint"], ["retention"]),
    "retention": (["notify_checkpoint"], []),
    "abort_on_failure": (
        ["await_acks", "complete_checkpoint", "process_epoch", "trigger_checkpoint"],
        [],
    ),
}


def test_pipeline_dags_gives_four_dags_and_touches_no_storage(tmp_path: Path) -> None:
    storage = tmp_path / "never-created"
    dags = pipeline_dags(make_spec(storage=storage.as_uri()), start_date=START)
    assert sorted(dags) == ["wc_cancel", "wc_pipeline", "wc_restore", "wc_savepoint"]
    assert all(dag.dag_id == dag_id for dag_id, dag in dags.items())
    assert not storage.exists()


def test_pipeline_dag_chain_with_one_checkpoint_in_flight() -> None:
    dag = pipeline_dags(make_spec(), start_date=START, tags=("demo",))["wc_pipeline"]
    assert edges(dag) == CHAIN
    assert dag.max_active_runs == 1
    assert dag.schedule == timedelta(seconds=90)
    assert dag.catchup is False
    assert sorted(dag.tags) == ["demo", "microcheckpoint", "wc"]
    rules = {t.task_id: t.trigger_rule for t in dag.tasks}
    assert rules.pop("abort_on_failure") == TriggerRule.ONE_FAILED
    assert set(rules.values()) == {TriggerRule.ALL_SUCCESS}
    process = dag.get_task("process_epoch")
    assert (process.trigger, process.gate, process.checkpoint_id) == (True, True, None)
    assert dag.get_task("abort_on_failure").checkpoint_id == CID_IN_EPOCH
    assert (process.retries, process.retry_delay) == (3, timedelta(seconds=5))
    # The task enforces the checkpoint timeout itself (``DeadlineWatch``): no sensor beside
    # it, so the run ends with the epoch task.
    assert "checkpoint_timeout" not in dag.task_ids
    # Succeeded, it skips every task after it: the scheduler ends the run one loop sooner.
    assert (
        set(process.skip_on_success) == process.downstream_task_ids == {"done", "abort_on_failure"}
    )


def test_spark_submit_epochs_await_acks_then_complete_and_notify() -> None:
    dag = pipeline_dags(make_spec(), start_date=START, spark=SparkSubmit())["wc_pipeline"]
    assert edges(dag) == SUBMIT_CHAIN
    for task_id in ("process_epoch", "await_acks", "complete_checkpoint", "notify_checkpoint"):
        assert dag.get_task(task_id).checkpoint_id == CID
    assert dag.get_task("await_acks").timeout == 180.0  # timeout + 60 s
    sensor = dag.get_task("checkpoint_timeout")
    assert (sensor.id_task, sensor.id_key, sensor.timeout) == (
        "trigger_checkpoint",
        "return_value",
        180.0,
    )
    notify = dag.get_task("notify_checkpoint")
    assert (notify.retries, notify.retry_delay) == (5, timedelta(seconds=10))


def test_pipeline_dag_with_two_checkpoints_in_flight_awaits_the_base_state() -> None:
    spec = make_spec(checkpointing={"max_concurrent": 2, "min_pause": 0})
    dag = pipeline_dags(spec, start_date=START)["wc_pipeline"]
    expected = dict(TRIGGER_CHAIN)
    expected["trigger_checkpoint"] = (
        ["wait_max_concurrent"],
        ["abort_on_failure", "await_base_state", "checkpoint_timeout"],
    )
    expected["await_base_state"] = (["trigger_checkpoint"], ["abort_on_failure", "process_epoch"])
    expected["process_epoch"] = (["await_base_state"], ["abort_on_failure", "done"])
    expected["abort_on_failure"] = (
        ["await_base_state", "process_epoch", "trigger_checkpoint"],
        [],
    )
    assert edges(dag) == expected
    assert dag.max_active_runs == 2
    base = dag.get_task("await_base_state")
    assert (base.kind, base.checkpoint_id, base.timeout) == ("base_state", CID, 120.0)
    process = dag.get_task("process_epoch")
    assert (process.trigger, process.checkpoint_id) == (False, CID)
    assert set(process.skip_on_success) == process.downstream_task_ids
    trigger = dag.get_task("trigger_checkpoint")
    assert (trigger.retries, trigger.retry_delay) == (3, timedelta(seconds=5))


def test_a_min_pause_forces_one_checkpoint_in_flight() -> None:
    spec = make_spec(checkpointing={"max_concurrent": 2, "min_pause": "5s"})
    assert spec.config.effective_max_concurrent == 1
    dag = pipeline_dags(spec, start_date=START)["wc_pipeline"]
    assert edges(dag) == CHAIN
    assert dag.max_active_runs == 1


def test_data_interval_epochs_run_one_at_a_time() -> None:
    spec = make_spec(
        checkpointing={"barrier_policy": "data_interval", "interval": "1h", "max_concurrent": 3}
    )
    dag = pipeline_dags(spec, start_date=START)["wc_pipeline"]
    assert edges(dag) == CHAIN
    assert dag.max_active_runs == 1
    # Real contiguous intervals (a plain timedelta gives point-in-time runs in Airflow 3).
    assert dag.schedule == DeltaDataIntervalTimetable(timedelta(hours=1))
    assert dag.schedule != DeltaDataIntervalTimetable(timedelta(hours=2))


def test_no_interval_means_no_schedule() -> None:
    spec = PipelineSpec(name="wc", pipeline="m:p", checkpointing={"storage": "file:///srv/c"})
    assert pipeline_dags(spec, start_date=START)["wc_pipeline"].schedule is None


def test_spark_submit_runs_the_epoch_through_the_spark_connection() -> None:
    spark = SparkSubmit("spark_yarn", conf=(("spark.x", "1"),), executor_memory="2g")
    dag = pipeline_dags(make_spec(), start_date=START, spark=spark)["wc_pipeline"]
    process = dag.get_task("process_epoch")
    assert type(process) is EpochSparkSubmitOperator
    assert process._conn_id == "spark_yarn"
    assert process.conf == {"spark.x": "1"}
    assert process._executor_memory == "2g"
    assert process.checkpoint_id == CID
    assert process.name == "microcheckpoint-wc"
    assert process.execution_timeout == timedelta(minutes=2)


@pytest.mark.parametrize("spark", [None, LocalSpark(), LocalSpark("local[3]")])
def test_local_spark_runs_the_epoch_in_the_task(spark) -> None:
    dag = pipeline_dags(make_spec(), start_date=START, spark=spark)["wc_pipeline"]
    process = dag.get_task("process_epoch")
    assert type(process) is LocalEpochOperator
    assert process.master == (spark or LocalSpark()).master
    # The task triggers too, after its session starts: the checkpoint's timeout (2 min)
    # comes before the task's.
    assert process.execution_timeout == timedelta(minutes=4)


def test_spark_connect_runs_the_epoch_as_a_client_of_the_connection() -> None:
    dag = pipeline_dags(make_spec(), start_date=START, spark=SparkConnect("sc"))["wc_pipeline"]
    process = dag.get_task("process_epoch")
    assert type(process) is ConnectEpochOperator
    assert process.conn_id == "sc"
    assert edges(dag) == CHAIN
    assert set(process.skip_on_success) == process.downstream_task_ids


# ---- the savepoint and restore DAGs ---------------------------------------------------------


def test_savepoint_dag() -> None:
    dag = pipeline_dags(make_spec(), start_date=START)["wc_savepoint"]
    assert edges(dag) == {
        "validate_target": ([], ["stop_triggering"]),
        "stop_triggering": (["validate_target"], ["await_in_flight"]),
        "await_in_flight": (["stop_triggering"], ["resume_on_failure", "take_savepoint"]),
        "take_savepoint": (["await_in_flight"], ["pause_pipeline", "resume_on_failure"]),
        "pause_pipeline": (["take_savepoint"], []),
        "resume_on_failure": (["await_in_flight", "take_savepoint"], []),
    }
    assert dag.get_task("resume_on_failure").trigger_rule == TriggerRule.ONE_FAILED
    assert dag.get_task("validate_target").target_url == "{{ params.target }}"
    assert {k: dag.params.get_param(k).value for k in dag.params} == {"target": None, "stop": False}
    # The UI's form enables Trigger only when every field validates: an empty target must.
    target = dag.params.get_param("target")
    assert target.schema["type"] == ["null", "string"]
    target.resolve(None)
    target.resolve("")
    assert dag.params.get_param("stop").schema["type"] == "boolean"
    assert (dag.schedule, dag.max_active_runs, dag.is_paused_upon_creation) == (None, 1, False)
    assert dag.get_task("take_savepoint").target_url == "{{ params.target }}"
    assert dag.get_task("pause_pipeline").paused is True
    pause = dag.get_task("pause_pipeline")
    assert (pause.retries, pause.retry_delay) == (3, timedelta(seconds=5))


def test_restore_dag() -> None:
    spec = make_spec(parallelism=3, checkpointing={"max_parallelism": 16})
    dag = pipeline_dags(spec, start_date=START)["wc_restore"]
    assert edges(dag) == {
        "validate_point": ([], ["stop_triggering"]),
        "stop_triggering": (["validate_point"], ["await_in_flight"]),
        "await_in_flight": (["stop_triggering"], ["restore"]),
        "restore": (["await_in_flight"], ["resume_pipeline"]),
        "resume_pipeline": (["restore"], []),
    }
    assert {k: dag.params.get_param(k).value for k in dag.params} == {
        "point": "latest",
        "claim_mode": "NO_CLAIM",
        "allow_non_restored_state": False,
        "parallelism": 3,
        "resume": True,
    }
    assert dag.params.get_param("claim_mode").schema["enum"] == ["NO_CLAIM", "CLAIM"]
    parallelism = dag.params.get_param("parallelism").schema
    assert (parallelism["type"], parallelism["minimum"], parallelism["maximum"]) == (
        "integer",
        1,
        16,
    )
    assert (dag.schedule, dag.max_active_runs, dag.is_paused_upon_creation) == (None, 1, False)
    assert dag.get_task("resume_pipeline").paused is False
    resume = dag.get_task("resume_pipeline")
    assert (resume.retries, resume.retry_delay) == (3, timedelta(seconds=5))


# ---- the DAG files, imported with the edge packages refused ---------------------------------

IMPORT_DAG_FILES = textwrap.dedent(
    """
    import importlib.util
    import sys

    BLOCKED = ("kafka", "boto3", "botocore", "pyspark", "pyiceberg")
    REFUSED = []

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                REFUSED.append(name)
                raise ImportError(f"blocked edge package {name!r}")
            return None

    if sys.argv[1] == "control":
        print("findable", [importlib.util.find_spec(n) is not None for n in BLOCKED])
        sys.meta_path.insert(0, Refuse())
        try:
            import boto3  # noqa: F401
        except ImportError as exc:
            print("refused", exc)
        raise SystemExit(0)

    sys.meta_path.insert(0, Refuse())
    from airflow.sdk import DAG

    for index, path in enumerate(sys.argv[1:]):
        spec = importlib.util.spec_from_file_location(f"dag_file_{index}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(path, sorted(k for k, v in vars(module).items() if isinstance(v, DAG)))
    print("refused", REFUSED)
    print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """
)


def run_script(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WORDCOUNT_", "MICROCHECKPOINT_", "AIRFLOW"))
    }
    home = tmp_path / "airflow-home"
    home.mkdir(exist_ok=True)
    clean.update(PYTHONPATH=".", AIRFLOW_HOME=str(home), **env)
    return subprocess.run(
        [sys.executable, "-c", IMPORT_DAG_FILES, *args],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_blocker_refuses_boto3(tmp_path: Path) -> None:
    result = run_script(tmp_path, "control")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "findable [True, True, True, True, True]",  # installed: refusing them means something
        "refused blocked edge package 'boto3'",
    ]


def test_dag_files_import_without_kafka_s3_spark_or_iceberg(tmp_path: Path) -> None:
    files = ("wordcount.py", "wordcount_hourly.py", "nexmark_stages.py", "wordcount_events.py")
    result = run_script(tmp_path, *(f"dags/{f}" for f in files))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "dags/wordcount.py ['wordcount_cancel', 'wordcount_pipeline', 'wordcount_restore', "
        "'wordcount_savepoint']",
        "dags/wordcount_hourly.py ['wordcount_hourly_cancel', 'wordcount_hourly_pipeline', "
        "'wordcount_hourly_restore', 'wordcount_hourly_savepoint']",
        "dags/nexmark_stages.py ['nexmark-hot-items_cancel', 'nexmark-hot-items_pipeline', "
        "'nexmark-hot-items_restore', 'nexmark-hot-items_savepoint', 'nexmark-join_cancel', "
        "'nexmark-join_pipeline', 'nexmark-join_restore', 'nexmark-join_savepoint', "
        "'nexmark_global_restore', 'nexmark_global_savepoint']",
        # The watcher's trigger is the Kafka provider's (confluent-kafka): no kafka-python.
        "dags/wordcount_events.py ['wordcount_events_cancel', 'wordcount_events_pipeline', "
        "'wordcount_events_restore', 'wordcount_events_savepoint']",
        "refused []",
        "loaded []",
    ]


def test_a_dag_file_with_a_bad_setting_fails_at_import_naming_the_field(tmp_path: Path) -> None:
    result = run_script(tmp_path, "dags/wordcount.py", WORDCOUNT_MAX_CONCURRENT="0")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "microcheckpoint.errors.ConfigError: config field 'max_concurrent' = 0 is invalid: "
        "an integer >= 1"
    )


def test_every_pipeline_dag_updates_its_asset_and_a_stage_runs_after_its_upstream() -> None:
    first = pipeline_dags(make_spec(), start_date=START)["wc_pipeline"]
    (outlet,) = first.get_task("process_epoch").outlets
    assert outlet.uri == "microcheckpoint://wc/" and outlet.name == "microcheckpoint-wc"
    submit = pipeline_dags(make_spec(), start_date=START, spark=SparkSubmit())["wc_pipeline"]
    assert [a.uri for a in submit.get_task("notify_checkpoint").outlets] == [outlet.uri]
    assert submit.get_task("process_epoch").outlets == []
    stage = make_spec(name="totals", after="wc", checkpointing={"interval": None})
    second = pipeline_dags(stage, start_date=START)["totals_pipeline"]
    assert type(second.timetable).__name__ == "AssetTriggeredTimetable"
    assert [a.uri for a in second.timetable.asset_condition.objects] == ["microcheckpoint://wc/"]


def test_a_stage_after_another_refuses_itself_and_an_interval() -> None:
    with pytest.raises(ConfigError, match="after"):
        make_spec(after="wc")  # its own name
    with pytest.raises(ConfigError, match="interval"):
        make_spec(name="totals", after="wc")  # make_spec sets an interval


def test_a_stage_waits_deferred_for_aligned_inputs_before_its_epoch() -> None:
    stage = make_spec(name="totals", after="wc", checkpointing={"interval": None})
    for spark in (LocalSpark(), SparkSubmit()):
        dag = pipeline_dags(stage, start_date=START, spark=spark)["totals_pipeline"]
        graph = edges(dag)
        after = ["trigger_checkpoint"]
        if not isinstance(spark, SparkSubmit):
            after = ["process_epoch"]
        assert graph["wait_aligned"] == (["wait_max_concurrent"], after)
        sensor = dag.get_task("wait_aligned")
        assert type(sensor).__name__ == "AlignmentSensor" and sensor.deferrable
        assert sensor.timeout == 120 + 60  # the checkpoint timeout fails it first, by name
        assert "inputs aligned (upstream wc)" in dag.doc_md
    first = pipeline_dags(make_spec(), start_date=START)["wc_pipeline"]
    assert "wait_aligned" not in first.task_ids


def test_global_dags_take_and_restore_every_stage() -> None:
    first = make_spec(name="join")
    second = make_spec(name="hot", after="join", checkpointing={"interval": None})
    dags = global_dags("nex", [first, second], start_date=START)
    assert sorted(dags) == ["nex_global_restore", "nex_global_savepoint"]
    savepoint = dags["nex_global_savepoint"]
    assert [t.task_id for t in savepoint.tasks] == ["take_global_savepoint"]
    assert savepoint.params["target"] is None
    restore = dags["nex_global_restore"]
    assert edges(restore) == {
        "validate_point": ([], ["stop_hot", "stop_join"]),
        "stop_join": (["validate_point"], ["await_join"]),
        "stop_hot": (["validate_point"], ["await_hot"]),
        "await_join": (["stop_join"], ["restore_all"]),
        "await_hot": (["stop_hot"], ["restore_all"]),
        "restore_all": (["await_hot", "await_join"], ["resume_hot", "resume_join"]),
        "resume_join": (["restore_all"], []),
        "resume_hot": (["restore_all"], []),
    }
    assert restore.params["parallelism"] == {} and restore.params["claim_mode"] == "NO_CLAIM"
    with pytest.raises(ConfigError, match="two or more stages"):
        global_dags("nex", [first], start_date=START)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"nope": 2}', "config field 'parallelism' = 'nope' is invalid: one of the stages"),
        ('{"join": 0}', "config field 'parallelism of join' = 0 is invalid: an integer in 1..128"),
        ("[1]", "config field 'parallelism' = [1] is invalid: a JSON object"),
        ("{", "config field 'parallelism' = '{' is invalid: a JSON object"),
    ],
)
def test_a_global_restore_refuses_a_bad_parallelism(raw: str, message: str) -> None:
    from microcheckpoint.ops import StorageSettings
    from microcheckpoint.ops.global_points import stage_parallelisms

    first = make_spec(name="join")
    second = make_spec(name="hot", after="join", checkpointing={"interval": None})
    targets = [s.target(StorageSettings()) for s in (first, second)]
    with pytest.raises(ConfigError) as err:
        stage_parallelisms(raw, targets)
    assert str(err.value).startswith(message)
    assert stage_parallelisms('{"join": 3}', targets) == {"join": 3}
