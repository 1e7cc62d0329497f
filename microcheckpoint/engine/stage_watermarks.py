"""Watermarks across stages: the upstream's watermark rides on its barrier markers.

Upstream, notify commits a ``StageSink`` with the stage's watermark after the epoch, read
from the completed checkpoint's source state (``checkpoint_watermark``), and every marker of
the epoch carries it (``protocol.markers``). Downstream, each range of a ``StageSource``
input ends, aligned, just after the upstream's marker of one epoch; the driver reads that
one record per partition (``adapters.marker_reads``) and ``upstream_highs`` turns the
markers into the per-partition input of ``watermarks.advance``:

1. an input whose markers carry a watermark (the upstream has event time) takes it instead
   of the rows' event times: a partition's value is the marker's watermark plus the bound
   plus 1, so ``advance``'s ``min(high) - bound - 1`` is exactly the upstream's watermark;
2. a partition whose marker says the upstream has none yet holds the watermark back and
   counts as active (it is not idle: its marker arrived);
3. a partition of such an input whose range did not end at a marker (unaligned, read past
   its data) keeps its last marker's watermark;
4. an input without watermarks (the upstream has no event time, or AT_LEAST_ONCE, which
   writes no markers) keeps the rule of ``advance``: the rows' highest event time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from microcheckpoint.engine.event_time import restored_watermarks
from microcheckpoint.engine.watermarks import EventTime, WatermarkState
from microcheckpoint.ids import TaskId, TopicPartition
from microcheckpoint.protocol.markers import Marker
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.storage.port import ObjectStore

__all__ = ["checkpoint_watermark", "marker_ends", "stage_inputs", "upstream_highs"]


def checkpoint_watermark(
    store: ObjectStore, meta: CheckpointMetadata, source_uid: str
) -> tuple[bool, int | None]:
    """``(has event time, watermark)`` of checkpoint ``meta``'s source ``source_uid``.

    The source's ack references its watermark file when the source has event time
    (``event_time.store_watermarks``); without one, ``(False, None)``. The watermark is
    None while the source has none yet.
    """
    ack = meta.acks.get(TaskId.of(source_uid, 0))
    handles = [] if ack is None else [h for h in ack.handles if h.key.endswith("/state.json")]
    if not handles:
        return False, None
    return True, restored_watermarks(store, handles).watermark


def stage_inputs(source: Any) -> list[Any]:
    """The ``StageSource`` inputs of a pipeline's source (itself, or a union's)."""
    from microcheckpoint.engine.api import StageSource, UnionSource

    inputs = source.inputs if isinstance(source, UnionSource) else [source]
    return [i for i in inputs if isinstance(i, StageSource)]


def upstream_highs(
    state: WatermarkState,
    highs: Mapping[str, int],
    inputs: Iterable[tuple[Iterable[str], Mapping[str, Marker | None]]],
    event_time: EventTime,
    now_ms: int,
) -> tuple[WatermarkState, dict[str, int]]:
    """The state and per-partition highs to ``advance`` with (steps in the module docstring).

    Args:
        state: the watermark state the epoch started from.
        highs: the highest event time of each partition's rows this epoch.
        inputs: per stage input, its partitions and the upstream's marker that ends each
            partition's range this epoch (None: the range is empty or ends at a data record).
        event_time: the source's declaration (its bound converts a watermark to a high).
        now_ms: the epoch's processing time.

    Returns:
        ``state`` with the held-back partitions (step 2) marked active at ``now_ms``, and
        ``highs`` with every timed input's partitions replaced (steps 1 and 3).
    """
    parts = dict(state.partitions)
    out = dict(highs)
    for partitions, markers in inputs:
        if not any(m is not None and m.event_time for m in markers.values()):
            continue  # step 4
        for tp in partitions:
            out.pop(tp, None)  # step 3: no marker at the end, no change
            marker = markers.get(tp)
            if marker is None or not marker.event_time:
                continue
            if marker.watermark is None:  # step 2
                parts[tp] = (parts.get(tp, (None, now_ms))[0], now_ms)
            else:  # step 1
                out[tp] = marker.watermark + event_time.max_out_of_orderness_ms + 1
    return WatermarkState(parts, state.watermark), out


def marker_ends(
    bootstrap: str,
    inputs: Iterable[Any],
    ranges: Mapping[TopicPartition, Any],
) -> list[tuple[list[str], dict[str, Marker | None]]]:
    """Per stage input: its partitions in ``ranges`` and the upstream's marker (of its
    ``upstream`` and ``upstream_uid``) at each non-empty range's last offset, read in the
    driver with one consumer (one record per partition), within the input's ``timeout_s``."""
    from microcheckpoint.adapters.marker_reads import records_at
    from microcheckpoint.protocol.markers import marker_of

    out = []
    for source in inputs:
        tps = [tp for tp in ranges if tp.topic in source.topics]
        last = {tp: ranges[tp].end - 1 for tp in tps if ranges[tp].end > ranges[tp].start}
        records = records_at(bootstrap, last, timeout_s=source.timeout_s)
        markers: dict[str, Marker | None] = {}
        for tp in tps:
            record = records.get(tp)
            marker = None if record is None else marker_of(record.headers)
            mine = marker and (marker.stage, marker.uid) == (source.upstream, source.upstream_uid)
            markers[str(tp)] = marker if mine else None
        out.append(([str(tp) for tp in tps], markers))
    return out
