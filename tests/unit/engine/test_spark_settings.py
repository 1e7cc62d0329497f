"""The session settings the engine derives from the master."""

from __future__ import annotations

import os

import pytest

from microcheckpoint.engine.spark import local_cores


@pytest.mark.parametrize(
    ("master", "cores"),
    [
        ("local", 1),
        ("local[2]", 2),
        ("local[8,3]", 8),  # local[N, maxFailures]
        ("local[*]", os.cpu_count()),
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
        ("local[x]", None),
    ],
)
def test_a_local_master_s_cores_are_its_shuffle_partitions(master: str, cores: int | None) -> None:
    assert local_cores(master) == cores
