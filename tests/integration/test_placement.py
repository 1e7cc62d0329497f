"""Subtasks spread over Spark's tasks (engine/placement.py), checked in Spark itself."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from microcheckpoint.engine.placement import per_subtask, placement_codes


@pytest.mark.parametrize(("parallelism", "partitions"), [(2, 2), (5, 2), (3, 3), (8, 2)])
def test_each_subtask_runs_once_in_task_subtask_mod_n_with_exactly_its_rows(
    spark, parallelism: int, partitions: int
) -> None:
    # Spark's own hash decides where each code's rows go: the codes must agree with it.
    codes = placement_codes(parallelism, partitions)
    placed = spark.createDataFrame([(c,) for c in codes], "c int").repartition(partitions, "c")
    where = dict(placed.select("c", F.spark_partition_id().alias("p")).collect())
    assert [where[c] for c in codes] == [s % partitions for s in range(parallelism)]

    rows = 40 * parallelism
    frame = spark.range(rows).select(
        (F.col("id") % parallelism).cast("int").alias("__subtask"), F.col("id")
    )

    def function(subtask, table):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        return pa.table(
            {
                "subtask": pa.array([subtask], pa.int32()),
                "task": pa.array([TaskContext.get().partitionId()], pa.int32()),
                "ids": [sorted(table.column("id").to_pylist())],
                "columns": [",".join(table.column_names)],
            }
        )

    schema = "subtask int, task int, ids array<long>, columns string"
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        out = per_subtask(spark, frame, "__subtask", parallelism, function, schema).collect()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert sorted(r.subtask for r in out) == list(range(parallelism))  # once each
    for r in out:
        assert r.task == r.subtask % partitions, (r.subtask, r.task)
        assert r.ids == list(range(r.subtask, rows, parallelism))
        assert r.columns == "__subtask,id"  # the placement column is not the function's
