"""Bulk JSON decoding (``decode_json_columns``) equals per-value decoding, or declines.

Every batch is decoded both ways: when the bulk decoder answers, its rows must be exactly
``decode_value``'s per value; when a value does not decode per value, the bulk decoder
must decline (so the per-value path names the record).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microcheckpoint.adapters.decoding import decode_json_columns, decode_value

SCHEMA = {"key": "string", "seq": "long", "price": "double", "flag": "boolean"}


def per_value(values: list[bytes | None]) -> list[dict[str, Any]] | None:
    """``decode_value`` of each value as rows of the schema's fields; None if one fails
    (``decode_value`` raises ``InvalidValue``, a ``ValueError``, for every bad value)."""
    rows = []
    for value in values:
        try:
            decoded = decode_value(value, "json", SCHEMA)
        except ValueError:
            return None
        rows.append(decoded or dict.fromkeys(SCHEMA))
    return rows


def bulk(values: list[bytes | None]) -> list[dict[str, Any]] | None:
    columns = decode_json_columns(values, SCHEMA)
    if columns is None:
        return None
    lists = {name: column.to_pylist() for name, column in columns.items()}
    return [{name: lists[name][i] for name in SCHEMA} for i in range(len(values))]


def check(values: list[bytes | None]) -> bool:
    """Both ways agree; returns whether the bulk decoder answered."""
    expected, got = per_value(values), bulk(values)
    if expected is None:
        assert got is None, f"bulk decoded what per value refuses: {values!r}"
    elif got is not None:
        assert got == expected, values
    return got is not None


def test_plain_records_decode_in_bulk() -> None:
    values = [
        json.dumps({"key": f"k{i}", "seq": i, "price": i / 3, "flag": i % 2 == 0}).encode()
        for i in range(1000)
    ]
    values[7] = None  # a tombstone: a row of nulls
    values[8] = b'{"key": "\\u00e9t\\u00e9", "extra": {"nested": [1, 2.5, null]}}'
    assert check(values)


@pytest.mark.parametrize(
    "spaced",
    [b' {"key": "a", "seq": 1}', b'{"seq": 2}\t', b'\r{ "flag": true }  ', b" { } ", b"{ }"],
)
def test_objects_with_space_around_them_decode_in_bulk(spaced: bytes) -> None:
    """A value that does not begin with "{" or end with "}" but is one object with JSON
    white space around it still decodes in bulk, beside values that do."""
    for values in ([spaced], [b'{"key": "x"}', spaced, b'{"seq": 3}']):
        assert check(values)


@pytest.mark.parametrize(
    "value",
    [
        b'{"key": "a", "price": NaN}',  # refused by strict JSON
        b'{"key": "a", "other": Infinity}',  # even in a field the schema drops
        b'{"key": "a", "price": 1e400}',  # not finite
        b'{"key": "a", "seq": 1, "seq": 2}',  # the last one counts, per value
        b'{"key": 5}',  # a number for a string field: its JSON text
        b'{"key": {"a": [1, 2]}}',  # an object for a string field
        b'{"seq": 3.0}',  # an integral float for a long
        b'{"seq": "42"}',  # a string holding an integer
        b'{"price": "2.5"}',  # a string holding a number
        b'{"flag": "true"}',  # a string holding a boolean
        b'{"seq": 99999999999999999999}',  # out of the long range
        b'{"key": "a"} {"key": "b"}',  # two objects
        b'{"key": "a",\n"seq": 1}',  # a newline inside
        b"",
        b"   ",
        b"[1, 2]",
        b'"text"',
        b'{"key": "a",}',
        b'{"key": "\xff"}',  # not UTF-8
        b'\xef\xbb\xbf{"key": "a"}',  # a byte order mark
        b'{"key": "\\ud800"}',  # a lone surrogate
        b'{"key": "a\tb"}',  # a control character in a string
        b"null",  # JSON null: not an object (Arrow's reader crashed on it first in a batch)
        b" null ",
        b'{"key": "a", "other": Inf}',  # Arrow's reader takes Inf and -Inf too
        b'{"key": "a", "other": [1, {"x": -Inf}]}',
        b'{"price": -0}',  # an integer zero per value (0.0), a negative zero to Arrow
        b'{"key": "a", "other": ' + b"1" * 5000 + b"}",  # over Python's digit limit
        b'{"key": "a", "other": ' + b"[" * 3000 + b"]" * 3000 + b"}",  # too deep for Python
    ],
)
def test_a_value_bulk_decoding_might_get_wrong_goes_value_by_value(value: bytes) -> None:
    for values in (
        [b'{"key": "x", "seq": 1}', value, b'{"key": "y", "seq": 2}'],
        [value, b'{"key": "y", "seq": 2}'],  # first in its batch
    ):
        assert not check(values)


@pytest.mark.parametrize(("depth", "bulk_taken"), [(499, True), (500, False), (700, False)])
def test_brackets_past_500_go_value_by_value_whatever_the_values_length(
    depth: int, bulk_taken: bool
) -> None:
    """A value of up to 500 opening brackets decodes in bulk; one of more (its own "{"
    counts) goes value by value, with short values beside it or not."""
    deep = b'{"key": "a", "other": ' + b"[" * depth + b"]" * depth + b"}"
    for values in ([deep], [b'{"seq": 1}', deep], [deep, b'{"key": "' + b"x" * 600 + b'"}']):
        assert check(values) is bulk_taken


@pytest.mark.parametrize(
    "values",
    [
        # one object split over two values, and a value of two objects: the count of rows
        # comes out right, the rows would not be their values'
        [b'{"seq": 1,', b'"price": 2} {"seq": 7}', b'{"seq": 9}'],
        [b'{"seq": [{}', b"{}]}", b"{} {}"],
        [b'{"seq": 1} {"seq": 2}', b"{}"],
        [b'{"x": [{}', b"{}]}", b'{"seq": 1} {"seq": 2}'],  # each starts "{" and ends "}"
    ],
)
def test_values_that_do_not_parse_one_by_one_are_never_aligned_by_luck(
    values: list[bytes],
) -> None:
    assert per_value(values) is None
    assert bulk(values) is None


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["42", "-7", "2.5", "1e3", "true", "false", "NaN"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


# Pieces of JSON and of what is nearly JSON, put together at random.
_TOKENS = st.sampled_from(
    ["{", "}", "[", "]", ",", ":", " ", '"key"', '"seq"', '"price"', '"flag"', '"x"', "1",
     "-0", "0.5", "1e400", "null", "true", "NaN", "Inf", "-Inf", '"s"', "\t", "\r"]
)  # fmt: skip


@st.composite
def _record(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["object", "object", "object", "tombstone", "raw", "tokens"]))
    if kind == "tombstone":
        return None
    if kind == "raw":
        return draw(st.binary(max_size=20))
    if kind == "tokens":
        return "".join(draw(st.lists(_TOKENS, max_size=12))).encode()
    fields = draw(st.dictionaries(st.sampled_from([*SCHEMA, "other", "pad"]), _VALUES, max_size=5))
    text = json.dumps(
        fields, allow_nan=True, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    )
    return text.encode()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_record(), min_size=1, max_size=6))
def test_bulk_decoding_equals_per_value_decoding(values: list[bytes | None]) -> None:
    check(values)


def _plain(text: str) -> bool:
    # What decode_json_columns sends value by value wherever it appears (_NOT_IN_BULK).
    return not any(token in text for token in ("NaN", "Inf", "-0"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                # (a string holding "NaN", "Inf" or "-0" goes value by value, rightly)
                "key": st.text(max_size=10).filter(_plain) | st.none(),
                "seq": st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.none(),
                "price": st.floats(allow_nan=False, allow_infinity=False) | st.none(),
                "flag": st.booleans() | st.none(),
                "pad": st.text(max_size=5).filter(_plain),
            },
        ),
        min_size=1,
        max_size=8,
    )
)
def test_well_typed_records_always_decode_in_bulk(rows: list[dict[str, Any]]) -> None:
    values = [json.dumps(row).encode() for row in rows]
    assert check(values), values
