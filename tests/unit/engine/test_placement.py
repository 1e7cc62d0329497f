"""Placement codes (engine/placement.py); tests/integration/test_placement.py checks them
against Spark's own hash partitioning."""

from __future__ import annotations

import pytest

from microcheckpoint.engine.placement import placement_codes


@pytest.mark.parametrize(
    ("parallelism", "partitions"), [(1, 1), (2, 2), (5, 2), (3, 3), (128, 2), (7, 7), (9, 4)]
)
def test_codes_are_distinct_one_per_subtask(parallelism: int, partitions: int) -> None:
    codes = placement_codes(parallelism, partitions)
    assert len(codes) == parallelism and len(set(codes)) == parallelism


def test_codes_are_the_smallest_ints_in_each_partition() -> None:
    # Spark's hash puts the ints 0, 1 and 3 in partition 1 of 2, and 2, 4 and 5 in
    # partition 0 (read off Spark 4.3's pmod(hash(int), 2)).
    assert placement_codes(2, 2) == [2, 0]
    assert placement_codes(5, 2) == [2, 0, 4, 1, 5]
    assert placement_codes(1, 1) == [0]
