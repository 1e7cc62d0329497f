"""The sink side of an epoch: pre-commit in the executors, commit at notify.

Imports no Spark. EXACTLY_ONCE: each sink subtask stages its rows (sorted, so a retried
task writes the same bytes) as ``chk-<n>/sink/<uid>/part-<i>-a<attempt>.jsonl`` and acks
with that file's handle, which ``_metadata`` then holds; notify reads the staged parts of the
winning attempt and calls ``Sink.commit``. AT_LEAST_ONCE: the subtask publishes at once
through ``Sink.write_at_least_once`` and acks with no handle.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.declining import declining
from microcheckpoint.engine.routing import KG, SUBTASK, data_rows
from microcheckpoint.engine.stage_watermarks import checkpoint_watermark
from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.sinks.base import EpochInfo, Sink
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage import ObjectStore, each

if TYPE_CHECKING:
    from microcheckpoint.engine.api import Pipeline

__all__ = [
    "SinkContext",
    "commit_sinks",
    "sink_publisher",
    "stage_part",
    "stage_partition",
    "stage_table",
]


@dataclass(frozen=True)
class SinkContext:
    store_url: str
    store_options: dict[str, Any]
    pipeline: str
    checkpoint_id: int
    attempt: int
    mode: str


def _row_key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def stage_part(
    ctx: SinkContext,
    sink: Sink,
    part: int,
    rows: Iterable[dict[str, Any]],
    timer: AckTimer | None = None,
) -> Iterator[int]:
    """Pre-commit (or, at least once, publish) subtask ``part``'s rows, then ack.

    Rows are staged sorted by their JSON, so a retried task writes the same bytes. Yields
    the number of rows. The ack's sync part is sorting and serializing (or, at least once,
    publishing), its async part the upload of the staged part; ``timer`` is the part's when
    it began before its rows were received and decoded (its read part).
    """
    task = TaskId.of(sink.uid, part)
    opened = functools.partial(open_store, ctx.store_url, **ctx.store_options)
    with declining(opened, ctx.pipeline, ctx.checkpoint_id, ctx.attempt, str(task)):
        timer = timer or AckTimer()
        store = open_store(ctx.store_url, **ctx.store_options)
        ordered = sorted(rows, key=_row_key)
        cid = CheckpointId(ctx.checkpoint_id)
        layout = Layout(ctx.pipeline)
        handles: tuple[StateHandle, ...] = ()
        if ctx.mode == CheckpointingMode.AT_LEAST_ONCE.value:
            sink.write_at_least_once(
                EpochInfo(ctx.pipeline, sink.uid, ctx.checkpoint_id), part, ordered
            )
        else:
            key = layout.sink_part(cid, task, ctx.attempt)
            data = b"".join(_row_key(r).encode() + b"\n" for r in ordered)
            with timer.uploading():
                store.put(key, data)
            handles = (StateHandle.of(key, data),)
        record_ack(store, layout, cid, timer.ack(task, ctx.attempt, handles))
    return iter([len(ordered)])


def stage_table(ctx: SinkContext, sink: Sink, part: int, table: pa.Table) -> pa.Table:
    """``stage_part`` for a part's rows as Arrow (the router's marker row is dropped);
    returns one row ``(part, rows)``."""
    timer = AckTimer()
    with timer.reading():
        rows = data_rows(table).drop_columns([KG, SUBTASK]).to_pylist()
    count = next(stage_part(ctx, sink, part, rows, timer))
    return pa.table({"part": pa.array([part], pa.int32()), "rows": pa.array([count], pa.int64())})


def stage_partition(
    ctx: SinkContext, sink: Sink, part: int, parts: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``stage_part`` for Spark partition ``part``, whose rows are part ``part`` (the rows
    of keyed subtask ``part``, partitioned by the aggregation's shuffle: no shuffle of their
    own); yields one row ``(part, rows)``.

    Raises:
        PlacementError: a partition beyond the ``parts`` parts (nothing is written).
    """
    from microcheckpoint.engine.keyed import PlacementError

    if not 0 <= part < parts:
        raise PlacementError(
            f"sink {sink.uid!r}: Spark partition {part} is beyond its {parts} parts "
            "(nothing was written)"
        )
    timer = AckTimer()
    with timer.reading():
        rows = [row for batch in batches for row in batch.to_pylist()]
    count = next(stage_part(ctx, sink, part, rows, timer))
    yield pa.RecordBatch.from_arrays(
        [pa.array([part], pa.int32()), pa.array([count], pa.int64())], names=["part", "rows"]
    )


def commit_sinks(
    store: ObjectStore, sinks: Iterable[Sink], meta: CheckpointMetadata, source_uid: str = ""
) -> None:
    """Publish what epoch ``meta`` staged, sink by sink (each commit is idempotent); a
    stage sink's markers carry the watermark of source ``source_uid`` in ``meta``."""
    from microcheckpoint.sinks.stage import StageSink  # Kafka's client: not at import time

    sinks = list(sinks)
    timed: tuple[bool, int | None] = (False, None)
    if source_uid and any(isinstance(s, StageSink) for s in sinks):
        timed = checkpoint_watermark(store, meta, source_uid)  # engine/stage_watermarks.py
    for sink in sinks:
        tasks = sorted((t for t in meta.acks if t.uid.value == sink.uid), key=lambda t: t.subtask)
        if not tasks:
            continue  # the sink was added after this checkpoint was triggered
        handles = [(i, h) for i, t in enumerate(tasks) for h in meta.acks[t].handles]
        found = each(lambda ih: store.get(ih[1].key), handles)  # the staged parts, at once
        parts: list[list[dict[str, Any]]] = [[] for _ in tasks]
        for (i, handle), obj in zip(handles, found, strict=True):
            if obj is None:
                raise MetadataFormatError(
                    f"staged output {store.child_url(handle.key)} of sink {sink.uid!r}, "
                    f"epoch {meta.checkpoint_id}, is missing; it cannot be published"
                )
            url = store.child_url(handle.key)
            data = handle.check(obj.data, url, f"staged output of sink {sink.uid!r}")
            parts[i].extend(json.loads(line) for line in data.splitlines() if line)
        if sink.commit_empty_epochs or any(meta.acks[t].handles for t in tasks):
            info = EpochInfo(meta.pipeline, sink.uid, meta.checkpoint_id.value, *timed)
            sink.commit(info, parts)


def sink_publisher(
    pipeline: Pipeline, store: ObjectStore, mode: CheckpointingMode
) -> Callable[[CheckpointMetadata], None] | None:
    """The ``commit_sinks`` callback of notify for ``pipeline`` (it opens the sinks first).

    None in AT_LEAST_ONCE: the sinks published while processing, so notify publishes nothing.
    """
    if mode is not CheckpointingMode.EXACTLY_ONCE:
        return None
    opened: list[bool] = []

    def publish(meta: CheckpointMetadata) -> None:
        if not opened:
            for sink in pipeline.sinks:
                sink.open()
            opened.append(True)
        commit_sinks(store, pipeline.sinks, meta, pipeline.source.uid)

    return publish
