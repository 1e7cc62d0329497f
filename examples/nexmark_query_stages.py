"""Nexmark q5 and q7 in two stages: per auction, then per window, across an internal topic.

- Stage 1 (``<name>-auctions``) reads the bids folder with event time and runs the per
  auction window (q5: bids per auction per sliding window; q7: each auction's top-priced
  bids per tumbling window); each firing, stamped ``date_time = window_end - 1``
  (:func:`examples.nexmark_queries.window_time`), goes to an internal topic keyed by
  ``window_start`` (a ``StageSink`` with barrier markers).
- Stage 2 (``<name>-windows``) reads the topic (a ``StageSource`` aligned on stage 1's
  markers) and keeps per window the top (``WindowTop``), into a ``FileSink`` (uid ``out``).

Stage 2's event time: its ``StageSource`` declares ``EventTime("date_time", bound)``; when
stage 1's markers carry its watermark (``engine.stage_watermarks``), stage 2's watermark is
exactly stage 1's; otherwise it is stage 2's own, from the stamped ``date_time`` (highest
``window_end - 1`` seen minus the bound minus 1). Either way a window's firings reach stage
2 in one epoch (an aligned epoch ends at one of stage 1's markers), so the answer is the same
as the single stage's (:mod:`examples.nexmark_queries`).
"""

from __future__ import annotations

from examples.nexmark_queries import (
    SINK,
    bids_source,
    q5_counts,
    q5_top,
    q7_auction_top,
    q7_top,
    window_time,
)
from microcheckpoint.engine import EventTime, Pipeline, StageSource
from microcheckpoint.engine.api import KeyedOperator
from microcheckpoint.sinks.files import FileSink
from microcheckpoint.sinks.stage import StageSink

__all__ = ["FIRINGS", "build", "q5_stages", "q7_stages"]

# The columns stage 1 writes to the internal topic, per query.
FIRINGS = {
    "q5": {
        "member": "string",
        "window_start": "long",
        "window_end": "long",
        "num": "long",
        "date_time": "long",
    },
    "q7": {
        "member": "string",
        "window_start": "long",
        "window_end": "long",
        "bidder": "long",
        "price": "long",
        "date_time": "long",
    },
}


def build(
    query: str,
    bids_url: str,
    sink: str,
    bootstrap: str,
    internal_topic: str,
    *,
    name: str | None = None,
    bound_ms: int = 2_000,
    allowed_lateness_ms: int = 0,
    files_per_epoch: int = 1,
    partitions: int = 2,
) -> tuple[Pipeline, Pipeline]:
    """The two stages of ``query`` (``q5`` or ``q7``): stage 1 writes ``internal_topic``
    (created by the ``StageSink`` with ``partitions``), stage 2 reads it.

    Raises:
        ValueError: ``query`` is neither ``q5`` nor ``q7``.
    """
    if query not in FIRINGS:
        raise ValueError(f"Nexmark query {query!r} in two stages: give q5 or q7")
    base = name or f"nexmark-{query}"
    first: KeyedOperator
    if query == "q5":
        first, second = q5_counts(allowed_lateness_ms), q5_top(allowed_lateness_ms)
    else:
        first, second = q7_auction_top(allowed_lateness_ms), q7_top(allowed_lateness_ms)
    upstream = f"{base}-auctions"
    stage1 = (
        Pipeline(upstream, bids_source(bids_url, bound_ms, files_per_epoch))
        .then(first)
        .then(window_time)
        .then(
            StageSink(
                "to-windows", bootstrap, internal_topic, key="window_start", partitions=partitions
            )
        )
    )
    source = StageSource(
        "from-auctions",
        [internal_topic],
        "json",
        FIRINGS[query],
        upstream=upstream,
        upstream_uid="to-windows",
        event_time=EventTime("date_time", bound_ms),
    )
    stage2 = Pipeline(f"{base}-windows", source).then(second).then(FileSink(SINK, sink))
    return stage1, stage2


def q5_stages(*args: object, **options: object) -> tuple[Pipeline, Pipeline]:
    """``build("q5", ...)``."""
    return build("q5", *args, **options)  # type: ignore[arg-type]


def q7_stages(*args: object, **options: object) -> tuple[Pipeline, Pipeline]:
    """``build("q7", ...)``."""
    return build("q7", *args, **options)  # type: ignore[arg-type]
