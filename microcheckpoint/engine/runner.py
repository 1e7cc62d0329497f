"""The process step of an epoch in Spark: read the barrier ranges, run the stages, ack.

``run_epoch`` is one Spark job over one ``EpochPlan``: the executors read every partition's
barrier range, the keyed operators restore the plan's state, apply their functions,
snapshot and ack, the sinks stage their output and ack, and the driver acks the source.
``engine.cycle.run_cycle`` wraps it with the other protocol steps for local runs; Airflow
runs the same steps as separate tasks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.engine.keyed import OperatorContext, process_subtask
from microcheckpoint.engine.sinkstage import SinkContext, stage_part
from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import acknowledge
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.plan import EpochPlan
from microcheckpoint.protocol.records import Ack, CheckpointMetadata
from microcheckpoint.sinks.base import Sink
from microcheckpoint.state.chains import key_group_chains
from microcheckpoint.storage.port import ObjectStore

__all__ = ["EpochResult", "expected_tasks", "run_epoch", "source_schema"]

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


def _source_rows(bootstrap: str, source: KafkaSource, faults: Faults):
    from microcheckpoint.adapters.decoding import decode_record
    from microcheckpoint.adapters.kafka_reader import read_split

    def read(split):
        for record in faults.reading(read_split(bootstrap, split)):
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


def run_epoch(
    spark: Any,
    pipeline: Pipeline,
    plan: EpochPlan,
    store: ObjectStore,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
    faults: Faults | None = None,
) -> EpochResult:
    """Process one attempt of a checkpoint, as ``plan`` says, in one Spark job; every task acks.

    Steps: 1. read the barrier ranges in executors; 2. run the stages, each keyed operator
    as subtasks over key-group ranges restored from ``plan.restore``, each sink staging its
    part; 3. ack the source with the barrier's ends.
    """
    from microcheckpoint.adapters.kafka_reader import split_ranges

    faults = faults or Faults.from_env()
    options = dict(store_options or {})
    parallelism = plan.parallelism(
        *(op.uid for op in pipeline.operators), *(s.uid for s in pipeline.sinks)
    )
    if plan.mode is CheckpointingMode.AT_LEAST_ONCE:
        for sink in pipeline.sinks:
            sink.open()  # the executors publish as they go
    # Step 1: the source.
    splits = split_ranges(plan.barrier, pipeline.source.max_records_per_split)
    sc = spark.sparkContext
    rows = sc.parallelize(splits, max(len(splits), 1)).flatMap(
        _source_rows(bootstrap, pipeline.source, faults)
    )
    df = spark.createDataFrame(rows, source_schema(pipeline.source))
    # Step 2: the stages.
    sink_runs = []
    for stage in pipeline.stages:
        if isinstance(stage, Sink):
            df = df.persist()
            sink_ctx = SinkContext(
                store.url,
                options,
                pipeline.name,
                plan.checkpoint_id.value,
                plan.attempt,
                plan.mode.value,
            )
            sink_runs.append(_sink_stage(df, stage, sink_ctx, parallelism))
        elif isinstance(stage, KeyedOperator):
            ctx = OperatorContext(
                store_url=store.url,
                store_options=options,
                pipeline=pipeline.name,
                checkpoint_id=plan.checkpoint_id.value,
                attempt=plan.attempt,
                uid=stage.uid,
                key=stage.key,
                max_parallelism=plan.max_parallelism,
                parallelism=parallelism,
                backend=stage.state_backend,
                trigger_time_ms=plan.trigger_time_ms,
                ttl_ms=None if stage.state_ttl_s is None else int(stage.state_ttl_s * 1000),
                full_snapshot=plan.full_snapshot,
                base=key_group_chains(plan.restore.get(stage.uid, ())),
                faults=faults,
            )
            df = _keyed(spark, df, stage, ctx)
        else:
            df = stage(df)
    for staged in sink_runs:
        staged.count()
    outputs = [r.asDict(recursive=True) for r in df.collect()] if collect else None
    if not collect and not (pipeline.stages and isinstance(pipeline.stages[-1], Sink)):
        df.count()
    faults.slow(pipeline.name)
    # Step 3: the source's operator state is the barrier's ends.
    offsets = {str(tp): end for tp, end in plan.barrier.ends.items()}
    source_ack = Ack(TaskId.of(pipeline.source.uid, 0), plan.attempt, (), offsets)
    acknowledge(store, Layout(pipeline.name), plan.checkpoint_id, source_ack)
    return EpochResult(plan.checkpoint_id, plan.attempt, plan.barrier.record_count, outputs)


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
