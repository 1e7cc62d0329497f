"""``storage.each``: independent requests at once, results in order, errors after all."""

from __future__ import annotations

import threading
import time

import pytest

from microcheckpoint.storage import each


def test_results_come_in_the_items_order_and_calls_overlap() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def slow(n: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05 * (5 - n))
        with lock:
            running[0] -= 1
        return n * n

    assert each(slow, range(5)) == [0, 1, 4, 9, 16]
    assert peak[0] > 1


def test_every_call_finishes_before_the_first_error_is_raised() -> None:
    done: list[int] = []

    def call(n: int) -> int:
        if n == 1:
            raise ValueError("one")
        time.sleep(0.05)
        done.append(n)
        return n

    with pytest.raises(ValueError, match="one"):
        each(call, range(4))
    assert sorted(done) == [0, 2, 3]


def test_nothing_and_one_item_run_on_the_calling_thread() -> None:
    assert each(lambda n: threading.current_thread().name, []) == []
    assert each(lambda n: threading.current_thread().name, [1]) == [threading.current_thread().name]
