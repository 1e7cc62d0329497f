"""A built-in aggregation's merge in Arrow (``keyed._merged_in_arrow``) against the same merge
key by key (``keyed._merged_in_python``): over chains of epochs, with compactions, the
outputs are equal and every state file is byte for byte the same; inputs Arrow does not take
(keys JSON escapes, a sum past 64 bits) fall back to the key-by-key merge."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from microcheckpoint.engine import keyed
from microcheckpoint.engine.keyed import AGGREGATE, OperatorContext, merge_aggregate
from microcheckpoint.engine.routing import KG, SUBTASK
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.records.codec import decode
from microcheckpoint.state.keygroups import SPARK_HASH, spark_key_group
from microcheckpoint.storage import FileStore

MAX_PARALLELISM = 8
PLAIN = ["a", "b", "k1", "k22", "ü", "€uro", "日本", "x y", "\x7f"]
ESCAPED = ['say "hi"', "back\\slash", "new\nline", "\x01"]


def _ctx(
    root: Path, aggregate: str, cid: int, restore: tuple, ttl_ms: int | None = None
) -> OperatorContext:
    return OperatorContext(
        store_url=f"file://{root}",
        store_options={},
        pipeline="pipe",
        checkpoint_id=cid,
        attempt=1,
        uid="agg",
        key="word",
        max_parallelism=MAX_PARALLELISM,
        parallelism=1,
        backend="table",
        trigger_time_ms=1_000 * cid,
        output_schema=pa.schema([("key", pa.string()), ("total", pa.int64())]),
        ttl_ms=ttl_ms,
        max_deltas=2,  # a compaction every few epochs
        restore=restore,
        aggregate=aggregate,
        key_groups=SPARK_HASH,
    )


def _table(values: dict[str, int]) -> pa.Table:
    groups = [spark_key_group(w, MAX_PARALLELISM) for w in values]
    return pa.table(
        {
            "word": pa.array(list(values), pa.string()),
            AGGREGATE: pa.array(list(values.values()), pa.int64()),
            KG: pa.array(groups, pa.int32()),
            SUBTASK: pa.array([0] * len(values), pa.int32()),
        }
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every state file under ``root`` (acks hold timings, which differ run to run)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "/state/" in str(p)
    }


def _run(
    root: Path,
    aggregate: str,
    epochs: list[dict[str, int]],
    arrow: bool,
    ttl_ms: int | None = None,
) -> tuple:
    """Merge ``epochs`` one after another, each restoring the last; the outputs, the state
    files and how many epochs Arrow merged."""
    real = keyed._merged_in_arrow
    taken = []

    def merged(*args):  # type: ignore[no-untyped-def]
        out = real(*args) if arrow else None
        taken.append(out is not None)
        return out

    keyed._merged_in_arrow = merged
    try:
        restore: tuple = ()
        outputs = []
        for cid, values in enumerate(epochs, start=1):
            ctx = _ctx(root, aggregate, cid, restore, ttl_ms)
            out = merge_aggregate(ctx, 0, _table(values))
            outputs.append(out.to_pylist())
            key = Layout("pipe").ack(CheckpointId(cid), 1, TaskId.of("agg", 0))
            restore = decode(Ack, FileStore(f"file://{root}").get(key).data, key).handles
    finally:
        keyed._merged_in_arrow = real
    return outputs, _files(root), sum(taken)


def _fold(aggregate: str, epochs: list[dict[str, int]]) -> dict[str, int]:
    combine = {"count": int.__add__, "sum": int.__add__, "min": min, "max": max}[aggregate]
    state: dict[str, int] = {}
    for values in epochs:
        for key, value in values.items():
            state[key] = value if key not in state else combine(state[key], value)
    return state


epochs_of = st.lists(
    st.dictionaries(
        st.sampled_from(PLAIN + ESCAPED),
        st.integers(-(2**40), 2**40),
        max_size=len(PLAIN + ESCAPED),
    ),
    min_size=1,
    max_size=7,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(aggregate="min", epochs=[{"a": 0, "b": 5}, {"a": 1, "b": -5}], ttl_ms=None)
@example(aggregate="max", epochs=[{"a": 0, "b": 5}, {"a": 1, "b": -5}], ttl_ms=None)
@example(aggregate="sum", epochs=[{"a": 2, "ü": 1}, {"a": -7}, {"a": 1}], ttl_ms=1_500)
@example(aggregate="count", epochs=[{"a": 3}, {"a": 4, 'say "hi"': 1}], ttl_ms=None)
@given(
    aggregate=st.sampled_from(["count", "sum", "min", "max"]),
    epochs=epochs_of,
    ttl_ms=st.sampled_from([None, 1_500]),
)
def test_arrow_and_key_by_key_merges_write_the_same_state_and_outputs(
    tmp_path_factory, aggregate: str, epochs: list[dict[str, int]], ttl_ms: int | None
) -> None:
    arrow = _run(tmp_path_factory.mktemp("arrow"), aggregate, epochs, True, ttl_ms)
    python = _run(tmp_path_factory.mktemp("python"), aggregate, epochs, False, ttl_ms)

    assert arrow[:2] == python[:2]
    if ttl_ms is None:
        last = {row["key"]: row["total"] for row in arrow[0][-1]}
        assert last == {k: v for k, v in _fold(aggregate, epochs).items() if k in epochs[-1]}


def test_plain_keys_merge_in_arrow_and_escaped_keys_or_a_sum_past_64_bits_do_not(
    tmp_path,
) -> None:
    plain = [{"a": 1, "ü": 2}, {"a": 3, "b": 4}, {"ü": 5}]
    assert _run(tmp_path / "plain", "count", plain, arrow=True)[2] == 3
    escaped = [{"a": 1}, {"a": 2, 'say "hi"': 1}]
    assert _run(tmp_path / "escaped", "sum", escaped, arrow=True)[2] == 1
    big = [{"a": 2**62}, {"a": 2**62}]  # the sum is 2**63: past a long
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        _run(tmp_path / "big", "sum", big, arrow=True)
