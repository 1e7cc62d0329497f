"""One whole local cycle: recover, trigger (or re-run), plan, process, complete, notify.

What ``make demo-engine``, the tests and ``spark_jobs/run_epoch.py`` without
``--checkpoint`` run. Airflow's epoch task (``process_epoch``) runs the same steps in one
task: it plans, processes and completes through ``process_checkpoint`` too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.api import Pipeline
from microcheckpoint.engine.runner import EpochResult, expected_tasks, run_epoch
from microcheckpoint.engine.sinkstage import SinkPublisher, sink_publisher
from microcheckpoint.engine.sources import source_offsets
from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.deadline import DeadlineWatch
from microcheckpoint.protocol.global_savepoints import StageRuntime
from microcheckpoint.protocol.recovery import complete_checkpoint, start_epoch
from microcheckpoint.protocol.source import group_committer
from microcheckpoint.storage.port import ObjectStore

__all__ = ["process_checkpoint", "run_cycle", "stage_runtime"]

log = logging.getLogger(__name__)


def run_cycle(
    spark: Any,
    pipeline: Pipeline,
    config: CheckpointConfig,
    store: ObjectStore,
    *,
    bootstrap: str,
    parallelism: int,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
    clock: Callable[[], float] = time.time,
) -> EpochResult:
    """One local cycle of ``pipeline``.

    ``clock`` (seconds since the epoch) is the coordinator's: the checkpoint's trigger time,
    which is the epoch's processing time (state TTL, processing-time timers), comes from it.

    Steps: 1. recover (a claimed completion, completed checkpoints not notified) and re-run
    the oldest pending epoch or trigger the next one; 2. plan it (a new attempt); 3. process
    it; 4. complete (the global ack); 5. notify (sinks publish, group offsets, retention).
    Steps 2 to 4 are ``process_checkpoint``'s, within the checkpoint timeout.
    """
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    coordinator = CheckpointCoordinator(store, config, clock=clock)
    faults = Faults.from_env()
    with KafkaOffsets(bootstrap) as kafka:
        offsets = source_offsets(pipeline.source, kafka, store_options)
        publish = sink_publisher(pipeline, store, config.mode)
        # Step 1: recovery, then the epoch to run.
        start = start_epoch(
            coordinator,
            offsets,
            topics=config.topics or pipeline.source.topics,
            expected=lambda p: expected_tasks(pipeline, p),
            default_parallelism=parallelism,
            publish=publish,
            rerun_pending=True,
            begin=True,  # planned below, by this coordinator
        )
        cid = start.checkpoint_id
        # Steps 2 to 4
        result = process_checkpoint(
            spark,
            pipeline,
            coordinator,
            cid,
            publish,
            bootstrap=bootstrap,
            store_options=store_options,
            collect=collect,
            faults=faults,
        )
        # Step 5: notify (sinks publish, group offsets, retention).
        coordinator.notify(cid, group_committer(offsets, config), publish)
    return result


def process_checkpoint(
    spark: Any,
    pipeline: Pipeline,
    coordinator: CheckpointCoordinator,
    cid: CheckpointId,
    publish: SinkPublisher | None,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
    faults: Faults | None = None,
    accept_completed: bool = False,
) -> EpochResult:
    """Plan, process and complete checkpoint ``cid`` (triggered), within its timeout: the
    part of an epoch that local cycles and Airflow's epoch task (``process_epoch``) share.

    ``publish``: the pipeline's publisher (``sink_publisher``), whose first reads go beside
    the completion's claim; notify is the caller's. The result's ``metadata`` and
    ``attempt`` are the completion's: another attempt's, when a racing re-run of the same
    epoch began after this one and had every ack in first (this run completes it with
    those acks). A racing run that claimed the completion first makes this one fail with
    ``CommitConflict``, unless ``accept_completed`` (a retried task, which finds its own
    completion: ``recovery.complete_checkpoint``).

    Steps: 1. plan a new attempt; 2. process it (``run_epoch``: every task acks); 3. the
    global ack (``recovery.complete_checkpoint``), the publish's first reads beside its
    claim. From step 1 until step 3 has decided, ``DeadlineWatch`` aborts the checkpoint
    as EXPIRED at trigger time + ``timeout``, whatever the job is doing.

    Raises:
        CheckpointExpired: the timeout passed (aborted as EXPIRED), also when the job then
            failed (the expiry is the cause; the job's error is chained to it).
        CommitConflict: the checkpoint was aborted meanwhile, or completed by another run
            (without ``accept_completed``).
        Whatever the job raised otherwise (the attempt is declined).
    """
    faults = faults or Faults.from_env()
    # Step 1
    plan = coordinator.plan(cid)
    with DeadlineWatch(coordinator, cid, plan.trigger_time_ms) as deadline:
        # Step 2
        try:
            result = run_epoch(
                spark,
                pipeline,
                plan,
                coordinator.store,
                bootstrap=bootstrap,
                store_options=store_options,
                collect=collect,
                faults=faults,
            )
        except Exception as exc:
            if deadline.expired is not None:  # the cause, rather than what followed it
                raise deadline.expired from exc
            raise
        log.info(
            "checkpoint %s attempt %s: %d records processed, every task acked",
            cid,
            plan.attempt,
            result.records,
        )
        faults.point("after_acks")
        # Step 3
        prepare = None if publish is None else partial(publish.prepare, plan)
        meta = complete_checkpoint(
            coordinator,
            cid,
            then_notify=True,
            on_acked=prepare,
            accept_completed=accept_completed,
        )
    faults.point("after_metadata", partial(coordinator.committed, cid))
    return EpochResult(cid, meta.attempt, result.records, result.outputs, meta)


def stage_runtime(
    pipeline: Pipeline,
    config: CheckpointConfig,
    store: ObjectStore,
    kafka: Any,
    store_options: dict[str, Any] | None = None,
) -> StageRuntime:
    """What a global restore needs of one stage (``protocol.global_savepoints``): its
    coordinator, its source port over ``kafka`` (a ``KafkaOffsets``) and its sinks' publish."""
    return StageRuntime(
        CheckpointCoordinator(store, config),
        source_offsets(pipeline.source, kafka, store_options),
        sink_publisher(pipeline, store, config.mode),
    )
