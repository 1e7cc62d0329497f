"""Event-time windows as library operators: tumbling, sliding and session windows.

Each is a ``KeyedProcess`` whose function keeps, per key, one map state ``windows`` from
``[start, end]`` to the window's accumulator (incremental: ``Aggregator.add`` per row,
``Aggregator.merge`` when sessions merge) and registers event-time timers. The semantics are
Flink's:

- a window is ``[start, end)`` in epoch ms. A row at ``ts`` belongs to the tumbling window
  ``[ts - ts % size, ... + size)``; to every sliding window ``[s, s + size)`` with ``s`` a
  multiple of ``slide`` and ``s <= ts < s + size``; and opens the session ``[ts, ts + gap)``,
  merged with every session of the key it intersects (``start <= other end`` and
  ``end >= other start``), so a session ends ``gap`` after its last row;
- a window fires (one output row, or the result's rows) once the watermark reaches
  ``end - 1``;
- with ``allowed_lateness_ms = L`` a window is kept until the watermark reaches
  ``end - 1 + L``; a row behind the watermark whose window is still kept updates it and the
  window fires again in the same epoch with the updated result (once per epoch, however many
  such rows arrived); a row all of whose windows are gone is too late: ``late="drop"``
  drops it, ``late="side_output"`` emits one row with ``window_start`` and ``window_end``
  null and the aggregator's result over that row alone.

The engine counts every row behind the watermark in its key group's late count, the rows a
kept window accepted included. Rows with a null event time are refused (``ConfigError``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from microcheckpoint.engine.api import KeyedOperator, KeyedProcess
from microcheckpoint.engine.process import LATE_POLICIES, KeyedProcessFunction, ProcessContext
from microcheckpoint.errors import ConfigError
from microcheckpoint.state.kinds import Aggregator, map_state

__all__ = [
    "WindowAggregator",
    "count_rows",
    "max_of",
    "min_of",
    "session_window",
    "sliding_window",
    "sum_of",
    "tumbling_window",
]

Window = tuple[int, int]
_ABSENT = object()  # a map state's get default: no such window
FIXED = ("key", "window_start", "window_end")


@dataclass(frozen=True)
class WindowAggregator(Aggregator):
    """An ``Aggregator`` of rows that names its output column (the built-ins)."""

    output: str = "value long"


def _plus(a: Any, b: Any) -> Any:
    return a + b


def _fold(column: str, pick: Callable[[Any, Any], Any], output: str) -> WindowAggregator:
    """``pick`` over the non-null values of ``column`` (None while there are none)."""

    def add(acc: Any, row: dict[str, Any]) -> Any:
        v = row.get(column)
        return acc if v is None else (v if acc is None else pick(acc, v))

    def merge(a: Any, b: Any) -> Any:
        return b if a is None else (a if b is None else pick(a, b))

    return WindowAggregator(lambda: None, add, lambda acc: acc, merge, output)


def count_rows(output: str = "count long") -> WindowAggregator:
    """The number of rows of the window."""
    return WindowAggregator(lambda: 0, lambda acc, row: acc + 1, lambda acc: acc, _plus, output)


def sum_of(column: str, output: str = "sum long") -> WindowAggregator:
    """The sum of ``column`` (nulls skipped; null when every value is null)."""
    return _fold(column, _plus, output)


def max_of(column: str, output: str = "max long") -> WindowAggregator:
    """The highest value of ``column`` (nulls skipped)."""
    return _fold(column, max, output)


def min_of(column: str, output: str = "min long") -> WindowAggregator:
    """The lowest value of ``column`` (nulls skipped)."""
    return _fold(column, min, output)


def _columns(uid: str, output: str) -> tuple[str, ...]:
    """The column names of Spark DDL ``output`` (commas inside ``<>``/``()`` ignored)."""
    parts, depth, cur = [], 0, ""
    for ch in output:
        depth += (ch in "<(") - (ch in ">)")
        if ch == "," and depth == 0:
            parts, cur = [*parts, cur], ""
        else:
            cur += ch
    names = tuple(p.split()[0].strip("`") for p in [*parts, cur] if p.strip())
    if not names or set(names) & set(FIXED):
        raise ConfigError(
            f"output of window operator {uid!r}",
            output,
            "Spark DDL of the result's columns, e.g. 'total long', other than " + ", ".join(FIXED),
        )
    return names


class WindowFunction(KeyedProcessFunction):
    """The process function of a window operator (see the module docstring).

    Args:
        uid: the operator's uid (for messages).
        aggregator: folds rows into a window's accumulator.
        columns: the output columns after ``key, window_start, window_end``.
        size_ms, slide_ms: fixed windows (tumbling: ``slide_ms == size_ms``); None for sessions.
        gap_ms: session windows' gap; None for fixed windows.
        allowed_lateness_ms: how long after firing a window is kept for late rows.
        late: ``drop`` or ``side_output`` for rows too late for every window.
    """

    states = (map_state("windows"),)

    def __init__(
        self,
        uid: str,
        aggregator: Aggregator,
        columns: tuple[str, ...],
        *,
        size_ms: int | None = None,
        slide_ms: int | None = None,
        gap_ms: int | None = None,
        allowed_lateness_ms: int = 0,
        late: str = "drop",
    ) -> None:
        self.uid, self.aggregator, self.columns = uid, aggregator, columns
        self.size, self.slide, self.gap = size_ms, slide_ms, gap_ms
        self.lateness, self.late = allowed_lateness_ms, late

    def process(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        return self._add(key, rows, ctx)

    def on_late(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        return self._add(key, rows, ctx)

    def on_timer(self, key: Any, timestamp: int, ctx: ProcessContext) -> list[dict]:
        """Fire the window ending at ``timestamp + 1``; drop those past their lateness."""
        state, out = ctx.state("windows"), []
        if self.gap is None:
            # fixed windows: the timer names its two windows (no scan of the key's windows;
            # a window's clean-up timer is armed with it, so none is left behind)
            end = timestamp + 1
            fired = [end - self.size, end]  # type: ignore[operator]
            acc = state.get(fired, _ABSENT)
            if acc is not _ABSENT:
                out += self._rows(key, fired[0], end, acc)
            gone = [fired[0] - self.lateness, end - self.lateness]
            if acc is not _ABSENT if self.lateness == 0 else state.contains(gone):
                state.remove(gone)
            return out
        for (start, end), acc in sorted((tuple(w), a) for w, a in state.items()):
            if end - 1 == timestamp:
                out += self._rows(key, start, end, acc)
            if end - 1 + self.lateness <= timestamp:
                state.remove([start, end])
        return out

    def _add(self, key: Any, rows: list[dict], ctx: ProcessContext) -> list[dict]:
        """Fold ``rows`` into the key's windows.

        Steps: 1. the key's windows; 2. each row into its windows (a window new or fired
        before gets its timers); 3. the changed windows written back, timers of merged-away
        sessions no window needs deleted; too-late rows as the policy says.
        """
        # Step 1
        state = ctx.state("windows")
        wins: dict[Window, Any] = {(w[0], w[1]): acc for w, acc in state.items()}
        changed: set[Window] = set()
        gone: set[Window] = set()
        out: list[dict] = []
        # Step 2
        for row in rows:
            ts = self._event_ms(row, ctx)
            if self.gap is None:
                taken = self._add_fixed(wins, changed, ts, row, ctx)
            else:
                taken = self._add_session(wins, changed, gone, ts, row, ctx)
            if not taken and self.late == "side_output":
                acc = self.aggregator.add(self.aggregator.create(), row)
                out += self._rows(key, None, None, acc)
        # Step 3
        for w in sorted(gone - wins.keys()):
            state.remove(list(w))
        for w in sorted(changed & wins.keys()):
            state.put(list(w), wins[w])
        needed = {t for _, end in wins for t in self._timers(end)}
        for _, end in sorted(gone - wins.keys()):
            for t in self._timers(end):
                if t not in needed:
                    ctx.timers.delete_event_time(t)
        return out

    def _timers(self, end: int) -> tuple[int, ...]:
        return (end - 1,) if self.lateness == 0 else (end - 1, end - 1 + self.lateness)

    def _kept(self, end: int, ctx: ProcessContext) -> bool:
        return ctx.watermark is None or end - 1 + self.lateness > ctx.watermark

    def _arm(self, end: int, ctx: ProcessContext) -> None:
        # re-registering the firing timer of a window that fired makes it fire again now
        for t in self._timers(end):
            ctx.timers.register_event_time(t)

    def _add_fixed(self, wins, changed, ts: int, row: dict, ctx: ProcessContext) -> bool:
        size, slide, taken = self.size, self.slide, False
        for start in range(ts - ts % slide, ts - size, -slide):  # type: ignore[operator]
            w = (start, start + size)  # type: ignore[operator]
            if not self._kept(w[1], ctx):
                continue
            acc = wins[w] if w in wins else self.aggregator.create()
            wins[w] = self.aggregator.add(acc, row)
            changed.add(w)
            self._arm(w[1], ctx)
            taken = True
        return taken

    def _add_session(self, wins, changed, gone, ts: int, row: dict, ctx) -> bool:
        lo, hi = ts, ts + self.gap  # type: ignore[operator]
        parts = sorted(w for w in wins if w[0] <= hi and w[1] >= lo)
        if not parts and not self._kept(hi, ctx):
            return False  # kept sessions all end later, so only a lone one can be too late
        agg = self.aggregator
        acc = agg.create()
        if parts:
            acc = wins.pop(parts[0])
            for p in parts[1:]:
                acc = agg.merge(acc, wins.pop(p))  # type: ignore[misc]
            gone.update(parts)
        w = (min(lo, parts[0][0] if parts else lo), max([hi, *(p[1] for p in parts)]))
        wins[w] = agg.add(acc, row)
        changed.add(w)
        self._arm(w[1], ctx)
        return True

    def _event_ms(self, row: dict, ctx: ProcessContext) -> int:
        if ctx.event_column is None:
            raise ConfigError(
                f"event time of window operator {self.uid!r}",
                None,
                "declare event_time=EventTime(column, ...) on the pipeline's source",
            )
        ts = ctx.event_time(row)
        if ts is None:
            raise ConfigError(
                f"event time {ctx.event_column!r} of a row of window operator {self.uid!r}",
                None,
                "a non-null epoch-ms long or timestamp in every row",
            )
        return ts

    def _rows(self, key: Any, start: int | None, end: int | None, acc: Any) -> list[dict]:
        base = {"key": key if isinstance(key, str) else json.dumps(key)}
        base.update(window_start=start, window_end=end)
        result = self.aggregator.result(acc)
        if len(self.columns) == 1:
            return [{**base, self.columns[0]: result}]
        if isinstance(result, dict):
            return [{**base, **result}]
        if isinstance(result, list) and all(isinstance(r, dict) for r in result):
            return [{**base, **r} for r in result]
        raise ConfigError(
            f"result of window operator {self.uid!r}",
            type(result).__name__,
            f"a dict (or a list of dicts) with the columns {', '.join(self.columns)}",
        )


def _check_ms(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(name, value, f"an integer number of milliseconds >= {low}")


def _window(uid: str, key: str, aggregator: Aggregator, output: str | None, late: str, **opts):
    """The operator of a ``WindowFunction`` (options split: the function's and the operator's)."""
    if not isinstance(aggregator, Aggregator):
        raise ConfigError(f"aggregator of window operator {uid!r}", aggregator, "an Aggregator")
    if output is None:
        if not isinstance(aggregator, WindowAggregator):
            raise ConfigError(
                f"output of window operator {uid!r}", None, "Spark DDL of the result, e.g. 'n long'"
            )
        output = aggregator.output
    if late not in LATE_POLICIES:
        raise ConfigError("late", late, f"one of {', '.join(LATE_POLICIES)}")
    _check_ms("allowed_lateness_ms", opts.get("allowed_lateness_ms", 0), 0)
    fields = ("size_ms", "slide_ms", "gap_ms", "allowed_lateness_ms")
    fn_opts = {k: opts.pop(k) for k in fields if k in opts}
    function = WindowFunction(uid, aggregator, _columns(uid, output), late=late, **fn_opts)
    schema = f"key string, window_start long, window_end long, {output}"
    # the engine hands every row behind the watermark to on_late: the window decides
    return KeyedProcess(uid, key, function, schema, late="side_output", **opts)


def tumbling_window(
    uid: str,
    key: str,
    size_ms: int,
    aggregator: Aggregator,
    *,
    output: str | None = None,
    allowed_lateness_ms: int = 0,
    late: str = "drop",
    **options: Any,
) -> KeyedOperator:
    """Windows ``[k * size, (k + 1) * size)`` per key; rows ``key, window_start, window_end,
    <output>`` (module docstring). ``options``: ``KeyedOperator``'s ``state_backend``."""
    _check_ms("size_ms", size_ms, 1)
    lateness = allowed_lateness_ms
    fixed = {"size_ms": size_ms, "slide_ms": size_ms, "allowed_lateness_ms": lateness}
    return _window(uid, key, aggregator, output, late, **fixed, **options)


def sliding_window(
    uid: str,
    key: str,
    size_ms: int,
    slide_ms: int,
    aggregator: Aggregator,
    *,
    output: str | None = None,
    allowed_lateness_ms: int = 0,
    late: str = "drop",
    **options: Any,
) -> KeyedOperator:
    """Windows of ``size_ms`` starting every ``slide_ms`` (at most ``size_ms``, so every
    row has a window): a row is in about ``size / slide`` of them. Else as ``tumbling_window``."""
    _check_ms("size_ms", size_ms, 1)
    if isinstance(slide_ms, bool) or not isinstance(slide_ms, int) or not 0 < slide_ms <= size_ms:
        raise ConfigError("slide_ms", slide_ms, f"milliseconds in 1..size_ms ({size_ms})")
    lateness = allowed_lateness_ms
    fixed = {"size_ms": size_ms, "slide_ms": slide_ms, "allowed_lateness_ms": lateness}
    return _window(uid, key, aggregator, output, late, **fixed, **options)


def session_window(
    uid: str,
    key: str,
    gap_ms: int,
    aggregator: Aggregator,
    *,
    output: str | None = None,
    allowed_lateness_ms: int = 0,
    late: str = "drop",
    **options: Any,
) -> KeyedOperator:
    """Sessions per key that close after ``gap_ms`` without rows; ``aggregator`` needs a
    ``merge``. Else as ``tumbling_window``."""
    _check_ms("gap_ms", gap_ms, 1)
    if isinstance(aggregator, Aggregator) and aggregator.merge is None:
        raise ConfigError(
            f"aggregator of session window {uid!r}", "merge=None", "an Aggregator with a merge"
        )
    session = {"gap_ms": gap_ms, "allowed_lateness_ms": allowed_lateness_ms}
    return _window(uid, key, aggregator, output, late, **session, **options)
