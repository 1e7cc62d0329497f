"""The upstream's watermark on a barrier marker, and how a stage input takes it.

``marker_of`` reads the ``mcp-watermark`` header; ``upstream_highs`` then ``advance`` give
the downstream watermark: the upstream's exactly when aligned, the last marker's where a
channel was read past its data, the rows' rule where the upstream has no event time, and
the minimum with the other inputs of a union.
"""

from __future__ import annotations

from microcheckpoint.engine.stage_watermarks import upstream_highs
from microcheckpoint.engine.watermarks import EventTime, WatermarkState, advance
from microcheckpoint.protocol.markers import Marker, marker_of

WRITER = [("mcp-pipeline", b"up"), ("mcp-uid", b"to-down"), ("mcp-epoch", b"7")]
BOUND = EventTime("ts", max_out_of_orderness_ms=5, idle_timeout_s=1)
P0, P1 = "mid:0", "mid:1"


def _marker(watermark: int | None, event_time: bool = True) -> Marker:
    return Marker("up", "to-down", 7, watermark, event_time)


def _next(state, highs, inputs, now=1_000, others=()):
    """The state after an epoch whose stage inputs' ranges end at these markers (and
    whose other partitions are ``others``)."""
    start, out = upstream_highs(state, highs, inputs, BOUND, now)
    partitions = [tp for parts, _ in inputs for tp in parts] + list(others)
    return advance(start, out, partitions, BOUND, now)


def test_marker_of_reads_the_watermark_header() -> None:
    def read(*extra):
        return marker_of([*WRITER, ("mcp-marker", b"7"), *extra])

    assert read() == Marker("up", "to-down", 7, None, False)
    assert read(("mcp-watermark", b"114")) == Marker("up", "to-down", 7, 114, True)
    assert read(("mcp-watermark", b"-6")) == Marker("up", "to-down", 7, -6, True)
    assert read(("mcp-watermark", b"none")) == Marker("up", "to-down", 7, None, True)
    assert read(("mcp-watermark", b"soon")) is None  # malformed: not a marker
    assert marker_of([*WRITER, ("mcp-watermark", b"114")]) is None  # a data record


def test_aligned_markers_give_the_upstream_watermark_exactly() -> None:
    # The rows say 994 and 195 (minus the bound); the markers say 114: 114 it is.
    marks = {P0: _marker(114), P1: _marker(114)}
    state = _next(WatermarkState(), {P0: 1_000, P1: 201}, [([P0, P1], marks)])
    assert state.watermark == 114
    assert state.partitions == {P0: (120, 1_000), P1: (120, 1_000)}
    # Next epoch: no rows at all, the markers still advance it.
    assert _next(state, {}, [([P0, P1], {P0: _marker(164), P1: _marker(164)})]).watermark == 164


def test_no_watermark_yet_holds_back_and_is_never_idle() -> None:
    marks = {P0: _marker(None), P1: _marker(None)}
    state = _next(WatermarkState(), {P0: 500}, [([P0, P1], marks)], now=0)
    assert state.watermark is None
    # Ten seconds on (idle timeout 1 s): the markers came, so the partitions are active.
    later = _next(state, {}, [([P0, P1], {P0: _marker(None), P1: _marker(90)})], now=10_000)
    assert later.watermark is None
    assert later.partitions == {P0: (None, 10_000), P1: (96, 10_000)}


def test_a_channel_read_past_its_data_keeps_its_last_marker() -> None:
    state = _next(WatermarkState(), {}, [([P0, P1], {P0: _marker(100), P1: _marker(100)})])
    # Unaligned: P1's range ended at a data record; its rows (event time 900) do not count.
    state = _next(state, {P1: 900}, [([P0, P1], {P0: _marker(150), P1: None})])
    assert state.watermark == 100
    state = _next(state, {}, [([P0, P1], {P0: _marker(160), P1: _marker(150)})])
    assert state.watermark == 150


def test_an_upstream_without_event_time_keeps_the_rows_rule() -> None:
    marks = {P0: _marker(None, event_time=False), P1: _marker(None, event_time=False)}
    state = _next(WatermarkState(), {P0: 300, P1: 200}, [([P0, P1], marks)])
    assert state.watermark == 194  # min(300, 200) - 5 - 1


def test_a_union_takes_the_minimum_of_the_upstream_and_the_other_inputs() -> None:
    kafka = "bids:0"  # a Kafka input of the union: the rows' rule
    inputs = [([P0, P1], {P0: _marker(114), P1: _marker(114)})]
    assert _next(WatermarkState(), {P0: 999, kafka: 100}, inputs, others=[kafka]).watermark == 94
    assert _next(WatermarkState(), {P0: 999, kafka: 500}, inputs, others=[kafka]).watermark == 114
