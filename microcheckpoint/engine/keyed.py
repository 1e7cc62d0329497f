"""One keyed operator subtask of one epoch, as it runs inside a Spark executor.

Imports no Spark: the runner ships an ``OperatorContext`` and the user's function to the
executors, which restore the subtask's key groups, apply the function, snapshot and ack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.coordinator import acknowledge
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack
from microcheckpoint.state.backends import (
    KeyGroupState,
    canonical_key,
    encode_memory,
    encode_table,
)
from microcheckpoint.state.chains import DELTA_SUFFIX, cached_reader, load_key_group
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.keygroups import key_group_for, key_group_range
from microcheckpoint.storage import ObjectStore, open_store

__all__ = ["OperatorContext", "process_subtask", "restore_key_group"]


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
    ttl_ms: int | None = None
    full_snapshot: bool = False
    # key group -> its file chain (base, then deltas) in the state restored from
    base: dict[int, list[StateHandle]] = field(default_factory=dict)
    max_deltas: int = 8
    faults: Faults = field(default_factory=Faults)


def _row_order(row: dict[str, Any]) -> tuple:
    if "partition" in row and "offset" in row:
        return (0, str(row.get("topic", "")), row["partition"], row["offset"], "")
    return (1, "", 0, 0, json.dumps(row, sort_keys=True, default=str))


def restore_key_group(
    store: ObjectStore, ctx: OperatorContext, kg: int, cache: dict[str, bytes]
) -> KeyGroupState:
    """State of key group ``kg`` as of the base checkpoint, without expired entries."""
    chain = ctx.base.get(kg)
    if not chain:
        return {}

    state = load_key_group(chain, kg, cached_reader(store, cache), store.child_url)
    if ctx.ttl_ms is not None:
        floor = ctx.trigger_time_ms - ctx.ttl_ms
        state = {k: v for k, v in state.items() if v[1] >= floor}
    return state


def process_subtask(
    ctx: OperatorContext, fn: Any, subtask: int, rows: Iterable[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Run subtask ``subtask``: restore, apply ``fn`` per key, snapshot, ack; yields outputs.

    Steps: 1. group this epoch's rows by key group and key; 2. per owned key group:
    restore, apply; an unchanged key group keeps referencing its files, a changed one
    adds its changed keys to this subtask's delta file (or is compacted into a new base
    when its chain is long), and the memory backend writes one file per subtask; 3. ack.
    """
    store = open_store(ctx.store_url, **ctx.store_options)
    layout = Layout(ctx.pipeline)
    task = TaskId.of(ctx.uid, subtask)
    cid = CheckpointId(ctx.checkpoint_id)
    prefix = layout.state_prefix(cid, ctx.attempt, task)
    # Step 1: this epoch's rows by key group and key.
    by_group: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        ck = canonical_key(row[ctx.key])
        kg = key_group_for(ck.encode(), ctx.max_parallelism)
        by_group.setdefault(kg, {}).setdefault(ck, []).append(row)
    # Step 2: restore, apply, snapshot.
    cache: dict[str, bytes] = {}
    handles: list[StateHandle] = []
    memory: dict[int, KeyGroupState] = {}
    deltas: dict[int, KeyGroupState] = {}
    outputs: list[dict[str, Any]] = []
    for kg in key_group_range(ctx.max_parallelism, ctx.parallelism, subtask):
        touched = by_group.get(kg)
        chain = ctx.base.get(kg, [])
        if ctx.backend == "table" and not touched and not ctx.full_snapshot:
            handles.extend(chain)  # incremental: unchanged, referenced
            continue
        state = restore_key_group(store, ctx, kg, cache)
        changed: KeyGroupState = {}
        for ck in sorted(touched or {}):
            key_rows = sorted(touched[ck], key=_row_order)
            previous = state.get(ck)
            out, new = fn(json.loads(ck), key_rows, None if previous is None else previous[0])
            outputs.extend(out)
            if new is None:
                if state.pop(ck, None) is not None:
                    changed[ck] = (None, ctx.trigger_time_ms)
            else:
                state[ck] = changed[ck] = (new, ctx.trigger_time_ms)
        if ctx.backend == "memory":
            if state:
                memory[kg] = state
        elif chain and not ctx.full_snapshot and len(chain) <= ctx.max_deltas:
            # A short chain: only the changed keys go into this subtask's delta file.
            handles.extend(chain)
            if changed:
                deltas[kg] = changed
        elif state:
            # First snapshot, full snapshot, or a long chain: compact into a new base.
            data = encode_table(state)
            key = f"{prefix}kg-{kg:05d}.parquet"
            store.put(key, data)
            handles.append(StateHandle(key, len(data), (kg,)))
    if deltas:
        data = encode_memory(ctx.uid, deltas)
        key = f"{prefix}{DELTA_SUFFIX}"
        store.put(key, data)
        handles.append(StateHandle(key, len(data), tuple(sorted(deltas))))
    if ctx.backend == "memory":
        data = encode_memory(ctx.uid, memory)
        key = f"{prefix}state.json"
        store.put(key, data)
        handles.append(StateHandle(key, len(data), tuple(sorted(memory))))
    # One handle per file, whatever number of key groups it serves.
    handles = list({h.key: h for h in handles}.values())
    ctx.faults.point("after_snapshot")
    # Step 3: the ack (a retried Spark task writes the same files and gets DUPLICATE).
    acknowledge(store, layout, cid, Ack(task, ctx.attempt, tuple(handles)))
    return iter(outputs)
