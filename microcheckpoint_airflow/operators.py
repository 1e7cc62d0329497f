"""Operators: each ``execute`` opens the adapters through the hooks and calls the core.

Pipeline DAG: ``LocalEpochOperator`` or ``ConnectEpochOperator`` (trigger, process,
complete and notify in one task), or ``TriggerCheckpointOperator`` → one of them, or
``TriggerCheckpointOperator`` → ``EpochSparkSubmitOperator`` → ``AwaitAcksSensor`` →
``CompleteCheckpointOperator`` → ``NotifyCheckpointOperator``; then ``RetentionOperator``, with ``AbortCheckpointOperator``
when a step fails. Savepoint and restore DAGs: ``SuspendPipelineOperator``,
``SavepointOperator``, ``ValidateRestoreOperator``, ``RestoreOperator`` and
``SetPausedOperator``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, AirflowTaskTimeout

import microcheckpoint
from microcheckpoint.config import BarrierPolicy
from microcheckpoint.errors import (
    CheckpointExpired,
    CheckpointNotFound,
    CommitConflict,
    MicrocheckpointError,
    TriggerRefused,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops import (
    PipelineTarget,
    RestoreRequest,
    StorageSettings,
    apply_restore,
    cancel_pipeline,
    plan_restore,
    plan_savepoint,
    take_savepoint,
)
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import EventKind
from microcheckpoint.protocol.recovery import abort_failed_run, complete_checkpoint, start_epoch
from microcheckpoint.protocol.restores import event_at, first_checkpoint_after
from microcheckpoint.protocol.retention import enforce_retention
from microcheckpoint.protocol.source import group_committer
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.state.evolution import pipeline_descriptors
from microcheckpoint_airflow import metrics
from microcheckpoint_airflow.hooks import AirflowApiHook, CheckpointStorageHook, KafkaHook
from microcheckpoint_airflow.run_conf import refuse_unknown_conf
from microcheckpoint_airflow.spec import PipelineSpec

if TYPE_CHECKING:
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine.sinkstage import SinkPublisher
    from microcheckpoint.protocol.records import CheckpointMetadata

# What the complete step refuses with for good (unknown, expired, aborted): a task fails on
# it without retries; AcksMissing, by contrast, is retried.
COMPLETE_REFUSALS = (CheckpointNotFound, CheckpointExpired, CommitConflict)

__all__ = [
    "AbortCheckpointOperator",
    "CancelOperator",
    "CompleteCheckpointOperator",
    "ConnectEpochOperator",
    "EpochSparkSubmitOperator",
    "LocalEpochOperator",
    "NotifyCheckpointOperator",
    "RestoreOperator",
    "ResumeTriggeringOperator",
    "RetentionOperator",
    "SavepointOperator",
    "SetPausedOperator",
    "SuspendPipelineOperator",
    "TriggerCheckpointOperator",
    "ValidateRestoreOperator",
    "ValidateSavepointOperator",
    "refuse_unknown_conf",
    "task_errors",
    "trigger_checkpoint",
]

# The spark-submit job ships in the package: this path exists in a wheel install too.
RUN_EPOCH = Path(microcheckpoint.__file__).resolve().parent / "run_epoch.py"


@contextmanager
def task_errors() -> Iterator[None]:
    """The one translator of the package's errors into Airflow: a ``MicrocheckpointError``
    fails the task without retries, its message (one line naming the thing, the value and
    the fix) as the failure."""
    try:
        yield
    except MicrocheckpointError as exc:
        raise AirflowFailException(str(exc)) from exc


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def run_labels(context: Any) -> dict[str, str]:
    """The Airflow run a stored record comes from, for the history's links."""
    return {"dag_id": context["dag"].dag_id, "run_id": context["run_id"]}


# The check a gated epoch task waits for: min pause and max concurrent (checks.KINDS),
# and how its log lines name it.
GATE = "concurrency"
GATE_LABEL = "min pause and max concurrent"


class PipelineOperator(BaseOperator):
    """Base: a pipeline's spec, its storage and coordinator, and the checkpoint id."""

    template_fields = ("checkpoint_id",)
    ui_color = "#fef3e8"

    def __init__(
        self, *, spec: PipelineSpec, checkpoint_id: str | int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.checkpoint_id = checkpoint_id

    def cid(self) -> CheckpointId | None:
        if self.checkpoint_id in (None, "", "None"):
            return None
        return CheckpointId(int(self.checkpoint_id))  # type: ignore[arg-type]

    def settings(self) -> StorageSettings:
        return CheckpointStorageHook(self.spec.storage_conn_id).settings()

    def store_options(self) -> dict[str, Any]:
        return self.settings().options(self.spec.config.storage)

    def open_root(self, root: str) -> Any:
        return self.target().locations.store(root)

    def target(self) -> PipelineTarget:
        """The core's view of the pipeline (``microcheckpoint.ops``), opened once per task."""
        if getattr(self, "_target", None) is None:
            self._target = self.spec.target(self.settings())
        return self._target

    def coordinator(self) -> CheckpointCoordinator:
        return self.target().coordinator()

    def load_pipeline(self) -> Any:
        """The pipeline, its sinks given this connection's S3 settings."""
        return self.spec.load_pipeline(self.settings().s3_options())


class TriggerCheckpointOperator(PipelineOperator):
    """Recover, then allocate checkpoint n and write its barrier; returns n (XCom).

    The recovery path is the core's (``protocol.recovery.start_epoch``): finish a claimed
    completion, notify completed checkpoints a failed run left, trigger by barrier policy.
    """

    def execute(self, context: Any) -> int:
        return trigger_checkpoint(self, context, self.coordinator(), self.load_pipeline()).value


def trigger_checkpoint(
    task: PipelineOperator,
    context: Any,
    coord: CheckpointCoordinator,
    pipeline: Any,
    aligned_waited_s: float | None = None,
    begin: bool = False,
    kafka: KafkaOffsets | None = None,
) -> CheckpointId:
    """Recover, then allocate the next checkpoint of ``pipeline`` and write its barrier;
    returns its id. ``aligned_waited_s``: how long a stage waited for its inputs' markers
    (default: until now). ``begin``: this task processes the epoch next with ``coord``
    (``start_epoch``'s ``begin``). ``kafka``: the task's Kafka client, left open (default:
    one of its own, closed after the barrier).

    Skips the task (``AirflowSkipException``) while the pipeline is suspended; a refusal of
    the core fails it without retries.
    """
    from microcheckpoint.engine.runner import expected_tasks
    from microcheckpoint.engine.sinkstage import sink_publisher
    from microcheckpoint.engine.sources import source_offsets

    with _kafka(task, kafka) as client:
        offsets = source_offsets(pipeline.source, client, task.store_options())
        try:
            start = start_epoch(
                coord,
                offsets,
                topics=task.spec.config.topics or pipeline.source.topics,
                expected=lambda p: expected_tasks(pipeline, p),
                default_parallelism=task.spec.parallelism,
                publish=sink_publisher(pipeline, coord.store, coord.config.mode),
                rerun_pending=False,
                interval=_data_interval(context, task.spec),
                labels=run_labels(context),
                aligned_waited_s=(
                    _aligned_waited(context) if aligned_waited_s is None else aligned_waited_s
                ),
                begin=begin,
            )
        except TriggerRefused as exc:
            if coord.trigger_decision().verdict is Verdict.SUSPENDED:
                raise AirflowSkipException(str(exc)) from exc
            raise
        except MicrocheckpointError as exc:
            raise AirflowFailException(str(exc)) from exc
    barrier = coord.barrier(start.checkpoint_id)
    task.log.info(
        "checkpoint %s: %d records, ranges %s",
        start.checkpoint_id,
        barrier.record_count,
        {str(tp): [r.start, r.end] for tp, r in barrier.ranges.items()},
    )
    return start.checkpoint_id


def _aligned_waited(context: Any) -> float:
    """Seconds since the run's alignment sensor began waiting (0 without one)."""
    since = context["ti"].xcom_pull(task_ids="wait_aligned", key="aligned_since")
    return 0.0 if since is None else max(0.0, time.time() - float(since))


def _data_interval(context: Any, spec: PipelineSpec) -> tuple[Any, Any] | None:
    """The run's data interval, for policy ``data_interval`` (None for a run without one)."""
    if spec.config.barrier_policy is not BarrierPolicy.DATA_INTERVAL:
        return None
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    return None if end is None else (start, end)


class LocalEpochOperator(PipelineOperator):
    """Process epoch n with local Spark inside this task (the embedded default), then
    complete and notify it here.

    The epoch's executors have written every ack when the Spark job returns, so no sensor
    has to wait for them: this task takes the global ack (``_metadata``, or EXPIRED past the
    timeout) and notifies (sinks publish, group offsets move) right away. A notify that fails
    leaves the checkpoint completed; the next run's trigger notifies it first. From the
    barrier until the global ack, the task enforces the checkpoint timeout itself
    (``protocol.deadline.DeadlineWatch``): at trigger time + ``timeout`` it aborts the
    checkpoint as EXPIRED, whatever the job is doing, and the task then fails with
    ``checkpoint N of '<name>' expired: ...``.

    With ``trigger=True`` the task also triggers the checkpoint first (``checkpoint_id`` is
    then unset): the barrier is placed when processing starts, not one task start earlier.
    The id goes to XCom (key ``checkpoint_id``) at once, for ``abort_on_failure``. A failure
    before the barrier is retried; once the checkpoint exists, a failure fails the task
    without retries, so the checkpoint is aborted and the next run triggers anew.

    With ``gate=True`` the task is its run's first: it refuses a conf with any key, then
    waits for Flink's minimum pause and maximum concurrent checkpoints (the check of
    ``ConcurrencySensor``: expired checkpoints aborted first; suspended: skipped; stopped by
    the failure policy: failed). When they hold, it goes on at once; a min pause with at
    most ``checks.IN_TASK_WAIT_S`` left it waits out in the task; otherwise it defers to the
    triggerer (no worker slot) and goes on when they hold. One task start per epoch instead
    of three.

    After notifying, the task logs the replay warnings of the retained points
    (``warn_replayability``); retention itself ran in notify.

    ``skip_on_success``: downstream task ids this task marks skipped when it succeeds (its
    XCom pushed first), as Airflow's short-circuit operators do. The pipeline DAG names its
    ``done`` and ``abort_on_failure``: the scheduler then finds the run's every task
    finished in the loop that sees the epoch task end, instead of marking them in that loop
    and ending the run one loop later.
    """

    def __init__(
        self,
        *,
        master: str = "local[2]",
        trigger: bool = False,
        gate: bool = False,
        skip_on_success: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.master = master
        self.trigger = trigger
        self.gate = gate
        self.skip_on_success = tuple(skip_on_success)

    def session(self) -> Any:
        from microcheckpoint.engine.spark import local_spark

        return local_spark(self.master, app=f"microcheckpoint-{self.spec.name}")

    def execute(self, context: Any) -> dict[str, Any]:
        coord = self.coordinator()
        if self.gate:
            from microcheckpoint_airflow.checks import KINDS, CheckState, wait_out_short_pause
            from microcheckpoint_airflow.triggers import CheckpointConditionTrigger

            refuse_unknown_conf(context)
            check = wait_out_short_pause(
                lambda: KINDS[GATE](coord, None),
                lambda text: self.log.info("%s: %s", GATE_LABEL, text),
            )
            if check.state is CheckState.WAIT:
                self.log.info("%s: %s; deferring", GATE_LABEL, check.message)
                config, options = self.spec.config_mapping, self.store_options()
                self.defer(
                    trigger=CheckpointConditionTrigger(GATE, config, options, None, 1.0),
                    method_name="execute_after_gate",
                )
            self._end_of_gate(check)
        return self._succeeded(context, self.run(context, coord))

    def execute_after_gate(
        self, context: Any, event: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Back from the triggerer: the gate's answer, then the epoch."""
        from microcheckpoint_airflow.checks import Check

        if event is None:
            raise AirflowFailException(f"{GATE_LABEL}: the trigger ended without an answer")
        self._end_of_gate(Check.from_event(event))
        return self._succeeded(context, self.run(context))

    def _succeeded(self, context: Any, result: dict[str, Any]) -> dict[str, Any]:
        """``result``, the task's XCom; with ``skip_on_success``, pushed here and those
        tasks skipped (Airflow's task runner skips them, then marks this task success)."""
        if not self.skip_on_success:
            return result
        from airflow.sdk.exceptions import DownstreamTasksSkipped

        context["ti"].xcom_push(key="return_value", value=result)
        raise DownstreamTasksSkipped(tasks=list(self.skip_on_success))

    def _end_of_gate(self, check: Any) -> None:
        from microcheckpoint_airflow.sensors import end_of_check

        end_of_check(self, GATE_LABEL, check)

    def run(self, context: Any, coord: CheckpointCoordinator | None = None) -> dict[str, Any]:
        """Trigger (with ``trigger=True``), process, complete and notify.

        Steps: 1. the broker's address and the Spark session, before the barrier: the
        checkpoint's time starts when the epoch can, not before a session's start (a JVM in
        local mode), and a failure to get them is retried as any before the barrier (a
        stage's alignment wait is taken before them); 2. trigger (``trigger=True``) or the
        id of the run's trigger task; 3. process, complete and notify; 4. stop the session
        (a failure to stop is logged: it must not hide the epoch's own outcome).

        One Kafka client serves the trigger's offsets, notify's group commit and the replay
        warnings: it connects once per task, not once per step.
        """
        coord = coord or self.coordinator()
        pipeline = self.load_pipeline()
        # Step 1
        waited = _aligned_waited(context) if self.trigger else None
        hook = KafkaHook(self.spec.kafka_conn_id)
        bootstrap = hook.bootstrap_servers()
        spark = self.session()
        try:
            with hook.get_offsets() as kafka:
                return self._epoch(context, coord, pipeline, spark, bootstrap, waited, kafka)
        finally:
            # Step 4
            try:
                spark.stop()
            except Exception as exc:  # a dead local JVM, a closed Connect channel
                self.log.warning("stopping the Spark session failed: %s", exc)

    def _epoch(
        self,
        context: Any,
        coord: CheckpointCoordinator,
        pipeline: Any,
        spark: Any,
        bootstrap: str,
        waited: float | None,
        kafka: KafkaOffsets,
    ) -> dict[str, Any]:
        """Steps 2 and 3 of ``run``: once the barrier is placed, a failure fails the task."""
        if not self.trigger:
            return self.process(self.cid(), coord, pipeline, spark, bootstrap, kafka)  # type: ignore[arg-type]
        cid = trigger_checkpoint(
            self, context, coord, pipeline, aligned_waited_s=waited, begin=True, kafka=kafka
        )
        context["ti"].xcom_push(key="checkpoint_id", value=cid.value)
        try:
            return self.process(cid, coord, pipeline, spark, bootstrap, kafka)
        except (AirflowFailException, AirflowSkipException):
            raise
        except (Exception, AirflowTaskTimeout) as exc:  # the timeout is a BaseException
            from microcheckpoint.engine.errors import failure_cause

            raise AirflowFailException(f"checkpoint {cid}: {failure_cause(exc)}") from exc

    def process(
        self,
        cid: CheckpointId,
        coord: CheckpointCoordinator,
        pipeline: Any,
        spark: Any,
        bootstrap: str,
        kafka: KafkaOffsets | None = None,
    ) -> dict[str, Any]:
        """Run epoch ``cid`` in Spark, then complete and notify it; the XCom of the task.
        ``kafka``: the task's Kafka client (default: notify and the warnings open their own)."""
        from microcheckpoint.engine.cycle import process_checkpoint
        from microcheckpoint.engine.sinkstage import sink_publisher

        publish = sink_publisher(pipeline, coord.store, coord.config.mode)
        try:
            result = process_checkpoint(
                spark,
                pipeline,
                coord,
                cid,
                publish,
                bootstrap=bootstrap,
                store_options=self.store_options(),
                accept_completed=True,  # a retried task finds its checkpoint completed
            )
        except COMPLETE_REFUSALS as exc:
            raise AirflowFailException(str(exc)) from exc
        completed = _completed(coord, result.metadata)  # type: ignore[arg-type]
        _notify(self, coord, pipeline, cid, publish, kafka)
        try:
            warn_replayability(self, coord, kafka)
        except Exception as exc:  # the checkpoint is committed: a warning must not fail it
            self.log.warning("replayability check did not run: %s", exc)
        return completed


class ConnectEpochOperator(LocalEpochOperator):
    """Process epoch n as a client of a warm Spark Connect server: no JVM starts in this task.

    The server is the one of the Spark provider's ``spark_connect`` connection ``conn_id``.
    """

    def __init__(self, *, conn_id: str = "spark_connect_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def session(self) -> Any:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from microcheckpoint.engine.spark import connect_spark

        return connect_spark(SparkConnectHook(self.conn_id).get_connection_url())


class EpochSparkSubmitOperator(SparkSubmitOperator):
    """Process epoch n with ``spark-submit spark_jobs/run_epoch.py --checkpoint n``.

    The master comes from the Spark connection (``conn_id``). Storage credentials and the
    Kafka bootstrap go to the job from this pipeline's connections.
    """

    def __init__(
        self,
        *,
        spec: PipelineSpec,
        checkpoint_id: str | int | None = None,
        application: str = str(RUN_EPOCH),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"microcheckpoint-{spec.name}")
        super().__init__(application=application, **kwargs)
        self.spec = spec
        self.checkpoint_id = checkpoint_id

    template_fields = (*SparkSubmitOperator.template_fields, "checkpoint_id")

    def execute(self, context: Any) -> None:
        storage = self.spec.config.storage
        options = CheckpointStorageHook(self.spec.storage_conn_id).store_options(storage)
        args = [
            "--pipeline",
            self.spec.pipeline,
            "--pipeline-kwargs",
            json.dumps(self.spec.pipeline_kwargs),
            "--storage",
            storage,
            "--checkpoint",
            str(int(self.checkpoint_id)),  # type: ignore[arg-type]
            "--bootstrap",
            KafkaHook(self.spec.kafka_conn_id).bootstrap_servers(),
            "--config",
            json.dumps({k: v for k, v in self.spec.config_mapping.items() if k != "pipeline"}),
        ]
        if options.get("endpoint_url"):
            args += ["--s3-endpoint", options["endpoint_url"]]
        self.application_args = args
        env = dict(self.env_vars or {})
        env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PATH", os.environ.get("PATH", ""))
        if options.get("access_key"):
            env.setdefault("AWS_ACCESS_KEY_ID", options["access_key"])
            env.setdefault("AWS_SECRET_ACCESS_KEY", options.get("secret_key", ""))
        if options.get("region"):
            env.setdefault("AWS_DEFAULT_REGION", options["region"])
        self.env_vars = env
        super().execute(context)


def event_kind(target: PipelineTarget, at_ms: int | None) -> str | None:
    """The kind of the restore event written at ``at_ms`` (its marker's time), for metrics."""
    event = event_at(target.store, Layout(target.name), at_ms)
    return None if event is None else event.event_kind.value


def _complete(
    coord: CheckpointCoordinator,
    cid: CheckpointId,
    *,
    then_notify: bool = False,
    on_acked: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The global ack of ``cid`` (idempotent), as the task's XCom; refusals fail the task.
    ``then_notify``, ``on_acked``: see ``CheckpointCoordinator.complete``."""
    try:
        meta = complete_checkpoint(coord, cid, then_notify=then_notify, on_acked=on_acked)
    except COMPLETE_REFUSALS as exc:
        raise AirflowFailException(str(exc)) from exc
    return _completed(coord, meta)


def _completed(coord: CheckpointCoordinator, meta: CheckpointMetadata) -> dict[str, Any]:
    """The metrics of completed checkpoint ``meta``, and its XCom."""
    metrics.checkpoint_completed(coord.config.pipeline, meta.statistics, meta.barrier.record_count)
    metrics.first_checkpoint_after_restore(
        coord.config.pipeline, lambda: first_checkpoint_after(coord.store, coord.layout, meta)
    )
    return {
        "checkpoint": meta.checkpoint_id.value,
        "attempt": meta.attempt,  # the attempt whose acks completed it
        "duration_ms": meta.duration_ms,
        "records": meta.barrier.record_count,
        "offsets": {str(tp): o for tp, o in sorted(meta.offsets.items())},
    }


def _notify(
    task: PipelineOperator,
    coord: CheckpointCoordinator,
    pipeline: Any,
    cid: CheckpointId,
    publish: SinkPublisher | None = None,
    kafka: KafkaOffsets | None = None,
) -> None:
    """notifyCheckpointComplete of ``cid``: sinks publish, group offsets move (idempotent).
    ``publish``: the pipeline's publisher, when the caller made it (default: a new one).
    ``kafka``: the task's Kafka client, left open (default: one of its own)."""
    from microcheckpoint.engine.sinkstage import sink_publisher
    from microcheckpoint.engine.sources import source_offsets

    publish = publish or sink_publisher(pipeline, coord.store, coord.config.mode)
    with _kafka(task, kafka) as client:
        offsets = source_offsets(pipeline.source, client, task.store_options())
        coord.notify(cid, group_committer(offsets, coord.config), publish)


@contextmanager
def _kafka(task: PipelineOperator, kafka: KafkaOffsets | None) -> Iterator[KafkaOffsets]:
    """``kafka`` as it is (its owner closes it), else a client of the task's Kafka
    connection, closed on leaving."""
    if kafka is not None:
        yield kafka
        return
    with KafkaHook(task.spec.kafka_conn_id).get_offsets() as own:
        yield own


class CompleteCheckpointOperator(PipelineOperator):
    """The global ack: write ``_metadata`` of checkpoint n (idempotent on retry).

    Missing acks raise ``AcksMissing``, which Airflow retries; an expired, aborted or
    unknown checkpoint fails the task.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        return _complete(self.coordinator(), self.cid())  # type: ignore[arg-type]


class NotifyCheckpointOperator(PipelineOperator):
    """notifyCheckpointComplete: sinks publish, group offsets move (idempotent)."""

    def execute(self, context: Any) -> None:
        _notify(self, self.coordinator(), self.load_pipeline(), self.cid())  # type: ignore[arg-type]


class RetentionOperator(PipelineOperator):
    """Keep ``retained`` completed checkpoints; delete what nothing retained references.

    Then warn (a WARNING log line each) about every retained checkpoint and savepoint whose
    Kafka offsets were deleted by Kafka's retention or will be within
    ``protocol.replay.DEFAULT_HORIZON_MS``. That check never fails the task: when Kafka
    cannot answer, one WARNING line says the check did not run.
    """

    def execute(self, context: Any) -> list[int]:
        coord = self.coordinator()
        enforce_retention(coord.store, coord.layout, self.spec.config.retained)
        kept = [c.value for c in coord.view().completed]
        self.log.info("retained checkpoints: %s", kept)
        warn_replayability(self, coord)
        return kept


def warn_replayability(
    task: PipelineOperator, coord: CheckpointCoordinator, kafka: KafkaOffsets | None = None
) -> None:
    """Log the replay warnings of the pipeline's retained points (see docs/operations.md).
    ``kafka``: the task's Kafka client, left open (default: one of its own)."""
    from microcheckpoint.adapters.kafka_replay import replay_warnings
    from microcheckpoint.protocol.replay import kafka_positions, retained_points

    pipeline = coord.config.pipeline
    if kafka is None and not kafka_positions(retained_points(coord.store, pipeline)):
        return  # nothing read from Kafka: no Kafka connection needed
    try:
        if kafka is None:
            bootstrap = KafkaHook(task.spec.kafka_conn_id).bootstrap_servers()
        else:
            bootstrap = kafka.bootstrap_servers
        warnings = replay_warnings(coord.store, pipeline, bootstrap, kafka=kafka)
    except MicrocheckpointError as exc:
        task.log.warning("replayability check did not run: %s", exc)
        return
    for warning in warnings:
        task.log.warning("replayability: %s", warning["message"])


class AbortCheckpointOperator(PipelineOperator):
    """After a failed step: abort n (EXPIRED past the timeout, else DECLINED).

    Fails with the reason when consecutive failures now exceed ``tolerable_failures``:
    later runs stop at their first sensor until a person restores the pipeline.
    """

    def execute(self, context: Any) -> None:
        detail = failed_run_detail(context["run_id"], self.failed_tasks(context))
        coord, cid = self.coordinator(), self.cid()
        before = coord.view().pending
        try:
            abort_failed_run(coord, cid, detail)
        except MicrocheckpointError as exc:
            raise AirflowFailException(
                f"{exc}. To resume, trigger DAG {self.spec.restore_dag_id} (point 'latest')"
            ) from exc
        finally:
            # Every checkpoint this task aborted (its own, and any that expired) counts.
            records = coord.view().records
            for aborted in before:
                record = records.get(aborted)
                if record is not None and record.status is CheckpointStatus.ABORTED:
                    reason = record.abort_reason.value if record.abort_reason else "ABORTED"
                    metrics.checkpoint_failed(self.spec.name, reason)

    def failed_tasks(self, context: Any) -> list[str]:
        """The tasks of this run that failed, as Airflow's task states say (the abort names
        them when no task declined, e.g. one killed without raising). Empty when Airflow
        cannot tell: a context without a task instance, or the lookup failed (logged; the
        abort goes on without the names)."""
        ti, run_id = context.get("ti"), context["run_id"]
        ask = getattr(ti, "get_task_states", None)
        if ask is None:
            return []
        try:
            states = ask(dag_id=ti.dag_id, run_ids=[run_id]).get(run_id, {})
        except Exception as exc:  # a diagnostic: it must not keep the checkpoint pending
            self.log.warning("the run's task states are not known (%s): the abort names none", exc)
            return []
        return sorted(t for t, state in states.items() if state == "failed" and t != ti.task_id)


def failed_run_detail(run_id: str, tasks: list[str]) -> str:
    """What an abort after a failed run says when no task declined: the run, and its failed
    tasks when known (``task process_epoch of Airflow run X failed``)."""
    if not tasks:
        return f"a task of Airflow run {run_id} failed"
    named = f"task {tasks[0]}" if len(tasks) == 1 else f"tasks {', '.join(tasks)}"
    return f"{named} of Airflow run {run_id} failed"


class SuspendPipelineOperator(PipelineOperator):
    """Stop triggering (when ``when`` renders true): the gate sensors skip runs from now on."""

    template_fields = ("checkpoint_id", "when", "reason")

    def __init__(self, *, when: str | bool = True, reason: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.when = when
        self.reason = reason

    def execute(self, context: Any) -> bool:
        if not _truthy(self.when):
            return False
        self.coordinator().suspend(self.reason or f"requested by {context['run_id']}")
        return True


class SavepointOperator(PipelineOperator):
    """Copy the latest completed checkpoint into a self-contained savepoint; returns its URL
    (``ops.take_savepoint``).

    ``target``: a folder URL under the pipeline's roots; empty (or None) means
    ``<storage>/<name>/savepoints/``.
    """

    template_fields = ("checkpoint_id", "target_url")

    def __init__(self, *, target: str | None = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target_url = target

    @property
    def target_folder(self) -> str | None:
        return None if self.target_url in (None, "None") else str(self.target_url)

    def execute(self, context: Any) -> str:
        with task_errors():
            url = take_savepoint(self.target(), self.target_folder, labels=run_labels(context))
        self.log.info("savepoint of %s: %s", self.spec.name, url)
        return url


class ValidateSavepointOperator(SavepointOperator):
    """Before anything stops: the form's fields are known, the target is allowed, and there
    is a checkpoint to take the savepoint from (``ops.plan_savepoint``)."""

    def execute(self, context: Any) -> dict[str, Any]:
        refuse_unknown_conf(context)
        with task_errors():
            plan_savepoint(self.target(), self.target_folder)
        latest = self.coordinator().view().latest_completed
        return {"target": self.target_folder or "", "latest_completed": latest and latest.value}


class ResumeTriggeringOperator(PipelineOperator):
    """After a failed stop-with-savepoint: clear the stop, so the pipeline keeps running (as
    Flink leaves a job running when its stop-with-savepoint fails)."""

    template_fields = ("checkpoint_id", "when")

    def __init__(self, *, when: str | bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.when = when

    def execute(self, context: Any) -> bool:
        if not _truthy(self.when):
            return False
        self.coordinator().resume()
        self.log.warning("stop with savepoint failed: %s keeps triggering", self.spec.name)
        return True


def note_run(task: PipelineOperator, context: Any, note: str) -> None:
    """Put ``note`` on this DAG run (best effort: the API may be unreachable; the fact is
    logged and on the Checkpoints page anyway)."""
    try:
        AirflowApiHook(task.spec.api_conn_id).set_note(
            context["dag"].dag_id, context["run_id"], note
        )
    except MicrocheckpointError as exc:
        task.log.warning("could not set the run's note: %s", exc)


class ValidateRestoreOperator(PipelineOperator):
    """Check a restore request before anything changes (``ops.plan_restore``); returns what
    will be restored."""

    def __init__(
        self,
        *,
        point: str = "latest",
        claim_mode: str = "NO_CLAIM",
        allow_non_restored_state: str | bool = False,
        parallelism: str | int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.point = point
        self.claim_mode = claim_mode
        self.allow_non_restored_state = allow_non_restored_state
        self.parallelism_param = parallelism

    template_fields = (
        "checkpoint_id",
        "point",
        "claim_mode",
        "allow_non_restored_state",
        "parallelism_param",
    )

    def request(self) -> RestoreRequest:
        """The checked request (the form's parallelism defaults to the spec's)."""
        raw = self.parallelism_param
        pipeline = self.load_pipeline()
        return plan_restore(
            self.target(),
            self.point,
            claim_mode=self.claim_mode,
            parallelism=self.spec.parallelism if raw in (None, "", "None") else raw,
            allow_non_restored_state=_truthy(self.allow_non_restored_state),
            uids=pipeline.uids,
            descriptors=pipeline_descriptors(pipeline),
        )

    def execute(self, context: Any) -> dict[str, Any]:
        refuse_unknown_conf(context)
        with task_errors():
            request = self.request()
        if request.point.note:
            self.log.error("%s", request.point.note)
        if request.dropped:
            self.log.warning("state of operators %s will not be restored", list(request.dropped))
        if request.dropped_states:
            self.log.warning("states %s will be left unread", list(request.dropped_states))
        return request.summary()


class RestoreOperator(ValidateRestoreOperator):
    """Re-base the pipeline on the point, clear the failure count and the stop marker
    (``ops.apply_restore``)."""

    def execute(self, context: Any) -> dict[str, Any]:
        with task_errors():
            request = self.request()
            target = self.target()
            marker = apply_restore(target, request, labels=run_labels(context))
        metrics.restore_event(self.spec.name, lambda: event_kind(target, marker.at_ms))
        self.log.info("pipeline %s re-based on %s", self.spec.name, marker.source)
        if marker.note:
            # A green run must still say that it fell back: on the run itself, and on the
            # Checkpoints page (the restore marker's note).
            self.log.error("%s", marker.note)
            note_run(self, context, f"Restored from {marker.source}. {marker.note}")
        return {
            "source": marker.source,
            "offsets": {str(tp): o for tp, o in sorted(marker.offsets.items())},
            "parallelism": request.parallelism,
        }


class CancelOperator(PipelineOperator):
    """Cancel the pipeline (``ops.cancel_pipeline``): stop triggering, pause its DAG, abort
    checkpoints in flight, keep or delete its checkpoints by ``cleanup`` (empty: the
    pipeline's ``externalized_cleanup``); savepoints stay."""

    template_fields = ("checkpoint_id", "cleanup")

    def __init__(self, *, cleanup: str | None = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cleanup = cleanup

    def execute(self, context: Any) -> dict[str, Any]:
        refuse_unknown_conf(context)
        hook = AirflowApiHook(self.spec.api_conn_id)
        cleanup = None if self.cleanup in (None, "", "None") else str(self.cleanup)
        with task_errors():
            record = cancel_pipeline(
                self.target(),
                cleanup=cleanup,
                labels=run_labels(context),
                pause=lambda: hook.set_paused(self.spec.dag_id, True) and None,
            )
        metrics.restore_event(self.spec.name, lambda: EventKind.CANCEL.value)
        self.log.info(
            "cancelled %s (%s): aborted %s, kept %s, deleted %d objects",
            self.spec.name,
            record.cleanup,
            list(record.aborted),
            list(record.retained),
            record.deleted,
        )
        return record.to_json()


class SetPausedOperator(PipelineOperator):
    """Pause or unpause the pipeline DAG through the REST API (when ``when`` renders true)."""

    template_fields = ("checkpoint_id", "when")

    def __init__(self, *, paused: bool, when: str | bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.paused = paused
        self.when = when

    def execute(self, context: Any) -> bool | None:
        if not _truthy(self.when):
            return None
        hook = AirflowApiHook(self.spec.api_conn_id)
        try:
            hook.set_paused(self.spec.dag_id, self.paused)
        except MicrocheckpointError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("%s %s", "paused" if self.paused else "unpaused", self.spec.dag_id)
        return self.paused
