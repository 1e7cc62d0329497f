"""The Spark side of a ``PartitionOperator``: spread the rows over its subtasks and run them.

1. Main rows get subtask ``pmod(xxhash64(to_json(row)), parallelism)``, as sink parts do,
   so a re-run of the epoch gives every subtask the same rows.
2. Rows of the ``broadcast_input`` (a ``UnionSource`` input) are copied to every subtask
   (a cross join with the subtask numbers) and flagged ``BROADCAST``.
3. One marker row per subtask makes every subtask run, and ``placement.per_subtask`` (an
   ``applyInArrow`` per subtask) runs ``operator_subtask.process_partition``.
"""

from __future__ import annotations

from typing import Any

from microcheckpoint.engine.operator_state import PartitionOperator
from microcheckpoint.engine.operator_subtask import (
    BROADCAST,
    PartitionStageContext,
    process_partition,
)
from microcheckpoint.engine.placement import per_subtask
from microcheckpoint.engine.routing import KG, SUBTASK
from microcheckpoint.engine.spark import arrow_schema, spark_schema
from microcheckpoint.faults import Faults
from microcheckpoint.protocol.plan import EpochPlan
from microcheckpoint.storage.port import ObjectStore

__all__ = ["partition_stage"]


def partition_stage(
    spark: Any, df: Any, op: PartitionOperator, plan: EpochPlan, store: ObjectStore,
    options: dict[str, Any], parallelism: int, faults: Faults, *, persist: bool,
) -> Any:  # fmt: skip
    """The DataFrame of ``op``'s outputs in this epoch (steps in the module docstring).

    With ``persist`` the stage runs once now (its state and acks must not depend on what
    later stages let Spark prune or compute twice); the caller unpersists the result.
    """
    from pyspark.sql import functions as F

    ctx = PartitionStageContext(
        store_url=store.url,
        store_options=options,
        pipeline=plan.pipeline,
        checkpoint_id=plan.checkpoint_id.value,
        attempt=plan.attempt,
        uid=op.uid,
        parallelism=parallelism,
        trigger_time_ms=plan.trigger_time_ms,
        output_schema=arrow_schema(spark, op.output_schema),
        declared=dict(op.declared),
        restore=tuple(plan.restore.get(op.uid, ())),
        faults=faults,
    )
    # Step 1: the main rows, by a hash of their content.
    columns = [F.col(f"`{c}`") for c in df.columns]
    main = df
    if op.broadcast_input is not None:
        is_broadcast = F.coalesce(F.col("input") == F.lit(op.broadcast_input), F.lit(False))
        main = df.where(~is_broadcast)
    row = F.to_json(F.struct(*columns)) if columns else F.lit("")
    part = F.pmod(F.xxhash64(row), F.lit(parallelism)).cast("int")
    grouped = main.select(
        *columns, F.lit(0).alias(KG), part.alias(SUBTASK), F.lit(False).alias(BROADCAST)
    )
    # Step 2: every broadcast row to every subtask.
    if op.broadcast_input is not None:
        subtasks = spark.range(parallelism).select(F.col("id").cast("int").alias(SUBTASK))
        copies = df.where(is_broadcast).crossJoin(subtasks)
        grouped = grouped.unionByName(
            copies.select(
                *columns, F.lit(0).alias(KG), F.col(SUBTASK), F.lit(True).alias(BROADCAST)
            )
        )
    # Step 3: a marker per subtask (null key group), then one call per subtask.
    markers = spark.range(parallelism).select(
        F.lit(None).cast("int").alias(KG), F.col("id").cast("int").alias(SUBTASK)
    )
    grouped = grouped.unionByName(markers, allowMissingColumns=True)
    function = op.function

    # A closure without annotations: pyspark cannot inspect a functools.partial here.
    def run(subtask, table):  # type: ignore[no-untyped-def]
        return process_partition(ctx, function, subtask, table)

    out = per_subtask(
        spark, grouped, SUBTASK, parallelism, run, spark_schema(spark, op.output_schema)
    )
    if persist:
        out = out.persist()
        out.count()
    return out
