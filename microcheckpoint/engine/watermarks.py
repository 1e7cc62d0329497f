"""Event time: the watermark of an epoch, from each source partition's highest event time.

A source declares its event-time column and a bound on out-of-orderness (``EventTime``).
After epoch n has read its records:

1. each partition's watermark is the highest event time it has ever carried minus the bound
   minus 1 ms, as Flink's, so a record exactly the bound behind is still on time (a
   partition that has never carried a record has none yet);
2. a partition with no record for ``idle_timeout_s`` of processing time (checkpoint trigger
   times) is idle and does not hold the watermark back; with every partition idle the
   watermark stays where it was (Flink's idleness);
3. the epoch's watermark is the minimum over the other partitions, and never goes back.

A record is late when its event time is at or below the watermark the epoch started with:
everything downstream has already been told no such record would come. The watermark state
(per partition: highest event time, last time active; and the watermark) is the source
operator's state, stored in each checkpoint (one small file the source's ack references) and
restored exactly. Pure Python: no Spark here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ConfigError, MetadataFormatError

__all__ = ["WATERMARKS_KEY", "EventTime", "WatermarkState", "advance", "event_ms"]

# The key of the watermark state in the source's state file (kg 0, memory format).
WATERMARKS_KEY = "\u0000watermarks"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class EventTime:
    """A source's event time (Flink's ``WatermarkStrategy.forBoundedOutOfOrderness``).

    Args:
        column: the column holding each row's event time: epoch milliseconds (long) or a
            timestamp.
        max_out_of_orderness_ms: how far behind the highest event time seen a record may
            arrive and still be on time.
        idle_timeout_s: a partition with no record for this long (in checkpoint trigger
            time) stops holding the watermark back; None: never.
    """

    column: str
    max_out_of_orderness_ms: int = 0
    idle_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ConfigError("event_time column", self.column, "the name of a column")
        bound = self.max_out_of_orderness_ms
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise ConfigError("max_out_of_orderness_ms", bound, "an integer >= 0")
        idle = self.idle_timeout_s
        if idle is not None and (
            isinstance(idle, bool) or not isinstance(idle, int | float) or idle <= 0
        ):
            raise ConfigError("idle_timeout_s", idle, "a number of seconds > 0, or None")


def event_ms(value: Any) -> int | None:
    """A row's event time in epoch milliseconds (from a long or a timestamp), or None."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return (moment - _EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError("event time", repr(value), "epoch milliseconds (long) or a timestamp")
    return int(value)


@dataclass(frozen=True)
class WatermarkState:
    """Per partition ``[highest event time or None, last active ms]``, and the watermark."""

    partitions: Mapping[str, tuple[int | None, int]] = field(default_factory=dict)
    watermark: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": {tp: list(v) for tp, v in sorted(self.partitions.items())},
            "watermark": self.watermark,
        }

    @classmethod
    def from_json(cls, body: Any, source: str) -> WatermarkState:
        try:
            parts = {
                str(tp): (None if v[0] is None else int(v[0]), int(v[1]))
                for tp, v in body["partitions"].items()
            }
            mark = body["watermark"]
            return cls(parts, None if mark is None else int(mark))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise MetadataFormatError(f"watermark state in {source} is corrupt: {exc}") from exc

    def encode(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


def advance(
    state: WatermarkState,
    epoch_max: Mapping[str, int],
    partitions: Iterable[str],
    event_time: EventTime,
    now_ms: int,
) -> WatermarkState:
    """The watermark state after an epoch (steps in the module docstring).

    Args:
        state: the state the epoch started from.
        epoch_max: the highest event time of each partition that had records this epoch.
        partitions: every partition of the epoch's barrier (with records or not).
        event_time: the source's declaration.
        now_ms: the epoch's processing time (its checkpoint's trigger time).
    """
    parts = dict(state.partitions)
    for tp in partitions:
        parts.setdefault(tp, (None, now_ms))  # first seen: active from now
    for tp, high in epoch_max.items():
        old = parts.get(tp, (None, now_ms))[0]
        parts[tp] = (high if old is None else max(old, high), now_ms)
    idle_ms = None if event_time.idle_timeout_s is None else int(event_time.idle_timeout_s * 1000)
    active = [v for v in parts.values() if idle_ms is None or now_ms - v[1] < idle_ms]
    mark = state.watermark
    if active and all(high is not None for high, _ in active):
        low = min(high for high, _ in active) - event_time.max_out_of_orderness_ms - 1  # type: ignore[type-var]
        mark = low if mark is None else max(mark, low)
    return WatermarkState(parts, mark)
