"""One subtask of a ``PartitionOperator`` in one epoch, as it runs in a Spark executor.

Imports no Spark. ``operator_stage`` hands each subtask one Arrow table: its share of the
main input, every broadcast row (``BROADCAST`` true), and a marker row so that every
subtask runs even with no rows. ``process_partition`` then:

1. splits the rows into broadcast and main rows, each in source order;
2. restores the subtask's operator state from every old subtask's file
   (``operator_files.redistribute``: its own lists at the same parallelism, an even split,
   the union or subtask 0's broadcast map at another);
3. runs ``process_broadcast`` (when there are broadcast rows), then ``process``;
4. writes one ``operator.json`` and acks with its handle.

An epoch with no records runs no Spark job: ``idle_acks`` acks each subtask's state from
the driver, re-using its file at the same parallelism and writing a redistributed one at
another.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.engine.declining import declining
from microcheckpoint.engine.operator_state import PartitionContext, PartitionFunction
from microcheckpoint.engine.routing import KG, SUBTASK, data_rows
from microcheckpoint.errors import IncompatibleCheckpoint, InvalidValue
from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.operator_files import (
    OPERATOR_NAME,
    OperatorSnapshot,
    encode_snapshot,
    load_snapshots,
    redistribute,
)
from microcheckpoint.storage.port import ObjectStore

if TYPE_CHECKING:
    from microcheckpoint.engine.api import Pipeline
    from microcheckpoint.protocol.plan import EpochPlan

__all__ = ["BROADCAST", "PartitionStageContext", "idle_acks", "process_partition"]

# True on the broadcast input's rows (each is copied to every subtask).
BROADCAST = "__broadcast"


@dataclass(frozen=True)
class PartitionStageContext:
    """Everything an executor needs for one ``PartitionOperator`` in one epoch (picklable)."""

    store_url: str
    store_options: dict[str, Any]
    pipeline: str
    checkpoint_id: int
    attempt: int
    uid: str
    parallelism: int
    trigger_time_ms: int
    output_schema: pa.Schema
    declared: dict[str, str]
    # every operator state file of this operator in the state the epoch continues from
    restore: tuple[StateHandle, ...] = ()
    faults: Faults = field(default_factory=Faults)


def _source_order(row: dict[str, Any]) -> tuple:
    """Kafka's (topic, partition, offset), a file source's (file, row), else the content."""
    if "partition" in row and "offset" in row:
        return (0, str(row.get("topic", "")), row["partition"], row["offset"], "")
    if "source_file" in row and "source_row" in row:
        return (1, str(row["source_file"]), 0, row["source_row"], "")
    return (2, "", 0, 0, json.dumps(row, sort_keys=True, default=str))


def _restore(
    store: ObjectStore, uid: str, declared: dict[str, str], handles: Iterable[StateHandle],
    parallelism: int, subtask: int,
) -> tuple[dict[str, tuple[str, Any]], int | None, StateHandle | None]:  # fmt: skip
    """``(states, rescaled_from, own file)``: the subtask's declared states (restored or
    empty), the old parallelism when it differs, and at the same one the subtask's file.

    Raises:
        IncompatibleCheckpoint: a restored state the function drops or declares with
            another kind (named, with the fix); the old files are not one per subtask.
    """
    loaded = load_snapshots(store, tuple(handles))
    states = redistribute([s for _, s in loaded], parallelism, subtask)
    old = loaded[0][1].parallelism if loaded else None
    own = next((h for h, s in loaded if s.subtask == subtask), None) if old == parallelism else None
    for name, (kind, _) in states.items():
        if declared.get(name) != kind:
            now = f"declares it as {declared[name]}" if name in declared else "drops it"
            raise IncompatibleCheckpoint(
                f"operator {uid!r} restores {kind} state {name!r}, but its function {now}: "
                f"declare {kind} state {name!r}, or give the operator a new uid"
            )
    for name, kind in declared.items():
        states.setdefault(name, (kind, {} if kind == "broadcast" else []))
    return states, (None if old in (None, parallelism) else old), own


def _snapshot_and_ack(
    store: ObjectStore, pipeline: str, cid: int, attempt: int, uid: str, subtask: int,
    parallelism: int, states: dict[str, tuple[str, Any]], timer: AckTimer,
    faults: Faults | None = None,
) -> None:  # fmt: skip
    """Write the subtask's ``operator.json`` and ack with its handle (``faults``' point
    ``after_snapshot`` in between).

    Raises:
        InvalidValue: a state holds a value that is not JSON (the state is named).
    """
    task = TaskId.of(uid, subtask)
    try:
        data = encode_snapshot(OperatorSnapshot(subtask, parallelism, states))
    except (TypeError, ValueError) as exc:
        bad = [n for n, s in sorted(states.items()) if not _is_json(s[1])]
        raise InvalidValue(
            f"operator {uid!r} state {bad} holds a value that is not JSON ({exc}): store "
            "str, int, float, bool, None, lists and dicts with str keys"
        ) from exc
    key = Layout(pipeline).state_prefix(CheckpointId(cid), attempt, task) + OPERATOR_NAME
    with timer.uploading():
        store.put(key, data)
    if faults is not None:
        faults.point("after_snapshot")
    _ack(store, pipeline, cid, attempt, task, StateHandle.of(key, data), timer)


def _ack(
    store: ObjectStore, pipeline: str, cid: int, attempt: int, task: TaskId,
    handle: StateHandle, timer: AckTimer,
) -> None:  # fmt: skip
    # A retried Spark task writes the same bytes and its ack is a DUPLICATE.
    ack = timer.ack(task, attempt, (handle,))
    record_ack(store, Layout(pipeline), CheckpointId(cid), ack)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def process_partition(
    ctx: PartitionStageContext, function: PartitionFunction, subtask: int, table: pa.Table
) -> pa.Table:
    """Run subtask ``subtask`` of a ``PartitionOperator``; returns its outputs (those of
    ``process_broadcast`` first). Steps as in the module docstring."""
    task = str(TaskId.of(ctx.uid, subtask))
    opened = functools.partial(open_store, ctx.store_url, **ctx.store_options)
    with declining(opened, ctx.pipeline, ctx.checkpoint_id, ctx.attempt, task):
        # Step 1 (reading: the rows decoded in source order; the sync part starts after it)
        timer = AckTimer()
        with timer.reading():
            rows = data_rows(table)
            flags = rows.column(BROADCAST).to_pylist()
            records = rows.drop_columns([KG, SUBTASK, BROADCAST]).to_pylist()
            pairs = list(zip(records, flags, strict=True))
            broadcast = sorted((r for r, b in pairs if b), key=_source_order)
            main = sorted((r for r, b in pairs if not b), key=_source_order)
        # Step 2
        store = open_store(ctx.store_url, **ctx.store_options)
        states, rescaled_from, _ = _restore(
            store, ctx.uid, ctx.declared, ctx.restore, ctx.parallelism, subtask
        )
        # Step 3
        pctx = PartitionContext(
            subtask, ctx.parallelism, ctx.trigger_time_ms, states, ctx.declared, rescaled_from
        )
        outputs: list[dict[str, Any]] = []
        if broadcast:
            pctx.broadcast_writable = True
            outputs.extend(function.process_broadcast(broadcast, pctx) or ())
            pctx.broadcast_writable = False
        outputs.extend(function.process(main, pctx) or ())
        # Step 4
        _snapshot_and_ack(
            store, ctx.pipeline, ctx.checkpoint_id, ctx.attempt, ctx.uid, subtask,
            ctx.parallelism, pctx.states, timer, ctx.faults,
        )  # fmt: skip
        try:
            return pa.Table.from_pylist(outputs, schema=ctx.output_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, KeyError) as exc:
            raise InvalidValue(
                f"operator {ctx.uid!r} returned rows that do not fit its output_schema: {exc}"
            ) from exc


def idle_acks(pipeline: Pipeline, plan: EpochPlan, store: ObjectStore, parallelism: int) -> None:
    """The acks of every ``PartitionOperator`` subtask in an epoch with no records.

    At the restored parallelism a subtask acks its own file again (nothing uploaded); at
    another, it writes its redistributed state. No function runs.
    """
    for op in pipeline.partition_operators:
        handles = plan.restore.get(op.uid, ())
        for subtask in range(parallelism):
            timer = AckTimer()
            states, _, own = _restore(store, op.uid, op.declared, handles, parallelism, subtask)
            task = TaskId.of(op.uid, subtask)
            cid, attempt = plan.checkpoint_id.value, plan.attempt
            if own is not None:
                _ack(store, pipeline.name, cid, attempt, task, own, timer)
            else:
                _snapshot_and_ack(
                    store, pipeline.name, cid, attempt, op.uid, subtask, parallelism, states,
                    timer,
                )  # fmt: skip
