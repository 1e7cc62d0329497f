"""Barrier markers: how a stage's checkpoint boundary travels through an internal topic.

When stage A's checkpoint n commits, every partition of the internal topic A writes ends
epoch n with one marker record: a control record whose headers name the writer and the
epoch, with an empty value. A downstream stage's range for its epoch in that partition ends
at the first marker of A after where it starts, so its epoch holds exactly A's epoch n
(Flink's barrier n, carried in-band). Markers never reach user functions.

Headers of a marker: the Kafka sink's writer headers (``mcp-pipeline``, ``mcp-uid``,
``mcp-epoch``, ``mcp-seq``, so the sink's tail dedup writes it exactly once) plus
``mcp-marker``, whose value is the epoch in decimal, and, when the upstream has event time,
``mcp-watermark``: the upstream's watermark after that epoch in decimal ms (``none``
while it has none yet), so event time crosses stages with the barrier (Flink forwards watermarks
in-band too). Pure: no Kafka client here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MARKER_HEADER", "NO_WATERMARK", "WATERMARK_HEADER", "Marker", "is_marker", "marker_of"]

MARKER_HEADER = "mcp-marker"
WATERMARK_HEADER = "mcp-watermark"
NO_WATERMARK = b"none"  # the upstream has event time but no watermark yet

_Headers = Iterable[tuple[str, bytes | None]] | None


@dataclass(frozen=True)
class Marker:
    """Stage ``stage`` (its pipeline name and sink uid) ended epoch ``epoch`` here.

    ``event_time``: the upstream has event time (the ``mcp-watermark`` header is present);
    ``watermark``: its watermark after ``epoch`` (None: no event time, or none yet).
    """

    stage: str
    uid: str
    epoch: int
    watermark: int | None = None
    event_time: bool = False


def is_marker(headers: _Headers) -> bool:
    """Whether a record with these headers is a barrier marker (of any writer)."""
    return any(name == MARKER_HEADER for name, _ in headers or ())


def marker_of(headers: _Headers) -> Marker | None:
    """The marker a record's headers carry, or None for a data record or a malformed one."""
    values = {name: value for name, value in headers or () if value is not None}
    raw = values.get(MARKER_HEADER)
    if raw is None:
        return None
    try:
        mark = values.get(WATERMARK_HEADER)  # absent: no event time
        return Marker(
            values["mcp-pipeline"].decode("utf-8"),
            values["mcp-uid"].decode("utf-8"),
            int(raw),
            None if mark is None or mark == NO_WATERMARK else int(mark),
            mark is not None,
        )
    except (KeyError, UnicodeDecodeError, ValueError):
        return None
