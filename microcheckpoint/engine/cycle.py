"""One whole local cycle: recover, trigger (or re-run), plan, process, complete, notify.

What ``make demo-engine``, the tests and ``spark_jobs/run_epoch.py`` without
``--checkpoint`` run; Airflow's epoch task (`process_epoch`) runs the same steps in one task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.api import Pipeline
from microcheckpoint.engine.runner import EpochResult, expected_tasks, run_epoch
from microcheckpoint.engine.sinkstage import sink_publisher
from microcheckpoint.engine.sources import source_offsets
from microcheckpoint.faults import Faults
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.global_savepoints import StageRuntime
from microcheckpoint.protocol.recovery import start_epoch
from microcheckpoint.protocol.source import group_committer
from microcheckpoint.storage.port import ObjectStore

__all__ = ["run_cycle", "stage_runtime"]


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
        # Step 2: the plan.
        plan = coordinator.plan(cid)
        # Step 3: process.
        result = run_epoch(
            spark,
            pipeline,
            plan,
            store,
            bootstrap=bootstrap,
            store_options=store_options,
            collect=collect,
            faults=faults,
        )
        faults.point("after_acks")
        # Step 4: the global ack, the publish's first reads beside its claim, its _metadata
        # beside notify's first requests.
        prepare = None if publish is None else partial(publish.prepare, plan)
        meta = coordinator.complete(cid, then_notify=True, on_acked=prepare)
        faults.point("after_metadata", partial(coordinator.committed, cid))
        # Step 5: notify (sinks publish, group offsets, retention).
        coordinator.notify(cid, group_committer(offsets, config), publish)
    # The attempt that completed: another run's, when a racing re-run of the same epoch had
    # every ack in first (its own run then fails to claim the checkpoint).
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
