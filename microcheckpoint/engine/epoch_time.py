"""Event time in one epoch: the watermark before and after it, and what an operator needs.

``epoch_watermarks`` restores the source's watermark state, measures the epoch's highest
event time per partition (or takes a stage input's from its upstream's markers) and
advances it (``engine.watermarks``); ``operator_event_options`` hands a process function
its event-time column and the two watermarks.
"""

from __future__ import annotations

from typing import Any

from microcheckpoint.engine.api import KeyedOperator, Pipeline, source_event_time
from microcheckpoint.engine.event_time import epoch_maxima, restored_watermarks
from microcheckpoint.engine.stage_watermarks import marker_ends, stage_inputs, upstream_highs
from microcheckpoint.engine.watermarks import WatermarkState, advance
from microcheckpoint.errors import ConfigError
from microcheckpoint.protocol.plan import EpochPlan
from microcheckpoint.storage.port import ObjectStore

__all__ = ["epoch_watermarks", "operator_event_options"]


def epoch_watermarks(
    pipeline: Pipeline, plan: EpochPlan, store: ObjectStore, df: Any | None, bootstrap: str = ""
) -> tuple[WatermarkState, WatermarkState] | None:
    """The watermark state before and after this epoch (None without event time): restored
    from the source's state, advanced by the epoch's highest event time per partition (a
    stage input's by its upstream's watermark instead: engine/stage_watermarks.py)."""
    event_time = source_event_time(pipeline.source)
    if event_time is None:
        return None
    before = restored_watermarks(store, plan.restore.get(pipeline.source.uid, ()))
    files = [str(tp) for tp in plan.barrier.ranges if tp.topic.startswith("files.")]
    highs = {} if df is None else epoch_maxima(df, event_time.column, files)
    partitions = [str(tp) for tp in plan.barrier.ranges]
    start, inputs = before, stage_inputs(pipeline.source)
    if inputs:  # the upstream's watermark, from the markers that end the ranges
        ends = marker_ends(bootstrap, inputs, plan.barrier.ranges)
        start, highs = upstream_highs(before, highs, ends, event_time, plan.trigger_time_ms)
    after = advance(start, highs, partitions, event_time, plan.trigger_time_ms)
    return before, after


def operator_event_options(
    pipeline: Pipeline,
    op: KeyedOperator,
    marks: tuple[WatermarkState, WatermarkState] | None,
    df: Any,
) -> dict[str, Any]:
    """A process function's event-time settings for its ``OperatorContext``."""
    if op.process_function is None:
        return {}
    options: dict[str, Any] = {"late": op.late}
    event_time = source_event_time(pipeline.source)
    if marks is not None and event_time is not None:
        if event_time.column not in df.columns:
            raise ConfigError(
                f"event_time column of operator {op.uid!r}",
                event_time.column,
                "a column of the operator's input rows (keep it through the stages before)",
            )
        options.update(
            event_column=event_time.column,
            watermark_before=marks[0].watermark,
            watermark_after=marks[1].watermark,
        )
    return options
