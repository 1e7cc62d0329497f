"""``fewer_gc_passes``: the collector runs less often inside, and as before after."""

from __future__ import annotations

import gc

import pytest

from microcheckpoint.engine.gc_pause import THRESHOLD, fewer_gc_passes


def test_the_first_threshold_is_raised_inside_and_restored_after_even_on_an_error() -> None:
    before = gc.get_threshold()
    with fewer_gc_passes():
        assert gc.get_threshold() == (max(THRESHOLD, before[0]), *before[1:])
        assert gc.isenabled()  # cycles are still collected
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_gc_passes():
        raise RuntimeError("a subtask failed")
    assert gc.get_threshold() == before


def test_cycles_made_inside_are_collected_inside() -> None:
    class Node:
        pass

    with fewer_gc_passes():
        gc.collect()
        counts = gc.get_count()[0]
        for _ in range(3 * THRESHOLD):
            a, b = Node(), Node()
            a.other, b.other = b, a  # a cycle, unreachable at once
        assert gc.get_count()[0] < counts + 3 * THRESHOLD  # passes ran meanwhile
