"""``keyed.merge_partition``, ``keyed.process_partition`` and ``sinkstage.stage_partition``:
a partition of the aggregation's shuffle, or of a function's repartition by key, is one
subtask (and one sink part); rows of another subtask, or a partition beyond them, are
refused before anything is read or written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from microcheckpoint.engine.keyed import (
    AGGREGATE,
    OperatorContext,
    PlacementError,
    merge_partition,
    process_partition,
)
from microcheckpoint.engine.routing import KG, SUBTASK
from microcheckpoint.engine.sinkstage import SinkContext, stage_partition
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.records.codec import decode
from microcheckpoint.sinks.files import FileSink
from microcheckpoint.state.keygroups import SCHEME_FIELD, SPARK_HASH, spark_key_group
from microcheckpoint.storage import FileStore


def _ctx(tmp_path: Path) -> OperatorContext:
    return OperatorContext(
        store_url=f"file://{tmp_path}",
        store_options={},
        pipeline="pipe",
        checkpoint_id=1,
        attempt=2,
        uid="counts",
        key="word",
        max_parallelism=128,
        parallelism=2,
        backend="table",
        trigger_time_ms=1_000,
        output_schema=pa.schema([("key", pa.string()), ("total", pa.int64())]),
        aggregate="count",
        key_groups=SPARK_HASH,
    )


def _batch(words: dict[str, int]) -> pa.RecordBatch:
    groups = [spark_key_group(w, 128) for w in words]
    return pa.RecordBatch.from_pydict(
        {
            "word": list(words),
            AGGREGATE: list(words.values()),
            KG: pa.array(groups, pa.int32()),
            SUBTASK: pa.array([g % 2 for g in groups], pa.int32()),
        }
    )


def _split() -> tuple[dict[str, int], dict[str, int]]:
    words = {f"w{i}": i + 1 for i in range(20)}
    mine = {w: n for w, n in words.items() if spark_key_group(w, 128) % 2 == 0}
    return mine, {w: n for w, n in words.items() if w not in mine}


def _ack(tmp_path: Path, subtask: int):  # type: ignore[no-untyped-def]
    key = Layout("pipe").ack(CheckpointId(1), 2, TaskId.of("counts", subtask))
    stored = FileStore(f"file://{tmp_path}").get(key)
    return None if stored is None else decode(Ack, stored.data, key)


def test_a_partition_merges_its_subtask_s_rows_and_acks_naming_the_scheme(tmp_path) -> None:
    mine, _ = _split()
    out = pa.Table.from_batches(list(merge_partition(_ctx(tmp_path), 0, iter([_batch(mine)]))))
    totals = zip(out.column("key").to_pylist(), out.column("total").to_pylist(), strict=True)
    assert dict(totals) == mine
    ack = _ack(tmp_path, 0)
    assert ack.operator_state == {SCHEME_FIELD: SPARK_HASH}
    assert {kg for h in ack.handles for kg in h.key_groups} == {
        spark_key_group(w, 128) for w in mine
    }


def test_an_empty_partition_still_acks_its_subtask(tmp_path) -> None:
    assert list(merge_partition(_ctx(tmp_path), 1, iter([]))) == []
    ack = _ack(tmp_path, 1)
    assert ack.handles == () and ack.operator_state == {SCHEME_FIELD: SPARK_HASH}


@pytest.mark.parametrize("partition", [0, 1, 2])
def test_rows_of_another_subtask_or_a_partition_too_many_write_nothing(
    tmp_path, partition: int
) -> None:
    mine, theirs = _split()
    rows = _batch({**mine, **theirs}) if partition < 2 else _batch({})
    with pytest.raises(PlacementError, match="operator 'counts': Spark partition"):
        list(merge_partition(_ctx(tmp_path), partition, iter([rows])))
    assert list(tmp_path.rglob("*")) == []


def test_a_sink_partition_stages_its_part_and_one_beyond_the_parts_writes_nothing(
    tmp_path,
) -> None:
    ctx = SinkContext(f"file://{tmp_path}/chk", {}, "pipe", 1, 2, "EXACTLY_ONCE")
    sink = FileSink("totals", f"file://{tmp_path}/out")
    batch = pa.RecordBatch.from_pydict({"key": ["a", "b"], "total": [1, 2]})
    out = pa.Table.from_batches(list(stage_partition(ctx, sink, 1, 2, iter([batch]))))
    assert out.to_pylist() == [{"part": 1, "rows": 2}]
    staged = sorted(p.name for p in (tmp_path / "chk").rglob("*") if p.is_file())
    assert staged == ["part-00001-a00002.jsonl", "totals#1.json"]
    with pytest.raises(PlacementError, match="sink 'totals': Spark partition 2 is beyond"):
        list(stage_partition(ctx, sink, 2, 2, iter([batch])))
    assert sorted(p.name for p in (tmp_path / "chk").rglob("*") if p.is_file()) == staged


def _count_rows(key, rows, state):  # type: ignore[no-untyped-def]
    total = (state or 0) + len(rows)
    return [{"key": key, "total": total}], total


def _fn_ctx(tmp_path: Path) -> OperatorContext:
    return replace(_ctx(tmp_path), aggregate=None)


def _rows(words: dict[str, int]) -> pa.RecordBatch:
    """``n`` rows of each word, with the columns a function's rows have."""
    listed = [w for w, n in words.items() for _ in range(n)]
    groups = [spark_key_group(w, 128) for w in listed]
    return pa.RecordBatch.from_pydict(
        {
            "word": listed,
            "offset": list(range(len(listed))),
            KG: pa.array(groups, pa.int32()),
            SUBTASK: pa.array([g % 2 for g in groups], pa.int32()),
        }
    )


def test_a_function_s_partition_runs_its_subtask_and_an_empty_one_acks(tmp_path) -> None:
    mine, _ = _split()
    ctx = _fn_ctx(tmp_path)
    out = pa.Table.from_batches(list(process_partition(ctx, _count_rows, 0, iter([_rows(mine)]))))
    assert (
        dict(zip(out.column("key").to_pylist(), out.column("total").to_pylist(), strict=True))
        == mine
    )
    ack = _ack(tmp_path, 0)
    assert ack.operator_state == {SCHEME_FIELD: SPARK_HASH}
    assert {kg for h in ack.handles for kg in h.key_groups} == {
        spark_key_group(w, 128) for w in mine
    }
    assert list(process_partition(ctx, _count_rows, 1, iter([]))) == []
    assert _ack(tmp_path, 1).handles == ()


@pytest.mark.parametrize("partition", [0, 1, 2])
def test_a_function_s_partition_with_another_subtask_s_rows_writes_nothing(
    tmp_path, partition: int
) -> None:
    mine, theirs = _split()
    rows = _rows({**mine, **theirs}) if partition < 2 else _rows({})
    with pytest.raises(PlacementError, match=r"of the repartition by key|beyond the 2"):
        list(process_partition(_fn_ctx(tmp_path), _count_rows, partition, iter([rows])))
    assert list(tmp_path.rglob("*")) == []
