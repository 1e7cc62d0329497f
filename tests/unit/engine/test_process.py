"""One subtask's epoch of a keyed process function (``run_function``) and the watermark
rules (``engine.watermarks``), with state held in a dict: no Spark, no storage."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from microcheckpoint.engine.process import (
    EpochTimes,
    KeyedProcessFunction,
    ValueFunction,
    run_function,
)
from microcheckpoint.engine.watermarks import EventTime, WatermarkState, advance, event_ms
from microcheckpoint.errors import ConfigError
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.kinds import LATE_KEY, TIMERS_KEY, list_state, value_state

T = 1_700_000_000_000


class Store:
    """Keyed state as the backends hold it: ``{kg: {key: stored}}``; one key group per key."""

    def __init__(self) -> None:
        self.groups: dict[int, dict[str, Any]] = {}

    def load(self, keys_by_kg):
        return {
            k: (self.groups[kg][k], 0)
            for kg, keys in keys_by_kg.items()
            for k in keys
            if k in self.groups.get(kg, {})
        }

    def load_groups(self, keys_by_kg):
        out = {}
        for kg, keys in keys_by_kg.items():
            found = {k: (self.groups[kg][k], 0) for k in keys if k in self.groups.get(kg, {})}
            if found:
                out[kg] = found
        return out

    def put(self, kg, key, value):
        self.groups.setdefault(kg, {})[key] = json.loads(json.dumps(value))

    def delete(self, kg, key):
        self.groups.get(kg, {}).pop(key, None)

    def epoch(self, function, times, rows_by_key: dict[Any, list[dict]]) -> list[dict]:
        by_key = {canonical_key(k): rows for k, rows in rows_by_key.items()}
        kg_of = {ck: 0 for ck in by_key}
        return run_function(
            function, times, by_key, kg_of, [0], self.load, self.load_groups, self.put, self.delete
        )


class Alarm(KeyedProcessFunction):
    """Counts a key's rows; an event-time timer 10 ms after its latest row reports the count
    and clears it; processing-time timers echo; late rows are echoed as such."""

    states = (value_state("count", default=0), list_state("late"))

    def process(self, key, rows, ctx):
        count = ctx.state("count")
        count.update(count.value() + len(rows))
        ctx.timers.register_event_time(max(r["ts"] for r in rows) + 10)
        if rows[0].get("ping"):
            ctx.timers.register_processing_time(ctx.processing_time + rows[0]["ping"])
        return []

    def on_timer(self, key, timestamp, ctx):
        if ctx.time_domain == "processing":
            return [{"key": key, "what": "ping", "at": timestamp}]
        out = [{"key": key, "what": "count", "at": timestamp, "n": ctx.state("count").value()}]
        ctx.state("count").clear()
        if ctx.state("late").get() == ["chain"]:
            ctx.state("late").clear()
            ctx.timers.register_event_time(timestamp + 1)  # due at once: fires this epoch
        return out

    def on_late(self, key, rows, ctx):
        return [{"key": key, "what": "late", "at": r["ts"]} for r in rows]


def test_event_time_timers_fire_once_the_watermark_passes_in_timestamp_order() -> None:
    store = Store()
    out = store.epoch(Alarm(), EpochTimes(T, None, 100), {"a": [{"ts": 95}], "b": [{"ts": 80}]})
    # b's timer (90) is due at watermark 100, a's (105) is not
    assert out == [{"key": "b", "what": "count", "at": 90, "n": 1}]
    assert store.groups[0][TIMERS_KEY] == {canonical_key("a"): [[105, "event"]]}
    out = store.epoch(Alarm(), EpochTimes(T, 100, 200), {})
    assert out == [{"key": "a", "what": "count", "at": 105, "n": 1}]
    assert TIMERS_KEY not in store.groups[0]  # no timer left: the index row is deleted
    assert canonical_key("a") not in store.groups[0]  # cleared state deletes the key's row


def test_a_timer_registered_while_firing_fires_in_the_same_epoch_when_due() -> None:
    store = Store()
    store.put(0, canonical_key("a"), {"s": {"late": [["chain", T]], "count": [2, T]}})
    store.put(0, TIMERS_KEY, {canonical_key("a"): [[50, "event"]]})
    out = store.epoch(Alarm(), EpochTimes(T, 40, 60), {})
    assert out == [
        {"key": "a", "what": "count", "at": 50, "n": 2},
        {"key": "a", "what": "count", "at": 51, "n": 0},
    ]


def test_processing_time_timers_fire_in_the_first_epoch_whose_time_reaches_them() -> None:
    store = Store()
    store.epoch(Alarm(), EpochTimes(T), {"a": [{"ts": 1, "ping": 5_000}]})
    assert store.epoch(Alarm(), EpochTimes(T + 4_999), {}) == []
    assert store.epoch(Alarm(), EpochTimes(T + 5_000), {}) == [
        {"key": "a", "what": "ping", "at": T + 5_000}
    ]


def test_late_rows_are_counted_and_dropped_or_given_to_on_late() -> None:
    rows = {"a": [{"ts": 50}, {"ts": 40}, {"ts": 41}]}
    store = Store()
    dropped = store.epoch(Alarm(), EpochTimes(T, 40, 45, "ts", "drop"), rows)
    assert dropped == [] and store.groups[0][LATE_KEY] == 1
    assert store.groups[0][canonical_key("a")]["s"]["count"][0] == 2  # 50 and 41 on time
    side = Store()
    out = side.epoch(Alarm(), EpochTimes(T, 41, 45, "ts", "side_output"), rows)
    assert out == [{"key": "a", "what": "late", "at": 40}, {"key": "a", "what": "late", "at": 41}]
    assert side.groups[0][LATE_KEY] == 2
    store.epoch(Alarm(), EpochTimes(T, 45, 45, "ts", "drop"), {"a": [{"ts": 45}]})
    assert store.groups[0][LATE_KEY] == 2  # counts add up across epochs


def test_a_plain_fn_keeps_the_bare_layout_and_deletes_on_none() -> None:
    def fn(key, rows, state):
        total = (state or 0) + len(rows)
        return [{"key": key, "total": total}], (None if total >= 3 else total)

    store = Store()
    assert store.epoch(ValueFunction(fn), EpochTimes(T), {"a": [{}, {}]}) == [
        {"key": "a", "total": 2}
    ]
    assert store.groups[0] == {canonical_key("a"): 2}  # the value itself, no timers row
    store.epoch(ValueFunction(fn), EpochTimes(T), {"a": [{}]})
    assert store.groups[0] == {}


class _GeneralValueFunction(KeyedProcessFunction):
    """``ValueFunction``'s behaviour, through the general path (per-key handles)."""

    states = (value_state("value"),)
    bare = True

    def __init__(self, fn) -> None:
        self.fn = fn

    def process(self, key, rows, ctx):
        value = ctx.state("value")
        outputs, new = self.fn(key, rows, value.value())
        value.update(new)
        return outputs


def test_a_plain_fn_gives_what_the_general_path_gives() -> None:
    """``run_function`` takes a short path for ``fn(key, rows, state)``: the same outputs,
    stored values and deletions as the general path, epoch after epoch."""

    def fn(key, rows, state):
        seen = (state or []) + [r["v"] for r in rows]
        out = [{"key": key, "n": len(seen), "first": seen[0]}]
        return out, (None if len(seen) % 4 == 0 else seen)  # every 4th row clears the key

    short, general = Store(), Store()
    for epoch in range(6):
        rows = {
            k: [{"v": epoch * 100 + i} for i in range((epoch + len(str(k))) % 3 + 1)]
            for k in ["a", "b", 7, ("x", 1), None][epoch % 2 :]
        }
        got = short.epoch(ValueFunction(fn), EpochTimes(T + epoch), rows)
        assert got == general.epoch(_GeneralValueFunction(fn), EpochTimes(T + epoch), rows)
        assert short.groups == general.groups
    assert any(short.groups.values()) and not all(
        len(g) == 5 for g in short.groups.values()
    )  # both kept and cleared keys were exercised


def test_a_subclass_of_value_function_keeps_its_own_process() -> None:
    class Tagged(ValueFunction):
        def process(self, key, rows, ctx):
            return [{**row, "tagged": True} for row in super().process(key, rows, ctx)]

    def fn(key, rows, state):
        return [{"key": key}], len(rows)

    assert Store().epoch(Tagged(fn), EpochTimes(T), {"a": [{}]}) == [{"key": "a", "tagged": True}]


def test_a_non_integer_timer_is_refused_naming_it() -> None:
    class Bad(KeyedProcessFunction):
        def process(self, key, rows, ctx):
            ctx.timers.register_event_time(1.5)

    with pytest.raises(ConfigError) as err:
        Store().epoch(Bad(), EpochTimes(T), {"a": [{}]})
    assert err.value.field == "timer timestamp"


# ---- watermarks ---------------------------------------------------------------------


def test_the_watermark_is_the_slowest_partition_minus_the_bound_minus_one() -> None:
    et = EventTime("ts", max_out_of_orderness_ms=10)
    state = advance(WatermarkState(), {"t:0": 100}, ["t:0", "t:1"], et, T)
    assert state.watermark is None  # t:1 has carried nothing yet
    state = advance(state, {"t:1": 50}, ["t:0", "t:1"], et, T + 1)
    assert state.watermark == 39
    state = advance(state, {"t:1": 40}, ["t:0", "t:1"], et, T + 2)
    assert state.watermark == 39  # never back
    state = advance(state, {"t:1": 300, "t:0": 120}, ["t:0", "t:1"], et, T + 3)
    assert state.watermark == 109
    assert WatermarkState.from_json(json.loads(state.encode()), "x") == state


def test_an_idle_partition_stops_holding_the_watermark_back() -> None:
    et = EventTime("ts", 0, idle_timeout_s=5)
    state = advance(WatermarkState(), {"t:0": 100, "t:1": 10}, ["t:0", "t:1"], et, T)
    assert state.watermark == 9
    state = advance(state, {"t:0": 200}, ["t:0", "t:1"], et, T + 4_999)
    assert state.watermark == 9  # t:1 is not idle yet
    state = advance(state, {"t:0": 300}, ["t:0", "t:1"], et, T + 5_000)
    assert state.watermark == 299
    state = advance(state, {}, ["t:0", "t:1"], et, T + 60_000)
    assert state.watermark == 299  # all idle: it stays


def test_event_time_from_a_timestamp_or_a_long() -> None:
    moment = dt.datetime(2023, 11, 14, 22, 13, 20, 5000, tzinfo=dt.UTC)
    assert event_ms(moment) == 1_700_000_000_005
    assert event_ms(moment.replace(tzinfo=None)) == 1_700_000_000_005
    assert event_ms(7) == 7 and event_ms(None) is None
    with pytest.raises(ConfigError):
        event_ms("yesterday")
