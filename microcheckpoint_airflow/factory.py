"""The DAG factory: a pipeline's three DAGs from a few lines in ``dags/``.

    pipeline_dags(PipelineSpec(name="wordcount", pipeline="examples.wordcount:pipeline",
                               checkpointing={"storage": "s3://bucket/checkpoints",
                                              "interval": "1m"}),
                  start_date=datetime(2026, 1, 1))

gives ``wordcount_pipeline`` (scheduled at ``interval``), ``wordcount_savepoint`` and
``wordcount_restore`` (triggered from the UI with a Params form). Building the DAGs only
validates settings: no broker, storage or Spark is contacted at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, DeltaDataIntervalTimetable, Param, TriggerRule

from microcheckpoint.config import BarrierPolicy, ExternalizedCleanup
from microcheckpoint.errors import ConfigError
from microcheckpoint_airflow.global_points import (
    GlobalRestoreOperator,
    GlobalSavepointOperator,
    ValidateGlobalRestoreOperator,
)
from microcheckpoint_airflow.operators import (
    AbortCheckpointOperator,
    CancelOperator,
    CompleteCheckpointOperator,
    ConnectEpochOperator,
    EpochSparkSubmitOperator,
    LocalEpochOperator,
    NotifyCheckpointOperator,
    RestoreOperator,
    ResumeTriggeringOperator,
    RetentionOperator,
    SavepointOperator,
    SetPausedOperator,
    SuspendPipelineOperator,
    TriggerCheckpointOperator,
    ValidateRestoreOperator,
    ValidateSavepointOperator,
)
from microcheckpoint_airflow.registry import register
from microcheckpoint_airflow.sensors import (
    AlignmentSensor,
    AwaitAcksSensor,
    BaseStateSensor,
    CheckpointTimeoutSensor,
    ConcurrencySensor,
    MinPauseSensor,
    QuietSensor,
)
from microcheckpoint_airflow.spec import PipelineSpec

__all__ = [
    "LocalSpark",
    "PipelineSpec",
    "SparkConnect",
    "SparkSubmit",
    "global_dags",
    "pipeline_dags",
    "spark_mode",
]

CID = "{{ ti.xcom_pull(task_ids='trigger_checkpoint') }}"
# The id when the epoch task triggers the checkpoint itself.
CID_IN_EPOCH = "{{ ti.xcom_pull(task_ids='process_epoch', key='checkpoint_id') }}"
TRIGGER_RETRY: dict[str, Any] = {"retries": 3, "retry_delay": timedelta(seconds=5)}


@dataclass(frozen=True)
class LocalSpark:
    """Run each epoch with local Spark inside the Airflow task (the embedded default)."""

    master: str = "local[2]"


@dataclass(frozen=True)
class SparkConnect:
    """Run each epoch as a client of a Spark Connect server (one warm JVM for every epoch).

    ``conn_id`` is a Spark provider ``spark_connect`` connection (host and port of the server).
    """

    conn_id: str = "spark_connect_default"


@dataclass(frozen=True)
class SparkSubmit:
    """Run each epoch with ``spark-submit`` through the Spark provider's connection."""

    conn_id: str = "spark_default"
    conf: tuple[tuple[str, str], ...] = ()
    executor_memory: str | None = None
    driver_memory: str | None = None


Spark = LocalSpark | SparkConnect | SparkSubmit


def spark_mode(mode: str, conn_id: str | None = None) -> Spark:
    """How epochs run, by name: ``local`` (in the task), ``connect`` (a Spark Connect client,
    connection ``conn_id`` or ``spark_connect_default``) or ``submit`` (``spark-submit``,
    connection ``conn_id`` or ``spark_default``); for DAG files configured by the environment.
    """
    if mode == "local":
        return LocalSpark()
    if mode == "connect":
        return SparkConnect(conn_id or "spark_connect_default")
    if mode == "submit":
        return SparkSubmit(conn_id or "spark_default")
    raise ConfigError("spark mode", mode, "one of local, connect, submit")


# Pausing and unpausing go through Airflow's REST API, which may briefly refuse a call (an API
# server restarting, a busy metadata database); the call is idempotent, so try it again.
API_RETRY: dict[str, Any] = {"retries": 3, "retry_delay": timedelta(seconds=5)}


def pipeline_asset(pipeline: str) -> Asset:
    """The Asset a completed (and notified) checkpoint of ``pipeline`` updates."""
    return Asset(uri=f"microcheckpoint://{pipeline}", name=f"microcheckpoint-{pipeline}")


def records_asset(spec: PipelineSpec) -> Asset:
    """The Asset whose watcher wakes an event-driven pipeline (``spec.watch_conn_id``): a
    Kafka ``MessageQueueTrigger`` on the source topics whose apply function lets through
    only records that no completed checkpoint holds (``watch.record_arrived``)."""
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import AssetWatcher

    topics = list(spec.config.topics)
    trigger = MessageQueueTrigger(
        scheme="kafka",
        topics=topics,
        kafka_config_id=spec.watch_conn_id,
        apply_function="microcheckpoint_airflow.watch.record_arrived",
        apply_function_kwargs={
            "storage": spec.config.storage,
            "pipeline": spec.name,
            "storage_conn_id": spec.storage_conn_id,
        },
        poll_timeout=1,
        poll_interval=0,  # after a skipped record: read the next one at once
    )
    return Asset(
        uri=f"kafka://{spec.watch_conn_id}/{','.join(topics)}",
        name=f"microcheckpoint-{spec.name}-records",
        watchers=[AssetWatcher(name=f"{spec.name}_records", trigger=trigger)],
    )


def _schedule(spec: PipelineSpec, data_interval: bool) -> Any:
    """Every ``interval``; after the upstream stage's checkpoints (``after``); when records
    arrive (``watch_conn_id``), and then also every ``interval`` when one is set."""
    config = spec.config
    every = None if config.interval is None else timedelta(seconds=config.interval)
    if spec.after is not None:
        return [pipeline_asset(spec.after)]  # each completed upstream checkpoint
    if spec.watch_conn_id is not None:
        if every is None:
            return [records_asset(spec)]
        from airflow.timetables.assets import AssetOrTimeSchedule
        from airflow.timetables.trigger import DeltaTriggerTimetable

        return AssetOrTimeSchedule(
            timetable=DeltaTriggerTimetable(every), assets=records_asset(spec)
        )
    if every is None:
        return None
    # Airflow 3 gives a plain timedelta point-in-time runs (start == end); policy
    # data_interval needs real contiguous intervals, as backfills create them.
    return DeltaDataIntervalTimetable(every) if data_interval else every


def _epoch_tasks(spec: PipelineSpec, spark: Spark, epoch: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The tasks from the Spark epoch on: the epoch task and those whose failure aborts
    the checkpoint."""
    timeout_s = spec.config.timeout
    # The task that notifies a completed checkpoint updates the pipeline's Asset, which
    # schedules the DAGs of the stages after it.
    outlets = [pipeline_asset(spec.name)]
    if not isinstance(spark, SparkSubmit):
        # Spark runs in the task: its acks are in when the job returns, so the task
        # completes and notifies the checkpoint itself, and notify enforces retention
        # (one task start, not five).
        # The epoch task skips its followers when it succeeds: the scheduler then ends the
        # run in the loop that sees the task end (it marks them in that loop otherwise, and
        # ends the run in the next).
        followers = ("done", "abort_on_failure")
        if isinstance(spark, SparkConnect):
            process = ConnectEpochOperator(
                conn_id=spark.conn_id, outlets=outlets, skip_on_success=followers, **epoch
            )
        else:
            process = LocalEpochOperator(
                master=spark.master, outlets=outlets, skip_on_success=followers, **epoch
            )
        # A leaf after the epoch, so that a failed epoch fails the run (a run's state is its
        # leaves'): upstream_failed then. An EmptyOperator: no worker starts for it.
        process >> EmptyOperator(task_id="done")
        return process, [process]
    process = EpochSparkSubmitOperator(
        conn_id=spark.conn_id,
        conf=dict(spark.conf),
        executor_memory=spark.executor_memory,
        driver_memory=spark.driver_memory,
        **epoch,
    )
    # The job runs elsewhere: wait for its acks, then the global ack, then notify.
    await_acks = AwaitAcksSensor(
        task_id="await_acks", spec=spec, checkpoint_id=CID, timeout=timeout_s + 60
    )
    complete = CompleteCheckpointOperator(
        task_id="complete_checkpoint", spec=spec, checkpoint_id=CID
    )
    notify = NotifyCheckpointOperator(
        task_id="notify_checkpoint",
        spec=spec,
        checkpoint_id=CID,
        outlets=outlets,
        retries=5,
        retry_delay=timedelta(seconds=10),
    )
    retention = RetentionOperator(task_id="retention", spec=spec)
    process >> await_acks >> complete >> notify >> retention
    return process, [process, await_acks, complete]


def _pipeline_dag(spec: PipelineSpec, spark: Spark, common: dict) -> DAG:
    config = spec.config
    timeout_s = config.timeout
    data_interval = config.barrier_policy is BarrierPolicy.DATA_INTERVAL
    schedule = _schedule(spec, data_interval)
    base_wait = config.effective_max_concurrent > 1 and not data_interval
    one_task = not isinstance(spark, SparkSubmit) and not base_wait
    # The one-task epoch of a pipeline that is no stage waits for min pause and max
    # concurrent itself (deferred), so an epoch is one task start; a stage's run waits for
    # them, then for its inputs' markers, as sensors.
    gated = one_task and spec.after is None
    if isinstance(spark, SparkSubmit):
        steps = "trigger (barrier) → Spark epoch → await acks → complete → notify → retention"
    elif base_wait:
        steps = "trigger (barrier) → await base state → Spark epoch, complete and notify"
    elif gated:
        steps = (
            "one task: min pause and max concurrent (deferred while they do not hold), "
            "trigger (barrier), Spark epoch, complete and notify"
        )
    else:
        steps = "trigger (barrier), Spark epoch, complete and notify in one task"
    dag = DAG(
        dag_id=spec.dag_id,
        schedule=schedule,
        # One run per checkpoint in flight; data_interval epochs go strictly in order.
        max_active_runs=1 if data_interval else config.effective_max_concurrent,
        description=f"checkpointed epochs of pipeline {spec.name}",
        doc_md=(
            f"Each run is one checkpoint of **{spec.name}**: "
            f"{'' if gated else 'min pause → max concurrent → '}"
            f"{'inputs aligned (upstream ' + spec.after + ') → ' if spec.after else ''}{steps} (timeout {timeout_s:g}s). Pause this DAG to stop "
            f"triggering; resume from a savepoint with `{spec.restore_dag_id}`."
            + (
                f" Runs when records arrive on {', '.join(config.topics)} that no completed "
                f"checkpoint holds (watcher connection `{spec.watch_conn_id}`)"
                f"{', and every ' + format(config.interval, 'g') + 's' if config.interval else ''}."
                if spec.watch_conn_id
                else ""
            )
        ),
        **common,
    )
    with dag:
        gate_concurrency: Any = None
        if not gated:
            gate_pause = MinPauseSensor(task_id="wait_min_pause", spec=spec)
            gate_concurrency = ConcurrencySensor(task_id="wait_max_concurrent", spec=spec)
            gate_pause >> gate_concurrency
        if spec.after is not None:
            # A stage: wait, deferred, until its inputs have the upstream's markers, so the
            # trigger cuts at once instead of holding a worker slot while it waits.
            aligned = AlignmentSensor(task_id="wait_aligned", spec=spec, timeout=timeout_s + 60)
            gate_concurrency >> aligned
            gate_concurrency = aligned
        epoch = {
            "task_id": "process_epoch",
            "spec": spec,
            "checkpoint_id": CID,
            "execution_timeout": timedelta(seconds=timeout_s),
        }
        if one_task:
            # One task places the barrier and runs the epoch: no task start between them.
            # The barrier comes after the task's start and its Spark session (a local JVM
            # starts in about 15 s), so the checkpoint's own timeout (which the task
            # enforces from the barrier on) must come first: the task gets 120 s more.
            # (A deferred wait for the gate does not count against execution_timeout.)
            epoch.update(
                checkpoint_id=None,
                trigger=True,
                gate=gated,
                execution_timeout=timedelta(seconds=timeout_s + 120),
                **TRIGGER_RETRY,
            )
            cid = CID_IN_EPOCH
            process, failing = _epoch_tasks(spec, spark, epoch)
            # The checkpoint timeout is enforced inside the task from its barrier
            # (``DeadlineWatch``): a sensor beside it would hold the run until the
            # triggerer hands its event on (up to a second after the epoch). A task that
            # dies is aborted by ``abort_on_failure``, as EXPIRED past the deadline.
            if gate_concurrency is not None:
                gate_concurrency >> process
        else:
            cid = CID
            trigger = TriggerCheckpointOperator(
                task_id="trigger_checkpoint", spec=spec, **TRIGGER_RETRY
            )
            gate_concurrency >> trigger
            process, failing = _epoch_tasks(spec, spark, epoch)
            failing.insert(0, trigger)
            trigger >> CheckpointTimeoutSensor(
                task_id="checkpoint_timeout",
                spec=spec,
                id_task="trigger_checkpoint",
                timeout=timeout_s + 60,
            )
            if base_wait:
                base = BaseStateSensor(
                    task_id="await_base_state", spec=spec, checkpoint_id=CID, timeout=timeout_s
                )
                trigger >> base >> process
                failing.append(base)
            else:
                trigger >> process
        abort = AbortCheckpointOperator(
            task_id="abort_on_failure",
            spec=spec,
            checkpoint_id=cid,
            trigger_rule=TriggerRule.ONE_FAILED,
        )
        failing >> abort
    return dag


def _savepoint_dag(spec: PipelineSpec, common: dict) -> DAG:
    dag = DAG(
        dag_id=spec.savepoint_dag_id,
        schedule=None,
        max_active_runs=1,
        description=f"take a savepoint of pipeline {spec.name}",
        params={
            "target": Param(
                None,
                type=["null", "string"],
                title="Target location",
                description=(
                    "Folder URL under one of the roots "
                    f"({', '.join(spec.roots)}); empty: <storage>/{spec.name}/savepoints/"
                ),
            ),
            "stop": Param(
                False,
                type="boolean",
                title="Stop the pipeline afterwards",
                description=(
                    "Stop triggering, wait for checkpoints in flight, take the savepoint, "
                    f"then pause {spec.dag_id} (stop with savepoint)"
                ),
            ),
        },
        **common,
    )
    with dag:
        # The target is checked before anything stops; a stop whose savepoint then fails
        # resumes triggering: the pipeline keeps running, as in Flink.
        validate = ValidateSavepointOperator(
            task_id="validate_target", spec=spec, target="{{ params.target }}"
        )
        suspend = SuspendPipelineOperator(
            task_id="stop_triggering",
            spec=spec,
            when="{{ params.stop }}",
            reason="stop with savepoint ({{ run_id }})",
        )
        quiet = QuietSensor(
            task_id="await_in_flight",
            spec=spec,
            when="{{ params.stop }}",
            timeout=spec.config.timeout + 60,
        )
        savepoint = SavepointOperator(
            task_id="take_savepoint", spec=spec, target="{{ params.target }}"
        )
        pause = SetPausedOperator(
            task_id="pause_pipeline", spec=spec, paused=True, when="{{ params.stop }}", **API_RETRY
        )
        # Only a stop this run made is undone: a run refused before stop_triggering (an
        # unknown conf key, a bad target) must not clear a stop an earlier run left.
        resume = ResumeTriggeringOperator(
            task_id="resume_on_failure",
            spec=spec,
            when="{{ params.stop and ti.xcom_pull(task_ids='stop_triggering') }}",
            trigger_rule=TriggerRule.ONE_FAILED,
        )
        validate >> suspend >> quiet >> savepoint >> pause
        [quiet, savepoint] >> resume
    return dag


def _restore_dag(spec: PipelineSpec, common: dict) -> DAG:
    config = spec.config
    dag = DAG(
        dag_id=spec.restore_dag_id,
        schedule=None,
        max_active_runs=1,
        description=f"restore pipeline {spec.name} from a savepoint or checkpoint",
        params={
            "point": Param(
                "latest",
                type="string",
                title="Checkpoint or savepoint",
                description=(
                    "'latest' (the latest usable completed checkpoint), a checkpoint id "
                    "(7 or chk-7), or the URL of a savepoint folder under "
                    f"{', '.join(spec.roots)}"
                ),
            ),
            "claim_mode": Param(
                "NO_CLAIM",
                enum=["NO_CLAIM", "CLAIM"],
                title="Claim mode",
                description=(
                    "NO_CLAIM: the point stays untouched and the first checkpoint is full; "
                    "CLAIM: the pipeline takes ownership of the point's files"
                ),
            ),
            "allow_non_restored_state": Param(
                False,
                type="boolean",
                title="Allow non-restored state",
                description=(
                    "Restore a point holding state the pipeline no longer declares (whole "
                    "operators, or named states of a process function): it is left unread"
                ),
            ),
            "parallelism": Param(
                spec.parallelism,
                type="integer",
                minimum=1,
                maximum=config.max_parallelism,
                title="Parallelism",
                description="Subtasks per keyed operator from now on (rescale by key groups)",
            ),
            "resume": Param(
                True,
                type="boolean",
                title="Resume the pipeline",
                description=f"Unpause {spec.dag_id} after the restore",
            ),
        },
        **common,
    )
    request = {
        "point": "{{ params.point }}",
        "claim_mode": "{{ params.claim_mode }}",
        "allow_non_restored_state": "{{ params.allow_non_restored_state }}",
        "parallelism": "{{ params.parallelism }}",
    }
    with dag:
        validate = ValidateRestoreOperator(task_id="validate_point", spec=spec, **request)
        suspend = SuspendPipelineOperator(
            task_id="stop_triggering", spec=spec, reason="restore ({{ run_id }})"
        )
        quiet = QuietSensor(task_id="await_in_flight", spec=spec, timeout=spec.config.timeout + 60)
        rebase = RestoreOperator(task_id="restore", spec=spec, **request)
        resume = SetPausedOperator(
            task_id="resume_pipeline",
            spec=spec,
            paused=False,
            when="{{ params.resume }}",
            **API_RETRY,
        )
        validate >> suspend >> quiet >> rebase >> resume
        if spec.watch_conn_id is not None:
            # An event-driven pipeline runs when a record arrives that no completed
            # checkpoint holds; its watcher has read the records after the restored point
            # already, so one run now replays them (a paused DAG runs it when unpaused).
            from airflow.providers.standard.operators.trigger_dagrun import (
                TriggerDagRunOperator,
            )

            resume >> TriggerDagRunOperator(task_id="wake_pipeline", trigger_dag_id=spec.dag_id)
    return dag


def _cancel_dag(spec: PipelineSpec, common: dict) -> DAG:
    policies = ["", *(p.value for p in ExternalizedCleanup)]
    dag = DAG(
        dag_id=spec.cancel_dag_id,
        schedule=None,
        max_active_runs=1,
        description=f"cancel pipeline {spec.name} (Flink's cancel)",
        doc_md=(
            f"Stops triggering, pauses `{spec.dag_id}`, aborts the checkpoint in flight, then "
            "keeps or deletes the pipeline's checkpoints by the cleanup policy (never its "
            f"savepoints). `{spec.restore_dag_id}` starts it again."
        ),
        params={
            "cleanup": Param(
                "",
                enum=policies,
                title="Externalized checkpoint cleanup",
                description=(
                    "empty: the pipeline's own "
                    f"({spec.config.externalized_cleanup.value}); RETAIN_ON_CANCELLATION "
                    "keeps the completed checkpoints to restore from; DELETE_ON_CANCELLATION "
                    "deletes every checkpoint"
                ),
            ),
        },
        **common,
    )
    with dag:
        CancelOperator(task_id="cancel", spec=spec, cleanup="{{ params.cleanup }}", **API_RETRY)
    return dag


def pipeline_dags(
    spec: PipelineSpec,
    *,
    start_date: datetime,
    end_date: datetime | None = None,
    spark: Spark | None = None,
    catchup: bool = False,
    tags: tuple[str, ...] = (),
    default_args: dict[str, Any] | None = None,
) -> dict[str, DAG]:
    """The pipeline, savepoint, restore and cancel DAGs of ``spec``, by DAG id.

    ``end_date`` stops scheduling after that date (backfills over earlier intervals still
    run): for ``data_interval`` pipelines replaying a fixed past range.

    Put them into the DAG file's globals (``globals().update(pipeline_dags(...))``).
    """
    common = {
        "start_date": start_date,
        "end_date": end_date,
        "catchup": catchup,
        "tags": ["microcheckpoint", spec.name, *tags],
        "default_args": dict(default_args or {}),
    }
    spark = spark or LocalSpark()
    register(spec)  # for the Checkpoints page, which never executes DAG files
    dags = [
        _pipeline_dag(spec, spark, common),
        # Triggered by a person only, so active from the start (a paused DAG queues runs).
        _savepoint_dag(spec, {**common, "catchup": False, "is_paused_upon_creation": False}),
        _restore_dag(spec, {**common, "catchup": False, "is_paused_upon_creation": False}),
        _cancel_dag(spec, {**common, "catchup": False, "is_paused_upon_creation": False}),
    ]
    return {dag.dag_id: dag for dag in dags}


def global_dags(
    name: str,
    stages: list[PipelineSpec] | tuple[PipelineSpec, ...],
    *,
    start_date: datetime,
    tags: tuple[str, ...] = (),
    default_args: dict[str, Any] | None = None,
) -> dict[str, DAG]:
    """The global savepoint and global restore DAGs of a multi-stage pipeline ``name`` whose
    stages (each with its own ``pipeline_dags``) are ``stages``, first stage first.

    ``<name>_global_savepoint`` copies the stages' newest aligned cut into one global
    savepoint; ``<name>_global_restore`` stops every stage, waits until none has a
    checkpoint in flight, re-bases all of them on a global savepoint (each with its own
    parallelism, if given) and unpauses their DAGs. docs/stages.md explains both.
    """
    if len(stages) < 2 or len({s.name for s in stages}) != len(stages):
        raise ConfigError(
            "stages", [s.name for s in stages], "two or more stages with distinct names"
        )
    specs = tuple(stages)
    names = ", ".join(s.name for s in specs)
    common = {
        "start_date": start_date,
        "catchup": False,
        "schedule": None,
        "max_active_runs": 1,
        "is_paused_upon_creation": False,  # triggered by a person only
        "tags": ["microcheckpoint", name, *tags],
        "default_args": dict(default_args or {}),
    }
    roots = specs[0].roots
    savepoint = DAG(
        dag_id=f"{name}_global_savepoint",
        description=f"a global savepoint of the stages {names} at one aligned cut",
        params={
            "target": Param(
                None,
                type=["null", "string"],
                title="Target location",
                description=(
                    f"Folder URL under one of the roots ({', '.join(roots)}); empty: "
                    f"{roots[0]}/{name}/global-savepoints"
                ),
            )
        },
        **common,
    )
    with savepoint:
        GlobalSavepointOperator(
            task_id="take_global_savepoint", name=name, specs=specs, target="{{ params.target }}"
        )
    restore = DAG(
        dag_id=f"{name}_global_restore",
        description=f"restore the stages {names} from one global savepoint",
        params={
            "point": Param(
                "",
                type="string",
                minLength=1,
                title="Global savepoint",
                description=f"URL of a global savepoint folder (what {name}_global_savepoint returned)",
            ),
            "claim_mode": Param(
                "NO_CLAIM",
                enum=["NO_CLAIM", "CLAIM"],
                title="Claim mode",
                description="as for one pipeline's restore, for every stage",
            ),
            "parallelism": Param(
                {},
                type="object",
                title="Parallelism per stage",
                description=(
                    'Subtasks per keyed operator from now on, e.g. {"' + specs[0].name + '": 3}; '
                    "stages left out keep theirs"
                ),
            ),
            "resume": Param(
                True, type="boolean", title="Resume the stages", description="Unpause their DAGs"
            ),
        },
        **common,
    )
    request = {
        "name": name,
        "specs": specs,
        "point": "{{ params.point }}",
        "claim_mode": "{{ params.claim_mode }}",
        "parallelism": "{{ params.parallelism | tojson }}",
    }
    with restore:
        validate = ValidateGlobalRestoreOperator(task_id="validate_point", **request)
        rebase = GlobalRestoreOperator(task_id="restore_all", **request)
        for spec in specs:
            stop = SuspendPipelineOperator(
                task_id=f"stop_{spec.name}", spec=spec, reason="global restore ({{ run_id }})"
            )
            quiet = QuietSensor(
                task_id=f"await_{spec.name}", spec=spec, timeout=spec.config.timeout + 60
            )
            resume = SetPausedOperator(
                task_id=f"resume_{spec.name}",
                spec=spec,
                paused=False,
                when="{{ params.resume }}",
                **API_RETRY,
            )
            validate >> stop >> quiet >> rebase >> resume
    return {savepoint.dag_id: savepoint, restore.dag_id: restore}
