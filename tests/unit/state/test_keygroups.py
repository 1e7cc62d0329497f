from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from microcheckpoint.errors import ConfigError, InvalidValue
from microcheckpoint.state.keygroups import (
    SPARK_HASH,
    key_group_for,
    key_group_range,
    owned_key_groups,
    owner_of,
    spark_hash,
    spark_key_group,
    subtask_for_key_group,
)


@given(max_p=st.integers(1, 512), data=st.data())
def test_ranges_partition_all_key_groups_and_agree_with_lookup(max_p, data):
    p = data.draw(st.integers(1, max_p))
    owned = []
    for subtask in range(p):
        groups = key_group_range(max_p, p, subtask)
        owned.extend(groups)
        for kg in groups:
            assert subtask_for_key_group(max_p, p, kg) == subtask
    assert owned == list(range(max_p))  # each exactly once, in order


def test_key_group_is_stable_across_processes():
    # Golden values: a change here would misplace every key of stored state.
    assert [key_group_for(k, 128) for k in (b"", b"apple", b"user-1", "å".encode())] == [
        52,
        95,
        8,
        46,
    ]
    import subprocess
    import sys

    code = "from microcheckpoint.state.keygroups import key_group_for as f; print(f(b'apple', 128), f(b'user-1', 4096))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert outs == {"95 392"}  # the same in every process, whatever PYTHONHASHSEED


def test_key_groups_spread_keys_evenly():
    counts = [0] * 16
    for i in range(16_000):
        counts[key_group_for(f"key-{i}".encode(), 16)] += 1
    assert min(counts) > 850 and max(counts) < 1150  # expected 1000 each


def test_flink_range_boundaries():
    assert [key_group_range(128, 3, i) for i in range(3)] == [
        range(0, 43),
        range(43, 86),
        range(86, 128),
    ]
    assert [key_group_range(4, 4, i) for i in range(4)] == [range(i, i + 1) for i in range(4)]


def test_parallelism_above_max_parallelism_is_refused():
    with pytest.raises(ConfigError, match=r"parallelism.*max_parallelism \(8\)"):
        key_group_range(8, 9, 0)
    with pytest.raises(ValueError, match="subtask 3 is outside"):
        key_group_range(8, 3, 3)
    with pytest.raises(ValueError, match="key group 8 is outside"):
        subtask_for_key_group(8, 2, 8)


@given(max_p=st.integers(1, 512), data=st.data())
def test_spark_hash_ownership_partitions_all_key_groups_and_agrees_with_owner_of(max_p, data):
    p = data.draw(st.integers(1, max_p))
    owned = sorted(kg for s in range(p) for kg in owned_key_groups(max_p, p, s, SPARK_HASH))
    assert owned == list(range(max_p))  # each exactly once
    for s in range(p):
        for kg in owned_key_groups(max_p, p, s, SPARK_HASH):
            assert owner_of(max_p, p, kg, SPARK_HASH) == s
    for kg in range(max_p):  # blake2b's owner is its contiguous range's
        assert owner_of(max_p, p, kg) == subtask_for_key_group(max_p, p, kg)


@given(exponent=st.integers(0, 7), factor=st.integers(0, 6), h=st.integers(-(2**31), 2**31 - 1))
def test_when_parallelism_divides_max_parallelism_the_subtask_is_spark_s_partition(
    exponent, factor, h
):
    # A shuffle into p partitions sends hash h to pmod(h, p): the owner of its key group.
    p = 2**factor
    max_p = p * 2**exponent
    assert owner_of(max_p, p, h % max_p, SPARK_HASH) == h % p


def test_spark_hash_golden_values():
    # From Spark 4.3's hash(): SELECT hash(''), hash('abc'), ... (a change misplaces state)
    assert [spark_hash(s) for s in ("", "abc", "user-1", "å")] == [
        142593372,
        1322437556,
        -802825514,
        -829783124,
    ]
    assert (spark_hash(5, "long"), spark_hash(5, "int")) == (1607884268, 1023896466)
    assert spark_key_group("abc", 128) == 1322437556 % 128


def test_an_unknown_scheme_is_refused():
    with pytest.raises(InvalidValue, match="key group scheme 'md5' is unknown"):
        owned_key_groups(128, 2, 0, "md5")
