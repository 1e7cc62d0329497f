"""A keyed subtask's rows by key: Arrow's grouping equals the row-by-row one.

``keyed._by_key_in_arrow`` sorts and cuts the rows in Arrow; ``keyed._by_key`` is the
definition (each key's rows in source order: Kafka's topic, partition and offset, a file's
name and row). Both run on the same shuffled tables; the results must be equal, list for
list, and the Arrow one must decline where it cannot be sure (content order, NaN keys).
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microcheckpoint.engine.keyed import _by_key, _by_key_in_arrow
from microcheckpoint.engine.routing import KG, SUBTASK


def _table(columns: dict[str, Any], keys: list[Any]) -> pa.Table:
    n = len(keys)
    kgs = [hash(str(k)) % 128 for k in keys]  # any function of the key
    return pa.table(
        {**columns, KG: pa.array(kgs, pa.int32()), SUBTASK: pa.array([0] * n, pa.int32())}
    )


def kafka_rows(seed: int, n: int, key_kind: str) -> pa.Table:
    rng = random.Random(seed)
    positions = [(rng.choice("ab"), rng.randrange(3), i) for i in range(n)]
    rng.shuffle(positions)  # rows arrive in any order
    if key_kind == "str":
        keys: list[Any] = [rng.choice(["a", "b", "é", "", None, 'x"y']) for _ in range(n)]
    else:
        keys = [rng.choice([1, 2, -3, None, 2**40]) for _ in range(n)]
    columns = {
        "topic": [t for t, _, _ in positions],
        "partition": pa.array([p for _, p, _ in positions], pa.int32()),
        "offset": pa.array([o for _, _, o in positions], pa.int64()),
        "key": keys,
        "value": [rng.random() for _ in range(n)],
    }
    return _table(columns, keys)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 300), st.sampled_from(["str", "int"]))
def test_kafka_rows_group_the_same_way(seed: int, n: int, key_kind: str) -> None:
    rows = kafka_rows(seed, n, key_kind)
    assert _by_key_in_arrow(rows, "key") == _by_key(rows, "key")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 300))
def test_file_rows_group_the_same_way(seed: int, n: int) -> None:
    rng = random.Random(seed)
    positions = [(f"part-{rng.randrange(3):05d}.parquet", i) for i in range(n)]
    rng.shuffle(positions)
    keys = [f"k{rng.randrange(20)}" for _ in range(n)]
    rows = _table(
        {
            "key": keys,
            "seq": pa.array(range(n), pa.int64()),
            "source_file": [f for f, _ in positions],
            "source_row": pa.array([r for _, r in positions], pa.int64()),
        },
        keys,
    )
    grouped = _by_key_in_arrow(rows, "key")
    assert grouped == _by_key(rows, "key")
    by_key, _ = grouped
    for records in by_key.values():  # source order, not arrival order
        positions_seen = [(r["source_file"], r["source_row"]) for r in records]
        assert positions_seen == sorted(positions_seen)


def test_rows_without_a_source_position_go_row_by_row() -> None:
    rows = _table({"key": ["a", "b", "a"], "value": [3, 1, 2]}, ["a", "b", "a"])
    assert _by_key_in_arrow(rows, "key") is None
    by_key, _ = _by_key(rows, "key")
    assert [r["value"] for r in by_key['"a"']] == [2, 3]  # by content


def test_nan_keys_go_row_by_row() -> None:
    nan = float("nan")
    keys = [nan, 1.0, nan]
    rows = _table(
        {"key": pa.array(keys, pa.float64()), "partition": pa.array([0, 0, 0], pa.int32()),
         "offset": pa.array([2, 1, 0], pa.int64())},
        keys,
    )  # fmt: skip
    grouped = _by_key_in_arrow(rows, "key")
    # (NaN is not equal to itself: compare the texts)
    assert grouped is None or repr(grouped) == repr(_by_key(rows, "key"))


@pytest.mark.parametrize("n", [0])
def test_no_rows(n: int) -> None:
    rows = kafka_rows(1, n, "str")
    assert _by_key_in_arrow(rows, "key") == ({}, {}) == _by_key(rows, "key")


def test_position_columns_of_other_types_or_with_nulls_go_row_by_row() -> None:
    # A JSON field named like a record column replaces it: an integer "topic" sorts as
    # text row by row ("10" < "9"), so Arrow's numeric order is not taken.
    keys = ["a", "a", "b"]
    integer_topic = _table(
        {"topic": pa.array([10, 9, 9], pa.int64()), "partition": pa.array([0, 0, 0], pa.int32()),
         "offset": pa.array([0, 1, 2], pa.int64()), "key": keys},
        keys,
    )  # fmt: skip
    assert _by_key_in_arrow(integer_topic, "key") is None
    by_key, _ = _by_key(integer_topic, "key")
    assert [r["topic"] for r in by_key['"a"']] == [10, 9]  # "10" < "9"
    null_topic = _table(
        {"topic": ["x", None, "x"], "partition": pa.array([0, 0, 0], pa.int32()),
         "offset": pa.array([0, 1, 2], pa.int64()), "key": keys},
        keys,
    )  # fmt: skip
    assert _by_key_in_arrow(null_topic, "key") is None
