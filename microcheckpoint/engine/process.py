"""Keyed process functions: named state of every kind, timers, late rows (Flink's
``KeyedProcessFunction``, Spark's ``transformWithState``), run per subtask and epoch.

A function declares its states (``state.kinds``) and implements ``process`` (per key with
rows this epoch), and optionally ``on_timer`` and ``on_late``. ``run_function`` is one
subtask's epoch, with no Spark import (steps in its docstring). The general
``KeyedOperator(fn=...)`` runs through the same path: ``ValueFunction`` is a process function
with one value state stored as the key's row itself (the layout before named state).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.engine.watermarks import event_ms
from microcheckpoint.errors import ConfigError
from microcheckpoint.state.backends import key_of
from microcheckpoint.state.kinds import (
    LATE_KEY,
    TIMERS_KEY,
    KeyState,
    StateDescriptor,
    value_state,
)

__all__ = [
    "EVENT",
    "LATE_POLICIES",
    "PROCESSING",
    "EpochTimes",
    "KeyedProcessFunction",
    "ProcessContext",
    "TimerService",
    "ValueFunction",
    "run_function",
]

EVENT, PROCESSING = "event", "processing"
LATE_POLICIES = ("drop", "side_output")
Rows = list[dict[str, Any]]


class KeyedProcessFunction:
    """Subclass it: declare ``states`` and implement ``process``; ``on_timer`` and
    ``on_late`` are optional. Every method returns an iterable of output rows (dicts with
    the operator's output columns) or None."""

    states: tuple[StateDescriptor, ...] = ()
    # the key's stored row is the value itself (one value state, no timers): the layout of
    # KeyedOperator(fn=...) and the built-in aggregations
    bare: bool = False

    def process(self, key: Any, rows: Rows, ctx: ProcessContext) -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__}.process")

    def on_timer(self, key: Any, timestamp: int, ctx: ProcessContext) -> Iterable[dict] | None:
        """Called when a timer of the key fires (``ctx.time_domain`` says which kind)."""
        return None

    def on_late(self, key: Any, rows: Rows, ctx: ProcessContext) -> Iterable[dict] | None:
        """With ``late="side_output"``: the key's late rows; by default they are dropped."""
        return None


class TimerService:
    """One key's timers: ``{(timestamp, domain)}``, changed from the key's callbacks."""

    def __init__(self, timers: Iterable[tuple[int, str]], on_add: Callable[[int, str], None]):
        self.timers: set[tuple[int, str]] = set(timers)
        self.changed = False
        self._on_add = on_add

    def _add(self, ts: int, domain: str) -> None:
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise ConfigError("timer timestamp", repr(ts), "epoch milliseconds (int)")
        if (ts, domain) not in self.timers:
            self.timers.add((ts, domain))
            self.changed = True
            self._on_add(ts, domain)

    def register_event_time(self, ts: int) -> None:
        """Fire ``on_timer`` once the watermark reaches ``ts`` (once per timestamp)."""
        self._add(ts, EVENT)

    def register_processing_time(self, ts: int) -> None:
        """Fire ``on_timer`` in the first epoch whose processing time reaches ``ts``."""
        self._add(ts, PROCESSING)

    def _delete(self, ts: int, domain: str) -> None:
        if (ts, domain) in self.timers:
            self.timers.discard((ts, domain))
            self.changed = True

    def delete_event_time(self, ts: int) -> None:
        self._delete(ts, EVENT)

    def delete_processing_time(self, ts: int) -> None:
        self._delete(ts, PROCESSING)

    def registered(self) -> list[tuple[int, str]]:
        """The key's pending timers, in firing order."""
        return sorted(self.timers)


@dataclass(frozen=True)
class EpochTimes:
    """The times of one epoch: the watermark before and after it, and its processing time."""

    processing_ms: int
    watermark_before: int | None = None
    watermark_after: int | None = None
    event_column: str | None = None
    late: str = "drop"


class ProcessContext:
    """What a callback sees: the key, its state and timers, and the epoch's times."""

    def __init__(self, key: Any, state: KeyState, timers: TimerService, times: EpochTimes):
        self.key = key
        self._state = state
        self.timers = timers
        self.processing_time = times.processing_ms
        self.watermark = times.watermark_before
        self.timestamp: int | None = None
        self.time_domain: str | None = None
        # the source's event-time column (None without ``EventTime``)
        self.event_column = times.event_column

    def state(self, name: str) -> Any:
        """The handle of the declared state ``name`` for this key."""
        return self._state.state(name)

    def event_time(self, row: Mapping[str, Any]) -> int | None:
        """``row``'s event time in epoch ms (None: no event time declared, or a null value)."""
        return None if self.event_column is None else event_ms(row.get(self.event_column))


class ValueFunction(KeyedProcessFunction):
    """``fn(key, rows, state) -> (outputs, new_state)`` as a process function."""

    states = (value_state("value"),)
    bare = True

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def process(self, key: Any, rows: Rows, ctx: ProcessContext) -> Iterable[dict]:
        value = ctx.state("value")
        outputs, new = self.fn(key, rows, value.value())
        value.update(new)
        return outputs


class _Key:
    """One key's state, timers and context while the subtask runs."""

    def __init__(
        self, ck: str, kg: int, stored: Any, timers: Iterable, function, times, push, descriptors
    ):
        self.ck, self.kg = ck, kg
        if function.bare:  # the row is the value itself
            stored = None if stored is None else {"s": {"value": [stored, 0]}}
        self.state = KeyState(descriptors, stored, times.processing_ms)
        self.timers = TimerService(
            [(int(t), str(d)) for t, d in timers], lambda ts, d: push(ts, d, ck)
        )
        self.ctx = ProcessContext(key_of(ck), self.state, self.timers, times)

    def stored(self, bare: bool) -> Any:
        if bare:
            pair = self.state.raw.get("value")
            return None if pair is None else pair[0]
        return self.state.stored()


def _run_value_function(
    function: ValueFunction,
    by_key: Mapping[str, Rows],
    kg_of: Mapping[str, int],
    load: Callable[[Mapping[int, Iterable[str]]], dict[str, tuple[Any, int]]],
    put: Callable[[int, str, Any], None],
    delete: Callable[[int, str], None],
) -> Rows:
    """``run_function`` of ``fn(key, rows, state)`` when no row can be late: no timers, no
    late counts, one value per key, so each key is ``fn`` of its stored value and the value
    it returns is stored (None deletes it), in key order, without the per-key handles of
    the general path (which gives the same result)."""
    order = sorted(by_key)
    wanted: dict[int, list[str]] = {}
    for ck in order:
        wanted.setdefault(kg_of[ck], []).append(ck)
    before = load(wanted)
    outputs: Rows = []
    for ck in order:
        stored = before.get(ck)
        result, new = function.fn(key_of(ck), by_key[ck], None if stored is None else stored[0])
        outputs += _outputs(result)
        if new is not None:
            put(kg_of[ck], ck, new)
        elif stored is not None:
            delete(kg_of[ck], ck)
    return outputs


def _is_late(value: Any, watermark: int) -> bool:
    """A row is late when its event time is at or below the watermark (no time: on time)."""
    ms = event_ms(value)
    return ms is not None and ms <= watermark


def _outputs(result: Iterable[dict] | None) -> Rows:
    return [] if result is None else list(result)


def run_function(
    function: KeyedProcessFunction,
    times: EpochTimes,
    by_key: Mapping[str, Rows],
    kg_of: Mapping[str, int],
    owned: Iterable[int],
    load: Callable[[Mapping[int, Iterable[str]]], dict[str, tuple[Any, int]]],
    load_groups: Callable[[Mapping[int, Iterable[str]]], dict[int, dict[str, tuple[Any, int]]]],
    put: Callable[[int, str, Any], None],
    delete: Callable[[int, str], None],
) -> Rows:
    """One subtask's epoch of ``function``; returns its output rows.

    Steps: 1. the owned key groups' timers and late counts (not for a bare function);
    2. the touched keys' state, and that of keys with a timer due; 3. per key in key order,
    late rows split off (counted; to ``on_late`` with ``side_output``), ``process`` on the
    others; 4. due timers fire in (timestamp, key) order, a timer registered while firing
    too if due; 5. changed keys, timers and late counts written (``put``, ``delete``).

    Args:
        by_key: this epoch's rows per canonical key, each key's rows in source order.
        kg_of: the key group of every canonical key of ``by_key``.
        load: ``{kg: [canonical keys]} -> {key: (stored, updated_ms)}`` before this epoch.
        load_groups: the same, by key group (for the keys every group has: timers, late).
    """
    if type(function) is ValueFunction and (
        times.event_column is None or times.watermark_before is None
    ):
        return _run_value_function(function, by_key, kg_of, load, put, delete)
    bare = function.bare
    # Step 1: timers and late counts of every owned key group.
    timer_maps: dict[int, dict[str, list]] = {}
    late_before: dict[int, int] = {}
    late_counts: dict[int, int] = {}
    if not bare:
        pseudo = load_groups({kg: [TIMERS_KEY, LATE_KEY] for kg in owned})
        for kg, rows in pseudo.items():
            if TIMERS_KEY in rows:
                timer_maps[kg] = dict(rows[TIMERS_KEY][0])
            if LATE_KEY in rows:
                late_before[kg] = int(rows[LATE_KEY][0])
    kg_of = dict(kg_of)
    due: list[tuple[int, str, str]] = []
    mark = times.watermark_after

    def is_due(ts: int, domain: str) -> bool:
        if domain == EVENT:
            return mark is not None and ts <= mark
        return ts <= times.processing_ms

    for kg, timers in timer_maps.items():
        for ck, entries in timers.items():
            kg_of.setdefault(ck, kg)
            due.extend((int(t), ck, str(d)) for t, d in entries if is_due(int(t), str(d)))
    # Step 2: stored state of the keys with rows or due timers.
    wanted: dict[int, set[str]] = {}
    for ck in [*by_key, *(ck for _, ck, _ in due)]:
        wanted.setdefault(kg_of[ck], set()).add(ck)
    before = load({kg: sorted(cks) for kg, cks in wanted.items()})
    keys: dict[str, _Key] = {}
    descriptors = {d.name: d for d in function.states}

    def push(ts: int, domain: str, ck: str) -> None:
        if is_due(ts, domain):
            heapq.heappush(due, (ts, ck, domain))

    def key_of(ck: str) -> _Key:
        if ck not in keys:
            stored = before.get(ck, (None, 0))[0]
            timers = timer_maps.get(kg_of[ck], {}).get(ck, [])
            keys[ck] = _Key(ck, kg_of[ck], stored, timers, function, times, push, descriptors)
        return keys[ck]

    # Step 3: process, in key order.
    outputs: Rows = []
    column = times.event_column
    for ck in sorted(by_key):
        k = key_of(ck)
        rows, late = by_key[ck], []
        if column is not None and times.watermark_before is not None:
            flags = [_is_late(r.get(column), times.watermark_before) for r in rows]
            late = [r for r, f in zip(rows, flags, strict=True) if f]
            rows = [r for r, f in zip(rows, flags, strict=True) if not f]
        if rows:
            outputs += _outputs(function.process(k.ctx.key, rows, k.ctx))
        if late:
            late_counts[k.kg] = late_counts.get(k.kg, 0) + len(late)
            if times.late == "side_output":
                outputs += _outputs(function.on_late(k.ctx.key, late, k.ctx))
    # Step 4: due timers, in (timestamp, key) order.
    heapq.heapify(due)
    while due:
        ts, ck, domain = heapq.heappop(due)
        k = key_of(ck)
        if (ts, domain) not in k.timers.timers:
            continue  # deleted meanwhile
        k.timers.timers.discard((ts, domain))
        k.timers.changed = True
        k.ctx.watermark, k.ctx.timestamp, k.ctx.time_domain = mark, ts, domain
        outputs += _outputs(function.on_timer(k.ctx.key, ts, k.ctx))
        k.ctx.timestamp = k.ctx.time_domain = None
    # Step 5: what changed.
    changed_timers: set[int] = set()
    for ck, k in sorted(keys.items()):
        if k.state.changed:
            value = k.stored(bare)
            if value is not None:
                put(k.kg, ck, value)
            elif ck in before:
                delete(k.kg, ck)
        if k.timers.changed:
            group = timer_maps.setdefault(k.kg, {})
            if k.timers.timers:
                group[ck] = [[t, d] for t, d in k.timers.registered()]
            else:
                group.pop(ck, None)
            changed_timers.add(k.kg)
    for kg in sorted(changed_timers):
        if timer_maps[kg]:
            put(kg, TIMERS_KEY, dict(sorted(timer_maps[kg].items())))
        else:
            delete(kg, TIMERS_KEY)
    for kg, n in sorted(late_counts.items()):
        if n:
            put(kg, LATE_KEY, late_before.get(kg, 0) + n)
    return outputs
