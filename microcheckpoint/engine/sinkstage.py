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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

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
from microcheckpoint.protocol.plan import EpochPlan
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.sinks.base import EpochInfo, Sink
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage import ObjectStore
from microcheckpoint.storage.port import StoredObject, ahead, started

if TYPE_CHECKING:
    from microcheckpoint.engine.api import Pipeline

__all__ = [
    "SinkContext",
    "SinkPublisher",
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


class StagedParts(Sequence[list[dict[str, Any]]]):
    """The staged parts of one sink's epoch, as ``Sink.commit`` takes them: part ``i`` is
    subtask ``i``'s rows. Their reads are sent when this is made and waited for on first
    use, so a sink's own first request (``FileSink`` looks for its manifest) goes at once
    with them, and a sink that finds the epoch published reads none of them.

    ``ready``: returns once the checkpoint's ``_metadata`` is written (``notify`` of a
    checkpoint whose ``_metadata`` is written meanwhile): the rows are handed over only
    after it, so a sink, which reads them before it writes what its readers see, makes
    nothing visible before the checkpoint is restorable. ``sent``: reads of staged parts
    begun earlier (``SinkPublisher.prepare``), by key. A read that failed is sent again
    when the part is used.

    Raises (on first use):
        MetadataFormatError: a staged part is missing, or differs from its handle.
        Whatever ``ready`` raises.
    """

    def __init__(
        self,
        store: ObjectStore,
        sink: Sink,
        epoch: int,
        handles: list[list[StateHandle]],
        ready: Callable[[], object] | None = None,
        sent: Mapping[str, Future[StoredObject | None]] | None = None,
    ) -> None:
        self._store, self._uid, self._epoch, self._count = store, sink.uid, epoch, len(handles)
        self._handles = [(i, h) for i, hs in enumerate(handles) for h in hs]
        sent = sent or {}
        self.reads = [
            sent.get(h.key) or started(functools.partial(store.get, h.key))
            for _, h in self._handles
        ]
        self._ready = ready
        self._parts: list[list[dict[str, Any]]] | None = None

    def _load(self) -> list[list[dict[str, Any]]]:
        if self._parts is not None:
            return self._parts
        if self._ready is not None:
            self._ready()
        parts: list[list[dict[str, Any]]] = [[] for _ in range(self._count)]
        for (i, handle), read in zip(self._handles, self.reads, strict=True):
            url = self._store.child_url(handle.key)
            obj = ahead(read, functools.partial(self._store.get, handle.key))
            if obj is None:
                raise MetadataFormatError(
                    f"staged output {url} of sink {self._uid!r}, epoch {self._epoch}, "
                    "is missing; it cannot be published"
                )
            data = handle.check(obj.data, url, f"staged output of sink {self._uid!r}")
            parts[i].extend(json.loads(line) for line in data.splitlines() if line)
        self._parts = parts
        return parts

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> list[dict[str, Any]]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[list[dict[str, Any]]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._load()[index]


def commit_sinks(
    store: ObjectStore,
    sinks: Iterable[Sink],
    meta: CheckpointMetadata,
    source_uid: str = "",
    ready: Callable[[], object] | None = None,
    sent: Mapping[str, Future[StoredObject | None]] | None = None,
) -> None:
    """Publish what epoch ``meta`` staged, sink by sink (each commit is idempotent); a
    stage sink's markers carry the watermark of source ``source_uid`` in ``meta``.
    ``ready``: returns once ``meta`` is written; a sink that ``waits_for_restorable`` gets
    it as ``EpochInfo.restorable``, any other is handed its rows only after it
    (``StagedParts``). ``sent``: reads of staged parts begun earlier, by key."""
    from microcheckpoint.sinks.stage import StageSink  # Kafka's client: not at import time

    sinks = list(sinks)
    timed: tuple[bool, int | None] = (False, None)
    if source_uid and any(isinstance(s, StageSink) for s in sinks):
        timed = checkpoint_watermark(store, meta, source_uid)  # engine/stage_watermarks.py
    for sink in sinks:
        tasks = sorted((t for t in meta.acks if t.uid.value == sink.uid), key=lambda t: t.subtask)
        if not tasks:
            continue  # the sink was added after this checkpoint was triggered
        if sink.commit_empty_epochs or any(meta.acks[t].handles for t in tasks):
            waits = sink.waits_for_restorable
            info = EpochInfo(
                meta.pipeline,
                sink.uid,
                meta.checkpoint_id.value,
                *timed,
                restorable=ready if waits else None,
            )
            handles = [list(meta.acks[t].handles) for t in tasks]
            parts = StagedParts(
                store, sink, info.checkpoint_id, handles, None if waits else ready, sent
            )
            try:
                sink.commit(info, parts)
            finally:
                wait(parts.reads)  # no read of this epoch goes on after its publish


class SinkPublisher:
    """Notify's ``commit_sinks`` for one pipeline (``protocol.coordinator.CommitSinks``):
    opens its sinks once, and can begin an epoch's first reads early (``prepare``)."""

    def __init__(self, pipeline: Pipeline, store: ObjectStore) -> None:
        self.pipeline, self.store = pipeline, store
        self._opened = False
        self._sent: dict[str, Future[StoredObject | None]] = {}

    def _open(self) -> None:
        if not self._opened:
            for sink in self.pipeline.sinks:
                sink.open()
            self._opened = True

    def prepare(self, plan: EpochPlan) -> None:
        """Begin the reads the publish of ``plan``'s epoch needs first, once its tasks are
        done: the staged part of every sink subtask of ``plan.attempt`` and each sink's own
        (``Sink.prepare``), so they go with the completion's requests instead of after the
        commit point. The publish uses the parts' reads when its acks name the same keys
        (they do unless another attempt completed the checkpoint)."""
        self._open()
        cid, layout = plan.checkpoint_id, Layout(self.pipeline.name)
        self._sent = {}
        for sink in self.pipeline.sinks:
            tasks = sorted(t for t in plan.expected if t.uid.value == sink.uid)
            if not tasks:
                continue
            for task in tasks:
                key = layout.sink_part(cid, task, plan.attempt)
                self._sent[key] = started(functools.partial(self.store.get, key))
            sink.prepare(EpochInfo(self.pipeline.name, sink.uid, cid.value))

    def __call__(self, meta: CheckpointMetadata, ready: Callable[[], object] | None = None) -> None:
        self._open()
        sent, self._sent = self._sent, {}
        commit_sinks(self.store, self.pipeline.sinks, meta, self.pipeline.source.uid, ready, sent)


def sink_publisher(
    pipeline: Pipeline, store: ObjectStore, mode: CheckpointingMode
) -> SinkPublisher | None:
    """The ``commit_sinks`` callback of notify for ``pipeline`` (it opens the sinks first).

    None in AT_LEAST_ONCE: the sinks published while processing, so notify publishes nothing.
    """
    if mode is not CheckpointingMode.EXACTLY_ONCE:
        return None
    return SinkPublisher(pipeline, store)
