"""How the engine's Kafka reader cuts a split's records into Arrow batches
(``KafkaSplitReader.read``): at most ``batch_rows`` records and ``batch_bytes`` of values
each, one record at least, every record once and in order, whatever the fetches were.

The fetches are given here (the broker's answer is not what is tested: the reader's real
reads are in ``tests/integration/test_kafka_reader.py``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microcheckpoint.adapters import kafka_reader
from microcheckpoint.adapters.kafka_offsets import TopicPartition
from microcheckpoint.adapters.kafka_reader import Split
from microcheckpoint.engine.sources import KafkaSplitReader


class _Message:
    """What the reader uses of a client's record here: its value and its length."""

    def __init__(self, value: bytes | None) -> None:
        self._value = value

    def value(self) -> bytes | None:
        return self._value

    def __len__(self) -> int:
        return len(self._value or b"")


def _batches(
    monkeypatch: pytest.MonkeyPatch, fetches: list[list[int]], **bounds: int
) -> list[list[int]]:
    """The value sizes of each batch the reader yields from ``fetches`` (value sizes)."""
    lists = [[_Message(b"v" * n if n else None) for n in fetch] for fetch in fetches]

    def fetched(*_: Any, **__: Any) -> Iterator[list[Any]]:
        return iter(lists)

    monkeypatch.setattr(kafka_reader, "read_split_batches", fetched)
    split = Split(TopicPartition("t", 0), 0, sum(map(len, fetches)) or 1)
    reader = KafkaSplitReader("unused:9092", (split,), "bytes", columns=("value",), **bounds)
    return [
        [len(v or b"") for v in batch.column("value").to_pylist()] for batch in reader.read(split)
    ]


def test_records_wait_across_fetches_until_a_batch_is_full(monkeypatch) -> None:
    fetches = [[1_000] * 3, [1_000] * 3, [1_000] * 3]
    assert _batches(monkeypatch, fetches, batch_bytes=4_500) == [[1_000] * 4, [1_000] * 4, [1_000]]
    assert _batches(monkeypatch, fetches, batch_rows=2) == [[1_000] * 2] * 4 + [[1_000]]


def test_a_value_larger_than_the_bound_is_a_batch_of_its_own(monkeypatch) -> None:
    fetches = [[10, 9_000, 10], [0, 9_000]]
    assert _batches(monkeypatch, fetches, batch_bytes=100) == [[10], [9_000], [10, 0], [9_000]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3_000), max_size=12), max_size=6),
    st.integers(1, 9),
    st.integers(1, 6_000),
)
def test_every_batch_is_within_both_bounds_and_nothing_is_lost(
    fetches: list[list[int]], rows: int, size: int
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        batches = _batches(monkeypatch, fetches, batch_rows=rows, batch_bytes=size)
    assert [n for batch in batches for n in batch] == [n for fetch in fetches for n in fetch]
    for batch in batches:
        assert 1 <= len(batch) <= rows
        assert sum(batch) <= size or len(batch) == 1
    # greedy: a batch ends only where the next record would not fit (or at the end)
    for batch, after in itertools.pairwise(batches):
        assert len(batch) == rows or sum(batch) + after[0] > size
