"""The multi-stage pipeline API: stage sources, union sources, two-input operators."""

from __future__ import annotations

import pytest

from microcheckpoint.engine import KafkaSource, StageSource, UnionSource, co_keyed
from microcheckpoint.errors import ConfigError
from microcheckpoint.sinks.stage import StageSink

A = KafkaSource("a", ["ta"], "json", {"k": "long"})
B = KafkaSource("b", ["tb"], "json", {"k": "long"})


def test_a_stage_source_needs_its_upstream_and_the_columns_it_writes() -> None:
    ok = StageSource("in", ["mid"], "json", {"k": "long"}, upstream="s1", upstream_uid="to-s2")
    assert ok.topics == ("mid",) and ok.upstream == "s1"
    with pytest.raises(ConfigError, match="upstream"):
        StageSource("in", ["mid"], "json", {"k": "long"}, upstream_uid="to-s2")
    with pytest.raises(ConfigError, match="uid"):
        StageSource("in", ["mid"], "json", {"k": "long"}, upstream="s1")
    with pytest.raises(ConfigError, match="schema"):
        StageSource("in", ["mid"], "text", upstream="s1", upstream_uid="to-s2")


def test_a_union_source_reads_distinct_inputs() -> None:
    union = UnionSource("in", [A, B])
    assert union.topics == ("ta", "tb")
    with pytest.raises(ConfigError, match="two or more"):
        UnionSource("in", [A])
    with pytest.raises(ConfigError, match="distinct uids"):
        UnionSource("in", [A, KafkaSource("a", ["tc"])])
    with pytest.raises(ConfigError, match="distinct topics"):
        UnionSource("in", [A, KafkaSource("c", ["ta"])])


def test_a_two_input_operator_splits_rows_by_input() -> None:
    seen = []

    def fn(key, left, right, state):
        seen.append((key, [r["v"] for r in left], [r["v"] for r in right], state))
        return [], (state or 0) + 1

    op = co_keyed("join", "k", fn, "k long", left="a", right="b")
    rows = [{"input": "b", "v": 1}, {"input": "a", "v": 2}, {"input": "b", "v": 3}]
    assert op.fn(7, rows, None) == ([], 1)
    assert seen == [(7, [2], [1, 3], None)]
    with pytest.raises(ConfigError, match="right"):
        co_keyed("join", "k", fn, "k long", left="a", right="a")


def test_a_stage_sink_refuses_bad_partitions_and_keys() -> None:
    with pytest.raises(ConfigError, match="partitions"):
        StageSink("to", "127.0.0.1:1", "mid", key="k", partitions=0)
    with pytest.raises(ConfigError, match="partitions"):
        StageSink("to", "127.0.0.1:1", "mid", key="k", partitions=200, max_parallelism=128)
    with pytest.raises(ConfigError, match="key"):
        StageSink("to", "127.0.0.1:1", "mid", key="")


def test_a_kafka_source_bounds_its_wait_for_the_broker() -> None:
    assert KafkaSource("a", ["ta"]).timeout_s == 60.0
    assert KafkaSource("a", ["ta"], timeout_s=2.5).timeout_s == 2.5
    for bad in (0, -1, True, "5"):
        with pytest.raises(ConfigError, match="timeout_s"):
            KafkaSource("a", ["ta"], timeout_s=bad)
