"""One keyed operator subtask of one epoch, as it runs inside a Spark executor.

Imports no Spark: the runner ships an ``OperatorContext`` and the user's function to the
executors. Each subtask is called once per epoch with an Arrow table of its rows (the
router's marker row guarantees the call even when no row reached it; where a Spark
partition is a subtask, ``merge_partition`` and ``process_partition``, its partition runs
even when empty) and:

1. restores, for the keys its rows touch, their state before this epoch;
2. applies the operator: the user's ``fn(key, rows, state)`` per key, in a deterministic
   order, or, for a built-in aggregation, merges the per-key aggregate Spark SQL computed
   with the restored value;
3. snapshots (a delta of the changed keys, or a compaction) and acks from the executor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.engine.declining import declining
from microcheckpoint.engine.gc_pause import fewer_gc_passes
from microcheckpoint.engine.process import (
    EpochTimes,
    KeyedProcessFunction,
    ValueFunction,
    run_function,
)
from microcheckpoint.engine.routing import KG, SUBTASK, data_rows
from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.backends import canonical_key, canonical_string_keys
from microcheckpoint.state.chains import key_group_chains
from microcheckpoint.state.evolution import DESCRIPTORS_FIELD, function_descriptors
from microcheckpoint.state.files import ROWS, prefetch
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.keygroups import BLAKE2B, SCHEME_FIELD, owned_key_groups
from microcheckpoint.state.kinds import cleanup, is_pseudo_key
from microcheckpoint.state.subtask import SubtaskState

__all__ = [
    "AGGREGATE",
    "OperatorContext",
    "PlacementError",
    "merge_aggregate",
    "merge_partition",
    "process_partition",
    "process_subtask",
]

# The column the runner's Spark SQL aggregation leaves for the merge.
AGGREGATE = "__aggregate"


@dataclass(frozen=True)
class OperatorContext:
    """Everything an executor needs for one operator in one epoch (picklable)."""

    store_url: str
    store_options: dict[str, Any]
    pipeline: str
    checkpoint_id: int
    attempt: int
    uid: str
    key: str
    max_parallelism: int
    parallelism: int
    backend: str
    trigger_time_ms: int
    output_schema: pa.Schema
    ttl_ms: int | None = None
    full_snapshot: bool = False
    # every state file of this operator in the state the epoch continues from
    restore: tuple[StateHandle, ...] = ()
    max_deltas: int = 8
    faults: Faults = field(default_factory=Faults)
    # the built-in aggregation ("sum", "count", "min", "max") and its output column
    aggregate: str | None = None
    output_column: str = "total"
    # event time (process functions): the rows' event-time column, the watermark before
    # and after this epoch, and what happens to late rows
    event_column: str | None = None
    watermark_before: int | None = None
    watermark_after: int | None = None
    late: str = "drop"
    # how keys map to key groups and key groups to subtasks (``state.keygroups``)
    key_groups: str = BLAKE2B


def _row_order(row: dict[str, Any]) -> tuple:
    """A row's source position: Kafka's (topic, partition, offset), a file source's (file,
    row), else its content (deterministic, if not meaningful)."""
    if "partition" in row and "offset" in row:
        return (0, str(row.get("topic", "")), row["partition"], row["offset"], "")
    if "source_file" in row and "source_row" in row:
        return (1, str(row["source_file"]), 0, row["source_row"], "")
    return (2, "", 0, 0, json.dumps(row, sort_keys=True, default=str))


def _by_key(rows: pa.Table, key: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """The rows by canonical key, each key's in source order (``_row_order``), and each
    key's key group: row by row."""
    kgs = rows.column(KG).to_pylist()
    records = rows.drop_columns([KG, SUBTASK]).to_pylist()
    by_key: dict[str, list[dict[str, Any]]] = {}
    kg_of: dict[str, int] = {}
    for kg, record in zip(kgs, records, strict=True):
        ck = canonical_key(record[key])
        by_key.setdefault(ck, []).append(record)
        kg_of[ck] = kg
    for ck in by_key:
        by_key[ck].sort(key=_row_order)
    return by_key, kg_of


def _by_key_in_arrow(
    rows: pa.Table, key: str
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]] | None:
    """``_by_key``'s result with the grouping and ordering done by Arrow: rows sorted by
    (key, source position), converted once, cut into runs of equal keys; the key's canonical
    JSON computed once per distinct key. None (do it row by row) when the rows have no
    source position columns (content order), or a key that Arrow cannot dictionary-encode or
    whose distinct values do not map to distinct canonical keys (NaN)."""
    import numpy as np
    import pyarrow.compute as pc

    names = rows.column_names
    if {"partition", "offset"} <= set(names):
        order = [c for c in ("topic", "partition", "offset") if c in names]
    elif {"source_file", "source_row"} <= set(names):
        order = ["source_file", "source_row"]
    else:
        return None
    if rows.num_rows == 0:
        return {}, {}
    # Arrow's order is ``_row_order``'s for the sources' own position columns: strings and
    # integers, no nulls (a user's column of that name may be otherwise: row by row then).
    for name in order:
        column = rows.column(name)
        kind = column.type
        text = name in ("topic", "source_file")
        if column.null_count or not (
            pa.types.is_string(kind) if text else pa.types.is_integer(kind)
        ):
            return None
    if "__key_index" in names or pa.types.is_dictionary(rows.schema.field(key).type):
        return None
    try:
        encoded = pc.dictionary_encode(rows.column(key).combine_chunks(), null_encoding="encode")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None
    distinct = [canonical_key(v) for v in encoded.dictionary.to_pylist()]
    if len(set(distinct)) != len(distinct):
        return None
    indexed = rows.append_column("__key_index", encoded.indices)
    permutation = pc.sort_indices(
        indexed, [("__key_index", "ascending"), *((c, "ascending") for c in order)]
    )
    ordered = indexed.take(permutation)
    index = ordered.column("__key_index").to_numpy()
    starts = np.concatenate(([0], np.flatnonzero(np.diff(index)) + 1))
    ends = np.append(starts[1:], len(index))
    kgs = ordered.column(KG).to_numpy()
    records = ordered.drop_columns([KG, SUBTASK, "__key_index"]).to_pylist()
    by_key: dict[str, list[dict[str, Any]]] = {}
    kg_of: dict[str, int] = {}
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        ck = distinct[index[start]]
        by_key[ck] = records[start:end]
        kg_of[ck] = int(kgs[start])
    return by_key, kg_of


def _subtask_state(
    ctx: OperatorContext,
    subtask: int,
    timer: AckTimer,
    clean: Callable[[str, Any], Any] | None = None,
) -> tuple[SubtaskState, TaskId]:
    store = open_store(ctx.store_url, **ctx.store_options)
    task = TaskId.of(ctx.uid, subtask)
    prefix = Layout(ctx.pipeline).state_prefix(CheckpointId(ctx.checkpoint_id), ctx.attempt, task)
    state = SubtaskState(
        store,
        uid=ctx.uid,
        owned=owned_key_groups(ctx.max_parallelism, ctx.parallelism, subtask, ctx.key_groups),
        chains=key_group_chains(ctx.restore),
        backend=ctx.backend,
        prefix=prefix,
        now_ms=ctx.trigger_time_ms,
        ttl_ms=ctx.ttl_ms,
        full_snapshot=ctx.full_snapshot,
        max_deltas=ctx.max_deltas,
        timer=timer,
        clean=clean,
    )
    return state, task


def _prefetch(ctx: OperatorContext, subtask: int) -> None:
    """Begin reading the state files subtask ``subtask`` restores from (every file in its
    key groups' chains), before its rows arrive: on S3 those reads then overlap the
    shuffle's instead of coming between it and the subtask's writes. Files the worker has
    cached cost nothing (``state.files.prefetch``). Not for a local store, which has no
    round trip to hide (there the reads' threads only competed with the task's own: the
    100k count's epoch measured 0.03-0.04 s slower with them)."""
    if ctx.backend != "table" or not ctx.restore or not 0 <= subtask < ctx.parallelism:
        return  # (a partition beyond the subtasks is refused as its rows are received)
    owned = owned_key_groups(ctx.max_parallelism, ctx.parallelism, subtask, ctx.key_groups)
    chains = key_group_chains(ctx.restore)
    handles = [h for kg in owned for h in chains.get(kg, ())]
    store = open_store(ctx.store_url, **ctx.store_options) if handles else None
    if store is not None and store.remote:
        prefetch(store, handles)


def _previous(state: SubtaskState, keys: Iterable[tuple[str, int]]) -> dict[str, tuple[Any, int]]:
    """The state before this epoch of the (canonical key, key group) pairs ``keys``."""
    keys_by_kg: dict[int, list[str]] = {}
    for ck, kg in keys:
        keys_by_kg.setdefault(kg, []).append(ck)
    return state.previous(keys_by_kg)


def _snapshot_and_ack(
    ctx: OperatorContext, state: SubtaskState, task: TaskId, info: dict[str, Any] | None = None
) -> None:
    handles = state.snapshot()
    ctx.faults.point("after_snapshot")
    if ctx.key_groups != BLAKE2B:  # the default stays unnamed: acks as they always were
        info = {**(info or {}), SCHEME_FIELD: ctx.key_groups}
    # A retried Spark task writes the same files and its ack is a DUPLICATE.
    ack = state.timer.ack(task, ctx.attempt, handles, info)
    record_ack(state.store, Layout(ctx.pipeline), CheckpointId(ctx.checkpoint_id), ack)


def _declining(ctx: OperatorContext, subtask: int) -> AbstractContextManager[None]:
    """The subtask declines its checkpoint when its work raises (``engine.declining``)."""
    return declining(
        lambda: open_store(ctx.store_url, **ctx.store_options),
        ctx.pipeline,
        ctx.checkpoint_id,
        ctx.attempt,
        str(TaskId.of(ctx.uid, subtask)),
    )


def _cleaner(function: KeyedProcessFunction, now_ms: int) -> Callable[[str, Any], Any] | None:
    """How a compaction drops expired entries of ``function``'s TTL states (None: no TTL)."""
    descriptors = {d.name: d for d in function.states}
    if function.bare or all(d.ttl is None for d in descriptors.values()):
        return None
    return lambda key, value: value if is_pseudo_key(key) else cleanup(descriptors, value, now_ms)


def process_subtask(
    ctx: OperatorContext,
    fn: Callable[..., Any],
    subtask: int,
    table: pa.Table,
    timer: AckTimer | None = None,
) -> pa.Table:
    """Run subtask ``subtask`` of a general keyed operator; returns its outputs.

    Steps: 1. this epoch's rows by key, each key's rows in source order (Kafka's topic,
    partition and offset, or a file source's file and row, else by content); 2. the
    subtask's state; 3. the function (``process.run_function``: ``fn(key, rows, state)``, or
    a ``KeyedProcessFunction`` with its states and timers); 4. snapshot and ack.

    ``timer``: the subtask's, when it began before ``table`` was received (a Spark
    partition's rows); else it begins here.
    """
    with fewer_gc_passes(), _declining(ctx, subtask):
        return _process_subtask(ctx, fn, subtask, table, timer or AckTimer())


def _process_subtask(
    ctx: OperatorContext, fn: Callable[..., Any], subtask: int, table: pa.Table, timer: AckTimer
) -> pa.Table:
    # Step 1 (reading: the rows decoded by key; the sync part starts after it)
    with timer.reading():
        rows = data_rows(table)
        by_key, kg_of = _by_key_in_arrow(rows, ctx.key) or _by_key(rows, ctx.key)
    # Step 2
    function = fn if isinstance(fn, KeyedProcessFunction) else ValueFunction(fn)
    state, task = _subtask_state(ctx, subtask, timer, _cleaner(function, ctx.trigger_time_ms))
    # Step 3
    times = EpochTimes(
        ctx.trigger_time_ms, ctx.watermark_before, ctx.watermark_after, ctx.event_column, ctx.late
    )
    outputs = run_function(
        function,
        times,
        by_key,
        kg_of,
        state.owned,
        state.previous,
        state.previous_by_group,
        state.put,
        state.delete,
    )
    # Step 4 (subtask 0 records the state descriptors: state.evolution)
    schemas = function_descriptors(function) if subtask == 0 else None
    _snapshot_and_ack(ctx, state, task, None if schemas is None else {DESCRIPTORS_FIELD: schemas})
    return pa.Table.from_pylist(outputs, schema=ctx.output_schema)


_COMBINE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda old, new: old + new,
    "count": lambda old, new: old + new,
    "min": min,
    "max": max,
}


def merge_aggregate(
    ctx: OperatorContext, subtask: int, table: pa.Table, timer: AckTimer | None = None
) -> pa.Table:
    """Run subtask ``subtask`` of a built-in aggregation; returns ``key, <output column>``.

    ``table`` holds one row per touched key with this epoch's aggregate (computed by Spark
    SQL), so the Python work here grows with the keys touched, not with the records.

    Steps: 1. canonical keys; 2. restore those keys; 3. combine each with this epoch's
    aggregate; 4. snapshot and ack. ``timer`` as in ``process_subtask``.
    """
    with fewer_gc_passes(), _declining(ctx, subtask):
        return _merge_aggregate(ctx, subtask, table, timer or AckTimer())


class PlacementError(RuntimeError):
    """A Spark partition held rows of another subtask than its own: its state is untouched."""


def _partition_table(
    ctx: OperatorContext, partition: int, batches: Iterable[pa.RecordBatch], what: str
) -> pa.Table | None:
    """The rows of Spark partition ``partition`` as one table (None: no rows), once each
    row's ``__subtask`` is checked to be ``partition``: a partition holding another
    subtask's row (a plan that shuffled otherwise) raises before anything is written (the
    state reads its ``_prefetch`` began are only reads into the cache).

    Raises:
        PlacementError: a row of another subtask, or a partition beyond the parallelism.
    """
    received = [b for b in batches if b.num_rows]
    table = pa.Table.from_batches(received) if received else None
    if table is not None:
        import pyarrow.compute as pc

        found = sorted(pc.unique(table.column(SUBTASK)).to_pylist())
        if found != [partition]:
            raise PlacementError(
                f"operator {ctx.uid!r}: Spark partition {partition} of {what} holds rows of "
                f"subtasks {found}; the shuffle was not Spark's hash of the key into "
                f"{ctx.parallelism} partitions (nothing was written)"
            )
    if not 0 <= partition < ctx.parallelism:
        raise PlacementError(
            f"operator {ctx.uid!r}: Spark partition {partition} is beyond the "
            f"{ctx.parallelism} subtasks; {what} shuffled into more partitions"
        )
    return table


def merge_partition(
    ctx: OperatorContext, partition: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Run the subtask of Spark partition ``partition`` of the aggregation's shuffle.

    Under ``SPARK_HASH`` with ``parallelism`` shuffle partitions dividing
    ``max_parallelism``, Spark's aggregation shuffle puts key ``k`` in partition
    ``pmod(hash(k), parallelism)``, the subtask that owns its key group, so partition ``i``
    *is* subtask ``i`` (an empty partition still runs: its subtask acks its state). Every
    row's subtask is checked first (``_partition_table``).

    Raises:
        PlacementError: a row of another subtask, or a partition beyond the parallelism.
    """
    timer = AckTimer()  # the subtask begins: receiving its rows is its read part
    _prefetch(ctx, partition)
    with timer.reading():
        table = _partition_table(ctx, partition, batches, "the aggregation")
    if table is None:
        table = _empty_rows(ctx.key).append_column(AGGREGATE, pa.array([], pa.null()))
    yield from merge_aggregate(ctx, partition, table, timer).to_batches()


def process_partition(
    ctx: OperatorContext,
    fn: Callable[..., Any],
    partition: int,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Run the subtask of Spark partition ``partition`` of a ``repartition(parallelism,
    key)`` under ``SPARK_HASH``: partition ``i`` holds the keys subtask ``i`` owns, as in
    ``merge_partition`` (an empty partition still runs its due timers and acks).

    Raises:
        PlacementError: a row of another subtask, or a partition beyond the parallelism.
    """
    timer = AckTimer()  # the subtask begins: receiving its rows is its read part
    _prefetch(ctx, partition)
    with timer.reading():
        table = _partition_table(ctx, partition, batches, "the repartition by key")
    rows = table or _empty_rows(ctx.key)
    yield from process_subtask(ctx, fn, partition, rows, timer).to_batches()


def _empty_rows(key: str) -> pa.Table:
    """An empty table of a subtask's rows: the key and the routing columns."""
    columns = {key: pa.null(), KG: pa.int32(), SUBTASK: pa.int32()}
    return pa.table({name: pa.array([], kind) for name, kind in columns.items()})


def _merge_aggregate(
    ctx: OperatorContext, subtask: int, table: pa.Table, timer: AckTimer
) -> pa.Table:
    # Step 1 (reading: the rows; the sync part starts after it)
    with timer.reading():
        rows = data_rows(table)
    # Step 2
    state, task = _subtask_state(ctx, subtask, timer)
    # Steps 2 and 3
    merged = _merged_in_arrow(ctx, state, rows)
    if merged is None:
        merged = _merged_in_python(ctx, state, rows)
    # Step 4
    _snapshot_and_ack(ctx, state, task)
    return merged


def _merged_in_python(ctx: OperatorContext, state: SubtaskState, rows: pa.Table) -> pa.Table:
    """Restore the touched keys, combine each with this epoch's aggregate and put it, key by
    key; the output rows, sorted by canonical key."""
    keys = rows.column(ctx.key).to_pylist()
    values = rows.column(AGGREGATE).to_pylist()
    kgs = rows.column(KG).to_pylist()
    cks = [canonical_key(k) for k in keys]
    previous = _previous(state, zip(cks, kgs, strict=True))
    combine = _COMBINE[ctx.aggregate or "sum"]
    out_keys, out_values = [], []
    for ck, kg, value, key in sorted(zip(cks, kgs, values, keys, strict=True)):
        before = previous.get(ck)
        new = value if before is None else combine(before[0], value)
        state.put(kg, ck, new)
        out_keys.append(key if isinstance(key, str) else json.dumps(key))
        out_values.append(new)
    return pa.table(
        {"key": out_keys, ctx.output_column: out_values},
        schema=ctx.output_schema,
    )


def _merged_in_arrow(ctx: OperatorContext, state: SubtaskState, rows: pa.Table) -> pa.Table | None:
    """``_merged_in_python``'s result and state, computed in Arrow: for string keys that
    need no JSON escape, integer aggregates and integer state (a count; a sum, min or max
    of an integer column), in the ``table`` backend. None when any of that does not hold,
    or a sum leaves 64 bits: the caller merges key by key, as before, and nothing was put.
    """
    import pyarrow.compute as pc

    keys, values = rows.column(ctx.key), rows.column(AGGREGATE)
    if (
        ctx.backend != "table"
        or ctx.aggregate not in _COMBINE
        or not pa.types.is_string(keys.type)
        or not pa.types.is_integer(values.type)
        or values.null_count
    ):
        return None
    cks = canonical_string_keys(keys)
    if cks is None:
        return None
    previous = state.previous_rows(pc.unique(rows.column(KG)).to_pylist(), cks)
    texts = previous.column("state")
    try:
        values = values.cast(pa.int64())
        known = previous.column("key").combine_chunks()
        before = pc.take(texts.cast(pa.int64()), pc.index_in(cks, value_set=known))
        if ctx.aggregate == "min":
            new = pc.min_element_wise(values, before)
        elif ctx.aggregate == "max":
            new = pc.max_element_wise(values, before)
        else:
            new = pc.if_else(pc.is_null(before), values, pc.add_checked(values, before))
    except (pa.ArrowInvalid, OverflowError):
        return None  # not integers within 64 bits (state, or a sum): Python's integers
    order = pc.sort_indices(cks)  # UTF-8 orders as code points do: Python's order
    cks, new, keys = pc.take(cks, order), pc.take(new, order), pc.take(keys, order)
    kgs = pc.take(rows.column(KG), order)
    updated = pa.repeat(pa.scalar(state.now_ms, pa.int64()), len(new))
    state.put_rows(pa.table([kgs, cks, new.cast(pa.string()), updated], schema=ROWS))
    key_type, value_type = (ctx.output_schema.field(i).type for i in (0, 1))
    return pa.table([keys.cast(key_type), new.cast(value_type)], schema=ctx.output_schema)
