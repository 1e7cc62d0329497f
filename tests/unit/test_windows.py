"""Window functions run epoch by epoch through ``run_function`` over an in-memory state store
(no Spark): boundaries, firing exactly at the watermark, allowed lateness, session merging
across epochs, state and timers cleared, late rows as side output, bad configuration."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from microcheckpoint.engine import (
    Aggregator,
    count_rows,
    max_of,
    min_of,
    session_window,
    sliding_window,
    sum_of,
    tumbling_window,
)
from microcheckpoint.engine.process import EpochTimes, run_function
from microcheckpoint.errors import ConfigError
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.keygroups import key_group_for
from microcheckpoint.state.kinds import LATE_KEY, TIMERS_KEY

MAX_P = 8


class Memory:
    """One subtask owning every key group; its state survives from epoch to epoch as JSON."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.groups: dict[int, dict[str, Any]] = {}
        self.clock = 1_000

    def _load_groups(self, wanted):
        return {
            kg: {k: (self.groups[kg][k], 0) for k in keys if k in self.groups.get(kg, {})}
            for kg, keys in wanted.items()
        }

    def _load(self, wanted):
        return {k: v for rows in self._load_groups(wanted).values() for k, v in rows.items()}

    def _put(self, kg: int, key: str, value: Any) -> None:
        self.groups.setdefault(kg, {})[key] = json.loads(json.dumps(value))

    def _delete(self, kg: int, key: str) -> None:
        self.groups.get(kg, {}).pop(key, None)

    def epoch(self, rows: list[dict], before: int | None, after: int | None) -> list[dict]:
        """One epoch of ``rows`` (in source order) with the watermarks before and after it."""
        by_key: dict[str, list[dict]] = {}
        for row in rows:
            by_key.setdefault(canonical_key(row["k"]), []).append(row)
        kg_of = {ck: key_group_for(ck.encode(), MAX_P) for ck in by_key}
        self.clock += 1_000
        times = EpochTimes(self.clock, before, after, "ts", self.op.late)
        return run_function(
            self.op.process_function,
            times,
            by_key,
            kg_of,
            range(MAX_P),
            self._load,
            self._load_groups,
            self._put,
            self._delete,
        )

    def windows(self, key: Any) -> dict[tuple[int, int], Any]:
        ck = canonical_key(key)
        stored = self.groups.get(key_group_for(ck.encode(), MAX_P), {}).get(ck)
        if stored is None:
            return {}
        return {tuple(json.loads(w)): pair[0] for w, pair in stored["s"]["windows"].items()}

    def timers(self, key: Any) -> list[int]:
        ck = canonical_key(key)
        group = self.groups.get(key_group_for(ck.encode(), MAX_P), {})
        return [t for t, _ in group.get(TIMERS_KEY, {}).get(ck, [])]

    def late_count(self) -> int:
        return sum(g.get(LATE_KEY, 0) for g in self.groups.values())

    def stored_keys(self) -> list[str]:
        return sorted(k for g in self.groups.values() for k in g)


def _rows(*pairs: tuple[str, int], **extra: Any) -> list[dict]:
    return [{"k": k, "ts": ts, **extra} for k, ts in pairs]


def _out(rows: list[dict], column: str = "count") -> list[tuple]:
    return [(r["key"], r["window_start"], r["window_end"], r[column]) for r in rows]


def test_tumbling_windows_hold_start_and_exclude_end() -> None:
    mem = Memory(tumbling_window("t", "k", 10, count_rows()))
    rows = _rows(("a", -1), ("a", 0), ("a", 9), ("a", 10), ("a", 19), ("a", 20), ("b", 5))
    assert mem.epoch(rows, None, 18) == [
        {"key": "a", "window_start": -10, "window_end": 0, "count": 1},
        {"key": "a", "window_start": 0, "window_end": 10, "count": 2},
        {"key": "b", "window_start": 0, "window_end": 10, "count": 1},
    ]
    assert mem.windows("a") == {(10, 20): 2, (20, 30): 1}
    assert mem.timers("a") == [19, 29]
    assert mem.windows("b") == {} and mem.timers("b") == []


def test_a_window_fires_when_the_watermark_reaches_end_minus_one_not_before() -> None:
    mem = Memory(tumbling_window("t", "k", 10, sum_of("v")))
    assert mem.epoch(_rows(("a", 3), ("a", 7), v=5), None, 8) == []
    assert mem.epoch([], 8, 8) == []
    assert _out(mem.epoch([], 8, 9), "sum") == [("a", 0, 10, 10)]
    assert mem.stored_keys() == []  # state and timers gone with lateness 0


def test_rows_behind_the_watermark_still_join_a_window_that_has_not_fired() -> None:
    mem = Memory(tumbling_window("t", "k", 10, count_rows()))
    assert mem.epoch(_rows(("a", 6)), None, 5) == []
    assert mem.epoch(_rows(("a", 2)), 5, 9) == [  # 2 <= 5: late, but [0, 10) is open
        {"key": "a", "window_start": 0, "window_end": 10, "count": 2}
    ]
    assert mem.late_count() == 1  # the engine counts every row behind the watermark


def test_allowed_lateness_fires_again_then_clears_the_window() -> None:
    mem = Memory(tumbling_window("t", "k", 10, max_of("v"), allowed_lateness_ms=5))
    assert _out(mem.epoch(_rows(("a", 4), v=1), None, 9), "max") == [("a", 0, 10, 1)]
    assert mem.windows("a") == {(0, 10): 1} and mem.timers("a") == [14]
    # two late rows in one epoch: one firing with both
    late = [{"k": "a", "ts": 2, "v": 7}, {"k": "a", "ts": 8, "v": 3}]
    assert _out(mem.epoch(late, 9, 12), "max") == [("a", 0, 10, 7)]
    assert mem.timers("a") == [14]
    assert _out(mem.epoch(_rows(("a", 1), v=9), 12, 13), "max") == [("a", 0, 10, 9)]
    assert mem.epoch([], 13, 14) == []  # cleanup: watermark at end - 1 + lateness
    assert mem.stored_keys() == [LATE_KEY] and mem.late_count() == 3
    assert mem.epoch(_rows(("a", 5), v=99), 14, 15) == []  # too late: dropped
    assert mem.stored_keys() == [LATE_KEY] and mem.late_count() == 4


def test_rows_too_late_for_every_window_go_to_the_side_output() -> None:
    mem = Memory(sliding_window("s", "k", 10, 5, min_of("v"), late="side_output"))
    assert _out(mem.epoch(_rows(("a", 12), v=4), None, 14), "min") == [("a", 5, 15, 4)]
    out = mem.epoch(_rows(("a", 3), v=2) + _rows(("a", 11), v=2), 14, 14)
    # 3 is in [-5, 5) and [0, 10), both gone: too late; 11 joins [10, 20), not [5, 15)
    assert out == [{"key": "a", "window_start": None, "window_end": None, "min": 2}]
    assert mem.windows("a") == {(10, 20): 2}
    assert mem.late_count() == 2


def test_sliding_windows_put_a_row_in_every_window_covering_it() -> None:
    mem = Memory(sliding_window("s", "k", 10, 5, count_rows()))
    assert mem.epoch(_rows(("a", 7), ("a", 12)), None, 3) == []
    assert mem.windows("a") == {(0, 10): 1, (5, 15): 2, (10, 20): 1}
    assert _out(mem.epoch(_rows(("a", 14)), 3, 30)) == [
        ("a", 0, 10, 1),
        ("a", 5, 15, 3),
        ("a", 10, 20, 2),
    ]


def test_sessions_merge_across_epochs_and_stale_timers_are_deleted() -> None:
    mem = Memory(session_window("s", "k", 10, count_rows()))
    assert mem.epoch(_rows(("a", 0), ("a", 25), ("b", 0)), None, 5) == []
    assert mem.windows("a") == {(0, 10): 1, (25, 35): 1}
    assert mem.epoch(_rows(("a", 8)), 5, 6) == []  # [8, 18) joins [0, 10)
    assert mem.windows("a") == {(0, 18): 2, (25, 35): 1}
    assert mem.timers("a") == [17, 34]
    assert _out(mem.epoch(_rows(("a", 17)), 6, 10)) == [("b", 0, 10, 1)]
    # [17, 27) bridges [0, 18) and [25, 35) (touching counts, as in Flink)
    assert mem.windows("a") == {(0, 35): 4}
    assert mem.timers("a") == [34]
    assert _out(mem.epoch([], 10, 34)) == [("a", 0, 35, 4)]
    assert mem.stored_keys() == []


def test_a_late_row_merging_into_a_fired_session_fires_the_merged_session() -> None:
    mem = Memory(session_window("s", "k", 10, sum_of("v"), allowed_lateness_ms=20))
    assert _out(mem.epoch(_rows(("a", 0), v=1), None, 20), "sum") == [("a", 0, 10, 1)]
    assert mem.timers("a") == [29]
    # [3, 13) merges with the fired [0, 10): [0, 13) is behind the watermark, fires now
    assert _out(mem.epoch(_rows(("a", 3), v=2), 20, 20), "sum") == [("a", 0, 13, 3)]
    assert mem.windows("a") == {(0, 13): 3}
    assert mem.timers("a") == [32]  # the cleanup timer of [0, 10) deleted
    # a late row merging into nothing kept, alone too late ([-30, -20) ends before 20 - 20)
    assert mem.epoch(_rows(("a", -30), v=5), 20, 31) == []
    assert mem.epoch([], 31, 32) == [] and mem.stored_keys() == [LATE_KEY]


def test_several_output_columns_from_a_dict_or_a_list_of_rows() -> None:
    top = Aggregator(
        lambda: [],
        lambda acc, row: sorted([*acc, row["v"]], reverse=True)[:2],
        lambda acc: [{"rank": i + 1, "v": v} for i, v in enumerate(acc)],
    )
    mem = Memory(tumbling_window("t", "k", 10, top, output="rank int, v long"))
    assert mem.epoch(
        _rows(("a", 1), v=3) + _rows(("a", 2), v=8) + _rows(("a", 3), v=5), None, 9
    ) == [
        {"key": "a", "window_start": 0, "window_end": 10, "rank": 1, "v": 8},
        {"key": "a", "window_start": 0, "window_end": 10, "rank": 2, "v": 5},
    ]
    pair = Aggregator(
        lambda: [0, 0], lambda a, r: [a[0] + 1, a[1] + r["v"]], lambda a: {"n": a[0], "total": a[1]}
    )
    mem = Memory(tumbling_window("t", "k", 10, pair, output="n long, total long"))
    assert mem.epoch(_rows((7, 1), v=3), None, 9) == [
        {"key": "7", "window_start": 0, "window_end": 10, "n": 1, "total": 3}
    ]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: session_window("s", "k", 10, Aggregator(lambda: 0, lambda a, r: a + 1), output="n long"),
         "config field \"aggregator of session window 's'\" = 'merge=None' is invalid: an Aggregator with a merge"),
        (lambda: sliding_window("s", "k", 10, 20, count_rows()),
         "config field 'slide_ms' = 20 is invalid: milliseconds in 1..size_ms (10)"),
        (lambda: tumbling_window("t", "k", 0, count_rows()),
         "config field 'size_ms' = 0 is invalid: an integer number of milliseconds >= 1"),
        (lambda: tumbling_window("t", "k", 10, count_rows(output="window_end long")),
         "config field \"output of window operator 't'\" = 'window_end long' is invalid: Spark DDL of the result's columns, e.g. 'total long', other than key, window_start, window_end"),
        (lambda: tumbling_window("t", "k", 10, Aggregator(lambda: 0, lambda a, r: a + 1)),
         "config field \"output of window operator 't'\" = None is invalid: Spark DDL of the result, e.g. 'n long'"),
        (lambda: tumbling_window("t", "k", 10, count_rows(), allowed_lateness_ms=-1),
         "config field 'allowed_lateness_ms' = -1 is invalid: an integer number of milliseconds >= 0"),
        (lambda: tumbling_window("t", "k", 10, count_rows(), late="keep"),
         "config field 'late' = 'keep' is invalid: one of drop, side_output"),
    ],
)  # fmt: skip
def test_bad_configuration_is_refused_with_the_field_the_value_and_the_fix(build, message) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    assert str(err.value) == message


def test_rows_without_event_time_are_refused() -> None:
    mem = Memory(tumbling_window("t", "k", 10, count_rows()))
    with pytest.raises(ConfigError) as err:
        mem.epoch([{"k": "a", "ts": None}], None, None)
    assert str(err.value) == (
        "config field \"event time 'ts' of a row of window operator 't'\" = None is invalid: "
        "a non-null epoch-ms long or timestamp in every row"
    )


def test_a_timestamp_event_column_is_read_as_epoch_milliseconds() -> None:
    mem = Memory(tumbling_window("t", "k", 1_000, count_rows()))
    at = dt.datetime(2026, 1, 1, 0, 0, 1, 500_000, tzinfo=dt.UTC)  # 1 767 225 601 500 ms
    assert _out(mem.epoch([{"k": "a", "ts": at}], None, 1_767_225_601_999)) == [
        ("a", 1_767_225_601_000, 1_767_225_602_000, 1)
    ]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (
            lambda: tumbling_window("w", "k", 10_000, count_rows()),
            [(0, 10_000, 2), (10_000, 20_000, 1), (20_000, 30_000, 1)],
        ),
        (
            lambda: sliding_window("w", "k", 10_000, 5_000, count_rows()),
            [(-5_000, 5_000, 2), (0, 10_000, 2), (5_000, 15_000, 1), (10_000, 20_000, 1),
             (20_000, 30_000, 1), (25_000, 35_000, 1)],
        ),
        (
            lambda: session_window("w", "k", 10_000, count_rows()),
            [(1_000, 22_000, 3), (27_000, 37_000, 1)],
        ),
    ],
    ids=["tumbling", "sliding", "session"],
)  # fmt: skip
def test_the_worked_example_of_the_docs(build, expected) -> None:
    """docs/engine.md, "Windows": the same rows and the same windows as its table."""
    memory = Memory(build())
    rows = [{"k": "a", "ts": ts} for ts in (1_000, 4_000, 12_000, 27_000)]
    out = memory.epoch(rows, None, 100_000)
    assert sorted((r["window_start"], r["window_end"], r["count"]) for r in out) == expected
    assert {r["key"] for r in out} == {"a"}
