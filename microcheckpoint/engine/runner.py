"""Run epochs in Spark: the process step of the protocol, and whole local cycles.

``run_epoch`` is one Spark job: it restores state from the checkpoint the epoch continues
from, reads every partition's barrier range in executors, runs the stages, snapshots each
keyed subtask and acks. ``run_cycle`` wraps it with the coordinator steps (recover,
trigger, complete, notify) for local mode, tests and the demo; Airflow runs the same steps
as separate tasks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.engine.keyed import OperatorContext, crash_point, process_subtask, slow_point
from microcheckpoint.engine.sinkstage import SinkContext, commit_sinks, stage_part
from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.metadata import CheckpointMetadata
from microcheckpoint.protocol.pending import Ack
from microcheckpoint.protocol.savepoints import read_savepoint
from microcheckpoint.protocol.view import CheckpointStatus, read_json
from microcheckpoint.sinks.base import Sink
from microcheckpoint.state.chains import key_group_chains
from microcheckpoint.state.handles import StateHandle

__all__ = ["EpochResult", "expected_tasks", "run_cycle", "run_epoch", "source_schema"]

log = logging.getLogger(__name__)

_TYPES = {"string": "string", "long": "bigint", "double": "double", "boolean": "boolean"}


@dataclass(frozen=True)
class EpochResult:
    checkpoint_id: CheckpointId
    attempt: int
    records: int
    outputs: list[dict[str, Any]] | None
    metadata: CheckpointMetadata | None = None


def expected_tasks(pipeline: Pipeline, parallelism: int) -> list[TaskId]:
    """The acks a checkpoint of ``pipeline`` needs: the source, and every keyed subtask."""
    tasks = [TaskId.of(pipeline.source.uid, 0)]
    for uid in [op.uid for op in pipeline.operators] + [s.uid for s in pipeline.sinks]:
        tasks.extend(TaskId.of(uid, i) for i in range(parallelism))
    return tasks


def source_schema(source: KafkaSource) -> str:
    """Spark DDL of the source's rows."""
    meta = "topic string, partition int, offset bigint, timestamp_ms bigint, key binary"
    headers = "headers array<struct<key:string,value:binary>>"
    if source.value_format == "json" and source.schema:
        fields = ", ".join(f"`{n}` {_TYPES[t]}" for n, t in source.schema.items())
        return f"{meta}, {headers}, {fields}"
    value = "binary" if source.value_format == "bytes" else "string"
    return f"{meta}, {headers}, value {value}"


def _source_rows(bootstrap: str, source: KafkaSource, crash_at: str | None, driver: int):
    from microcheckpoint.adapters.decoding import decode_record
    from microcheckpoint.adapters.kafka_reader import read_split

    def read(split):
        for i, record in enumerate(read_split(bootstrap, split)):
            if i == 5:
                crash_point("reading", crash_at, driver)
            value = decode_record(record, source.value_format, source.schema)
            row = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "key": record.key,
                "headers": [{"key": k, "value": v} for k, v in record.headers],
            }
            if source.value_format == "json" and source.schema:
                row.update(value)
            else:
                row["value"] = value
            yield row

    return read


def _base_handles(
    coordinator: CheckpointCoordinator, cid: CheckpointId
) -> tuple[dict[str, dict[int, list[StateHandle]]], bool]:
    """Per operator uid, key group -> state file of the state epoch ``cid`` continues from.

    Returns the handles and whether the first snapshot must be full (after a NO_CLAIM restore).
    """
    view = coordinator.view()
    base = view.pending_record(cid).get("base")
    acks: list[Ack] = []
    full = False
    if base is not None:
        base_id = CheckpointId(int(base))
        record = view.records.get(base_id)
        if record is None:
            raise CheckpointNotFound(f"checkpoint {cid} continues from {base_id}, which is gone")
        if record.status is CheckpointStatus.COMPLETED:
            acks = list(view.metadata(base_id).acks.values())
        else:
            acks = list(coordinator.load_pending(base_id, view).acks.values())
        resolve = ""
    else:
        marker = read_json(coordinator.store, coordinator.layout.restore)
        resolve = ""
        if marker is not None and marker.get("prefix"):
            point = read_savepoint(coordinator.store, marker["prefix"])
            acks = list(point.metadata.acks.values())
            resolve = point.prefix if point.metadata.relative else ""
            full = bool(marker.get("first_snapshot_full"))
    per_uid: dict[str, list[StateHandle]] = {}
    for ack in acks:
        per_uid.setdefault(str(ack.task.uid), []).extend(
            replace(h, key=resolve + h.key) for h in ack.handles
        )
    handles = {uid: key_group_chains(hs) for uid, hs in per_uid.items()}
    return handles, full


def run_epoch(
    spark: Any,
    pipeline: Pipeline,
    coordinator: CheckpointCoordinator,
    cid: CheckpointId,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
) -> EpochResult:
    """Process epoch ``cid`` (already triggered) in one Spark job and ack every task.

    Steps: 1. begin a new attempt (acks of older ones stop counting); 2. find the state to
    restore; 3. read the barrier ranges in executors; 4. run the stages, each keyed
    operator as ``parallelism`` subtasks over key-group ranges; 5. ack the source.
    """
    from microcheckpoint.adapters.kafka_reader import split_ranges

    view = coordinator.view()
    expected = view.expected_tasks(cid)
    parallelism = max(
        [t.subtask + 1 for t in expected if t.uid.value != pipeline.source.uid], default=1
    )
    # Step 1: a new attempt.
    attempt = coordinator.begin_attempt(cid)
    barrier = coordinator.barrier(cid)
    trigger_ms = view.trigger_time_ms(cid)
    # Step 2: the state to restore.
    base, full = _base_handles(coordinator, cid)
    crash_at = os.environ.get("MICROCHECKPOINT_CRASH_AT")
    # Step 3: the source.
    splits = split_ranges(barrier, pipeline.source.max_records_per_split)
    sc = spark.sparkContext
    rows = sc.parallelize(splits, max(len(splits), 1)).flatMap(
        _source_rows(bootstrap, pipeline.source, crash_at, os.getpid())
    )
    df = spark.createDataFrame(rows, source_schema(pipeline.source))
    # Step 4: the stages.
    sink_runs = []
    for stage in pipeline.stages:
        if isinstance(stage, Sink):
            df = df.persist()
            sink_ctx = SinkContext(
                coordinator.store.url,
                dict(store_options or {}),
                pipeline.name,
                cid.value,
                attempt,
                coordinator.config.mode.value,
            )
            sink_runs.append(_sink_stage(df, stage, sink_ctx, parallelism))
        elif isinstance(stage, KeyedOperator):
            ctx = OperatorContext(
                store_url=coordinator.store.url,
                store_options=dict(store_options or {}),
                pipeline=pipeline.name,
                checkpoint_id=cid.value,
                attempt=attempt,
                uid=stage.uid,
                key=stage.key,
                max_parallelism=coordinator.config.max_parallelism,
                parallelism=parallelism,
                backend=stage.state_backend,
                trigger_time_ms=trigger_ms,
                ttl_ms=None if stage.state_ttl_s is None else int(stage.state_ttl_s * 1000),
                full_snapshot=full or not coordinator.config.incremental,
                base=base.get(stage.uid, {}),
                crash_at=crash_at,
                driver_pid=os.getpid(),
            )
            df = _keyed(spark, df, stage, ctx)
        else:
            df = stage(df)
    for staged in sink_runs:
        staged.count()
    outputs = [r.asDict(recursive=True) for r in df.collect()] if collect else None
    if not collect and not (pipeline.stages and isinstance(pipeline.stages[-1], Sink)):
        df.count()
    slow_point(os.environ.get("MICROCHECKPOINT_SLOW_ONCE"), pipeline.name)
    # Step 5: the source's operator state is the barrier's ends.
    offsets = {str(tp): end for tp, end in barrier.ends.items()}
    coordinator.acknowledge(cid, Ack(TaskId.of(pipeline.source.uid, 0), attempt, (), offsets))
    return EpochResult(cid, attempt, barrier.record_count, outputs)


def _keyed(spark: Any, df: Any, op: KeyedOperator, ctx: OperatorContext) -> Any:
    from microcheckpoint.state.backends import canonical_key
    from microcheckpoint.state.keygroups import key_group_for, subtask_for_key_group

    p, max_p, key, fn = ctx.parallelism, ctx.max_parallelism, op.key, op.fn

    def route(row: Any) -> tuple[int, dict[str, Any]]:
        d = row.asDict(recursive=True)
        kg = key_group_for(canonical_key(d[key]).encode(), max_p)
        return subtask_for_key_group(max_p, p, kg), d

    keyed = df.rdd.map(route).partitionBy(p, lambda subtask: subtask)
    out = keyed.mapPartitionsWithIndex(
        lambda index, items: process_subtask(ctx, fn, index, (d for _, d in items))
    )
    return spark.createDataFrame(out, op.output_schema)


def _sink_stage(df: Any, sink: Sink, ctx: SinkContext, parallelism: int) -> Any:
    """The RDD that pre-commits ``df`` into ``sink`` as ``parallelism`` subtasks."""
    import hashlib
    import json as _json

    def route(row: Any) -> tuple[int, dict[str, Any]]:
        d = row.asDict(recursive=True)
        digest = hashlib.blake2b(
            _json.dumps(d, sort_keys=True, default=str).encode(), digest_size=8
        )
        return int.from_bytes(digest.digest(), "big") % parallelism, d

    routed = df.rdd.map(route).partitionBy(parallelism, lambda part: part)
    return routed.mapPartitionsWithIndex(
        lambda index, items: stage_part(ctx, sink, index, (d for _, d in items))
    )


def sink_committer(pipeline: Pipeline, store: Any):
    """The ``commit_sinks`` callback of ``CheckpointCoordinator.notify`` for ``pipeline``."""
    return lambda meta: commit_sinks(store, pipeline.sinks, meta)


def run_cycle(
    spark: Any,
    pipeline: Pipeline,
    config: CheckpointConfig,
    store: Any,
    *,
    bootstrap: str,
    parallelism: int,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
) -> EpochResult:
    """One local cycle: recover, trigger (or re-run the pending epoch), process, complete, notify.

    Steps: 1. finish what a crashed run left (a claimed ``_metadata``, a missing notify);
    2. re-run the oldest pending epoch with a new attempt, or trigger the next one;
    3. process it; 4. complete; 5. notify (group offsets, retention).
    """
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.adapters.startup import startup_offsets

    coordinator = CheckpointCoordinator(store, config)
    crash_at = os.environ.get("MICROCHECKPOINT_CRASH_AT")
    with KafkaOffsets(bootstrap) as kafka:

        def commit(offsets):
            kafka.commit_group_offsets(config.effective_group_id, dict(offsets))

        # Step 1: recovery.
        coordinator.finish_completing()
        publish = sink_committer(pipeline, store)
        if config.mode.value == "AT_LEAST_ONCE":
            publish = None  # the sinks published during processing
        for sink in pipeline.sinks:
            sink.open()
        view = coordinator.view()
        for done in view.completed:
            if not view.records[done].notified:
                # Completed but not yet committed: publish before anything new runs.
                coordinator.notify(done, commit, publish)
        # Step 2: the epoch to run.
        view = coordinator.view()
        if view.pending:
            cid = view.pending[0]
            log.warning("re-running pending checkpoint %s of %s", cid, config.pipeline)
        else:
            tps: list[TopicPartition] = []
            for topic in pipeline.source.topics:
                tps.extend(kafka.partitions(topic))
            ends = kafka.end_offsets(tps)
            pending = coordinator.trigger(
                expected_tasks(pipeline, parallelism),
                ends,
                lambda new: startup_offsets(kafka, config, new),
            )
            cid = pending.checkpoint_id
        # Step 3: process.
        result = run_epoch(
            spark,
            pipeline,
            coordinator,
            cid,
            bootstrap=bootstrap,
            store_options=store_options,
            collect=collect,
        )
        crash_point("after_acks", crash_at, os.getpid())
        # Step 4: the global ack.
        meta = coordinator.complete(cid)
        crash_point("after_metadata", crash_at, os.getpid())
        # Step 5: notify (sinks publish, group offsets, retention).
        coordinator.notify(cid, commit, publish)
    return EpochResult(cid, result.attempt, result.records, result.outputs, meta)
