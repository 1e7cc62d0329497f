"""One Arrow call per subtask, the subtasks spread evenly over the Spark tasks.

A keyed, sink or partition stage groups its rows by subtask and calls its function once per
subtask (``applyInArrow``). Grouping by the subtask number itself lets Spark's hash place the
groups: with two shuffle partitions, subtasks 0 and 1 both hash to partition 1, so the two
subtasks of a ``local[2]`` epoch ran one after the other in one task while the other core
waited. Here each subtask gets a *placement code*, an integer whose Spark hash (Murmur3 of
the 4-byte int, seed 42, as ``mmh3`` computes it) falls in partition ``subtask % N``, and
the rows are shuffled into ``N`` partitions by that code: subtask ``s`` runs in task
``s % N``. The codes decide where a group runs, never what it holds: were a hash to differ,
the groups would be the same, only less evenly placed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

__all__ = ["PLACE", "per_partition", "per_subtask", "placement_codes"]

PLACE = "__place"
_SEED = 42  # Spark's Murmur3Hash seed (HashPartitioning)


def _spark_hash_of_int(value: int) -> int:
    import mmh3

    return int(mmh3.hash(struct.pack("<i", value), _SEED))


def placement_codes(parallelism: int, partitions: int) -> list[int]:
    """Placement codes: the smallest distinct ints, in order, that Spark's hash partitioning
    sends where each subtask should run.

    Args:
        parallelism: the number of subtasks.
        partitions: the number of Spark partitions (tasks) they are spread over.

    Returns:
        For each subtask ``s``, an int whose Spark hash partition among ``partitions`` is
        ``s % partitions``.
    """
    need = [len(range(b, parallelism, partitions)) for b in range(partitions)]
    found: list[list[int]] = [[] for _ in range(partitions)]
    code, missing = 0, parallelism
    while missing:
        bucket = _spark_hash_of_int(code) % partitions  # Python's % is Spark's pmod here
        if len(found[bucket]) < need[bucket]:
            found[bucket].append(code)
            missing -= 1
        code += 1
    return [found[s % partitions][s // partitions] for s in range(parallelism)]


def per_subtask(
    spark: Any,
    frame: Any,
    subtask_column: str,
    parallelism: int,
    function: Callable[[int, Any], Any],
    schema: Any,
) -> Any:
    """Call ``function`` once per subtask of ``frame``, the subtasks spread over the tasks.

    Args:
        spark: the session (classic or Connect).
        frame: the rows, each with its subtask in ``subtask_column`` (markers included).
        subtask_column: the column that holds the subtask, 0 to ``parallelism`` - 1.
        parallelism: the number of subtasks.
        function: ``function(subtask, table)``, given the subtask's rows as one Arrow table
            (the placement column left out); returns an Arrow table of ``schema``.
        schema: the output schema (a DDL string or a ``StructType``).

    Returns:
        The DataFrame of the outputs (``applyInArrow`` over
        ``min(parallelism, spark.sql.shuffle.partitions)`` tasks; subtask ``s`` in task
        ``s % N``).
    """
    from pyspark.sql import functions as F

    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    partitions = max(1, min(parallelism, shuffle))
    codes = placement_codes(parallelism, partitions)
    subtask_of = {code: subtask for subtask, code in enumerate(codes)}
    code = F.element_at(F.array(*(F.lit(c) for c in codes)), F.col(subtask_column) + 1)
    placed = frame.withColumn(PLACE, code).repartition(partitions, F.col(PLACE))

    # A closure without annotations: pyspark cannot inspect a functools.partial here.
    def run(key, table):  # type: ignore[no-untyped-def]
        return function(subtask_of[key[0].as_py()], table.drop_columns([PLACE]))

    return placed.groupBy(PLACE).applyInArrow(run, schema)


def per_partition(frame: Any, function: Callable[[int, Any], Any], schema: Any) -> Any:
    """Call ``function(partition, batches)`` once per Spark partition of ``frame``, where the
    partitions already are the subtasks (no shuffle); it yields Arrow batches of ``schema``.
    """

    # A closure without annotations: pyspark cannot inspect a functools.partial here.
    def run(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        return function(TaskContext.get().partitionId(), batches)

    return frame.mapInArrow(run, schema)
