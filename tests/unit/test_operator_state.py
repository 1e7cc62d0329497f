"""Operator (non-keyed) state: its file format, its redistribution on rescale, its API, and
one subtask's restore, process and snapshot against a real file store (no Spark).

The redistribution rule (docs/engine.md, "Operator state"): at the same parallelism each
subtask keeps its own state; at another, list state is concatenated in old-subtask order
and split into contiguous even parts, union-list state goes whole to every subtask, and
broadcast state is old subtask 0's map in every subtask.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from microcheckpoint.engine import (
    KafkaSource,
    PartitionFunction,
    PartitionOperator,
    Pipeline,
    UnionSource,
    broadcast_state,
    operator_list_state,
    union_list_state,
)
from microcheckpoint.engine.operator_subtask import (
    BROADCAST,
    PartitionStageContext,
    process_partition,
)
from microcheckpoint.engine.routing import KG, SUBTASK
from microcheckpoint.errors import (
    ConfigError,
    IncompatibleCheckpoint,
    InvalidValue,
    MetadataFormatError,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.files import rows_of
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.operator_files import (
    OperatorSnapshot,
    decode_snapshot,
    encode_snapshot,
    even_split,
    load_snapshots,
    redistribute,
)
from microcheckpoint.state.verify import FileKind, classify
from microcheckpoint.storage import FileStore


def _snap(subtask: int, parallelism: int, buf: list, seen: list, rules: dict) -> OperatorSnapshot:
    return OperatorSnapshot(
        subtask,
        parallelism,
        {"buf": ("list", buf), "seen": ("union", seen), "rules": ("broadcast", rules)},
    )


def _all(snapshots: list[OperatorSnapshot], parallelism: int) -> list[OperatorSnapshot]:
    """Every new subtask's state, as snapshots of the new parallelism."""
    return [
        OperatorSnapshot(i, parallelism, redistribute(snapshots, parallelism, i))
        for i in range(parallelism)
    ]


def _values(snapshots: list[OperatorSnapshot], name: str) -> list[Any]:
    return [s.states[name][1] for s in snapshots]


# ---- the redistribution ------------------------------------------------------------------


def test_even_split_gives_the_first_remainder_parts_one_more_element() -> None:
    items = list(range(7))
    assert [even_split(items, 3, i) for i in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [even_split(items, 1, 0)] == [items]
    assert [even_split([1, 2], 4, i) for i in range(4)] == [[1], [2], [], []]


def test_rescale_2_to_3_to_1_splits_lists_unions_and_copies_subtask_0s_broadcast() -> None:
    rules = {'"limit"': 5, '"mode"': "strict"}
    two = [
        _snap(0, 2, ["a", "b", "c", "d"], ["s0"], rules),
        _snap(1, 2, ["e", "f", "g"], ["s1", "s1b"], rules),
    ]
    # 2 -> 3: 7 list elements in old-subtask order, parts of 3, 2, 2.
    three = _all(two, 3)
    assert _values(three, "buf") == [["a", "b", "c"], ["d", "e"], ["f", "g"]]
    assert _values(three, "seen") == [["s0", "s1", "s1b"]] * 3
    assert _values(three, "rules") == [rules] * 3
    # Each new subtask changes its own state before the next rescale.
    three[0].states["buf"][1].append("h")
    three[2].states["seen"][1].append("s2")
    # 3 -> 1: everything in one subtask, in old-subtask order; the union of every list.
    one = _all(three, 1)
    assert _values(one, "buf") == [["a", "b", "c", "h", "d", "e", "f", "g"]]
    assert _values(one, "seen") == [["s0", "s1", "s1b"] * 2 + ["s0", "s1", "s1b", "s2"]]
    assert _values(one, "rules") == [rules]
    # 1 -> 3 -> 1 again: the list is the same sequence, element for element.
    assert _values(_all(_all(one, 3), 1), "buf") == _values(one, "buf")


def test_the_same_parallelism_keeps_each_subtasks_own_state() -> None:
    two = [_snap(1, 2, ["e"], ["s1"], {}), _snap(0, 2, ["a", "b"], ["s0"], {'"k"': 1})]
    assert redistribute(two, 2, 0) == two[1].states
    assert redistribute(two, 2, 1) == two[0].states
    assert redistribute([], 3, 2) == {}


def test_a_new_state_in_one_old_subtask_only_is_redistributed_from_it() -> None:
    old = [
        OperatorSnapshot(0, 2, {"buf": ("list", [1, 2, 3])}),
        OperatorSnapshot(1, 2, {}),
    ]
    assert [s.states for s in _all(old, 3)] == [{"buf": ("list", [v])} for v in (1, 2, 3)]


@pytest.mark.parametrize(
    "snapshots",
    [
        [_snap(0, 2, [], [], {})],  # subtask 1 missing
        [_snap(0, 2, [], [], {}), _snap(0, 2, [], [], {})],  # subtask 0 twice
        [_snap(0, 2, [], [], {}), _snap(1, 3, [], [], {})],  # two parallelisms
    ],
)
def test_snapshots_not_one_per_old_subtask_are_refused(snapshots: list) -> None:
    with pytest.raises(IncompatibleCheckpoint, match="restore another checkpoint or savepoint"):
        redistribute(snapshots, 3, 0)


def test_a_state_with_two_kinds_is_refused_naming_it() -> None:
    old = [
        OperatorSnapshot(0, 2, {"x": ("list", [1])}),
        OperatorSnapshot(1, 2, {"x": ("union", [2])}),
    ]
    with pytest.raises(IncompatibleCheckpoint) as info:
        redistribute(old, 1, 0)
    assert str(info.value) == (
        "operator state 'x' is list state in one subtask and union in another: "
        "restore another checkpoint or savepoint"
    )


# ---- the file ----------------------------------------------------------------------------


def test_a_snapshot_encodes_canonically_and_decodes_back() -> None:
    snap = _snap(1, 2, [{"b": 1, "a": 2}], ["x"], {'"k"': [1, 2]})
    data = encode_snapshot(snap)
    assert data == encode_snapshot(_snap(1, 2, [{"a": 2, "b": 1}], ["x"], {'"k"': [1, 2]}))
    assert json.loads(data) == {
        "format": 1,
        "subtask": 1,
        "parallelism": 2,
        "states": {
            "buf": {"kind": "list", "value": [{"a": 2, "b": 1}]},
            "rules": {"kind": "broadcast", "value": {'"k"': [1, 2]}},
            "seen": {"kind": "union", "value": ["x"]},
        },
    }
    assert decode_snapshot(data, "f") == snap


@pytest.mark.parametrize(
    "data, detail",
    [
        (b"{", "is corrupt"),
        (b'{"format": 2, "subtask": 0, "parallelism": 1, "states": {}}', "has format 2"),
        (
            b'{"format": 1, "subtask": 0, "parallelism": 1, "states": {"x": {"kind": "map", '
            b'"value": {}}}}',
            "unknown kind",
        ),
        (
            b'{"format": 1, "subtask": 0, "parallelism": 1, "states": {"x": {"kind": "list", '
            b'"value": {}}}}',
            "wrong type",
        ),
    ],
)
def test_a_corrupt_or_newer_file_is_refused_naming_it(data: bytes, detail: str) -> None:
    with pytest.raises(MetadataFormatError, match=detail) as info:
        decode_snapshot(data, "s3://b/p/chk-1/state/op/00000-a00002/operator.json")
    assert "s3://b/p/chk-1/state/op/00000-a00002/operator.json" in str(info.value)


def test_verify_classifies_and_reads_the_file_as_one_row_per_state() -> None:
    key = "pipe/chk-3/state/buffered/00001-a00002/operator.json"
    data = encode_snapshot(_snap(1, 2, [1, 2], ["u"], {'"r"': 3}))
    handle = StateHandle(key, len(data))
    assert classify(handle, "buffered") is FileKind.STATE
    assert classify(handle, "other") is FileKind.UNKNOWN
    rows = rows_of(data, handle, key)
    assert rows.to_pylist() == [
        {"kg": 1, "key": '["list","buf"]', "state": "[1, 2]", "updated_ms": 0},
        {"kg": 1, "key": '["broadcast","rules"]', "state": '{"\\"r\\"": 3}', "updated_ms": 0},
        {"kg": 1, "key": '["union","seen"]', "state": '["u"]', "updated_ms": 0},
    ]


def test_a_keyed_state_file_is_not_read_as_operator_state(tmp_path) -> None:
    store = FileStore(tmp_path.as_uri())
    handle = StateHandle("p/chk-1/state/op/00000-a00002/delta.parquet", 10, (3,))
    with pytest.raises(MetadataFormatError, match="give the operator a new uid"):
        load_snapshots(store, [handle])


# ---- the API -----------------------------------------------------------------------------


class _Buffer(PartitionFunction):
    states = (operator_list_state("buf"), union_list_state("seen"), broadcast_state("rules"))

    def process_broadcast(self, rows, ctx):
        rules = ctx.broadcast_state("rules")
        for row in rows:
            if row["v"] is None:
                rules.remove(row["name"])
            else:
                rules.put(row["name"], row["v"])

    def process(self, rows, ctx):
        ctx.list_state("buf").add_all(r["v"] for r in rows)
        if ctx.rescaled_from is not None:
            ctx.union_list_state("seen").add(f"from {ctx.rescaled_from}")
        limit = ctx.broadcast_state("rules").get("limit", 0)
        return [{"subtask": ctx.subtask, "size": len(ctx.list_state("buf").get()), "limit": limit}]


def _union(*inputs: str) -> UnionSource:
    return UnionSource("src", [KafkaSource(i, [f"t-{i}"]) for i in inputs])


def test_a_broadcast_state_needs_a_broadcast_input_from_the_union_source() -> None:
    with pytest.raises(ConfigError, match="'broadcast_input' = None is invalid"):
        PartitionOperator("op", _Buffer(), "subtask int")
    op = PartitionOperator("op", _Buffer(), "subtask int", broadcast_input="rules")
    assert Pipeline("p", _union("main", "rules"), [op]).partition_operators == [op]
    with pytest.raises(ConfigError) as info:
        Pipeline("p", _union("main", "other"), [op])
    assert str(info.value) == (
        "config field 'broadcast_input' = 'rules' is invalid: one of the UnionSource's input "
        "uids ['main', 'other']"
    )
    with pytest.raises(ConfigError, match="the pipeline's source is not a UnionSource"):
        Pipeline("p", KafkaSource("src", ["t"]), [op])


def test_operator_uids_count_for_uniqueness_and_expected_tasks() -> None:
    from microcheckpoint.engine.runner import expected_tasks

    op = PartitionOperator("op", _Buffer(), "subtask int", broadcast_input="rules")
    pipeline = Pipeline("p", _union("main", "rules"), [op])
    assert pipeline.uids == ["src", "op"]
    assert [str(t) for t in expected_tasks(pipeline, 2)] == [
        str(t) for t in [*expected_tasks(Pipeline("p", _union("main", "rules")), 2)]
    ] + [str(t) for t in _tasks("op", 2)]
    with pytest.raises(ConfigError, match="'uid' = 'op' is invalid: unique within the pipeline"):
        pipeline.then(PartitionOperator("op", _Buffer(), "a int", broadcast_input="rules"))


def _tasks(uid: str, n: int) -> list:
    from microcheckpoint.ids import TaskId

    return [TaskId.of(uid, i) for i in range(n)]


@pytest.mark.parametrize(
    "states, detail",
    [
        ((operator_list_state("a"), union_list_state("a")), "distinct names"),
        (("a",), "descriptors"),
    ],
)
def test_bad_state_declarations_are_refused(states: tuple, detail: str) -> None:
    fn = type("Fn", (PartitionFunction,), {"states": states})()
    with pytest.raises(ConfigError, match=detail):
        PartitionOperator("op", fn, "a int")
    with pytest.raises(ConfigError, match="an instance of a PartitionFunction subclass"):
        PartitionOperator("op", lambda rows, ctx: rows, "a int")  # type: ignore[arg-type]


# ---- one subtask, against a real file store ----------------------------------------------


def _ctx(tmp_path, parallelism: int, cid: int, restore: tuple = ()) -> PartitionStageContext:
    return PartitionStageContext(
        store_url=tmp_path.as_uri(), store_options={}, pipeline="pipe", checkpoint_id=cid,
        attempt=2, uid="buffered", parallelism=parallelism, trigger_time_ms=0,
        output_schema=pa.schema([("subtask", pa.int32()), ("size", pa.int64()),
                                 ("limit", pa.int64())]),
        declared={"buf": "list", "seen": "union", "rules": "broadcast"}, restore=restore,
    )  # fmt: skip


def _table(subtask: int, main: list[int], rules: list[tuple[str, Any]]) -> pa.Table:
    """What the stage hands a subtask: its main rows, every broadcast row, one marker."""
    rows = [
        {"name": None, "v": v, "offset": i, "partition": 0, "topic": "m", KG: 0,
         SUBTASK: subtask, BROADCAST: False}
        for i, v in enumerate(main)
    ] + [
        {"name": n, "v": v, "offset": i, "partition": 0, "topic": "r", KG: 0,
         SUBTASK: subtask, BROADCAST: True}
        for i, (n, v) in enumerate(rules)
    ] + [{"name": None, "v": None, "offset": None, "partition": None, "topic": None, KG: None,
          SUBTASK: subtask, BROADCAST: None}]  # fmt: skip
    return pa.Table.from_pylist(rows)


def _epoch(tmp_path, cid: int, parallelism: int, main: dict, rules: list, restore: tuple):
    """Run every subtask of one epoch; returns the outputs and the handles it wrote."""
    ctx = _ctx(tmp_path, parallelism, cid, restore)
    out = [
        process_partition(ctx, _Buffer(), i, _table(i, main.get(i, []), rules)).to_pylist()
        for i in range(parallelism)
    ]
    store = FileStore(tmp_path.as_uri())
    prefix = Layout("pipe").chk(CheckpointId(cid)) + "state/"
    keys = sorted(k for k in store.list(prefix) if k.endswith("operator.json"))
    handles = tuple(StateHandle(k, len(store.get(k).data)) for k in keys)
    states = {s.subtask: s.states for _, s in load_snapshots(store, handles)}
    return out, handles, states


def test_a_subtask_restores_processes_and_snapshots_through_a_rescale(tmp_path) -> None:
    # Epoch 1 at parallelism 2: rules first, in every subtask; each buffers its own rows.
    rules = [("limit", 10), ("mode", 1)]
    out, handles, states = _epoch(tmp_path, 1, 2, {0: [1, 2, 3], 1: [4]}, rules, ())
    assert out == [
        [{"subtask": 0, "size": 3, "limit": 10}],
        [{"subtask": 1, "size": 1, "limit": 10}],
    ]
    assert [states[i]["buf"] for i in (0, 1)] == [("list", [1, 2, 3]), ("list", [4])]
    assert states[0]["rules"] == states[1]["rules"] == ("broadcast", {'"limit"': 10, '"mode"': 1})
    # Epoch 2 at parallelism 3: the 4 buffered values are split 2, 1, 1; a rule is removed.
    out, handles, states = _epoch(tmp_path, 2, 3, {2: [5]}, [("mode", None)], handles)
    assert [states[i]["buf"][1] for i in range(3)] == [[1, 2], [3], [4, 5]]
    assert [states[i]["seen"][1] for i in range(3)] == [["from 2"]] * 3
    assert [states[i]["rules"][1] for i in range(3)] == [{'"limit"': 10}] * 3
    assert [o[0]["size"] for o in out] == [2, 1, 2]
    # Epoch 3 at parallelism 1: every value once, in old-subtask order; the union of unions.
    out, _, states = _epoch(tmp_path, 3, 1, {}, [], handles)
    assert states[0]["buf"] == ("list", [1, 2, 3, 4, 5])
    assert states[0]["seen"] == ("union", ["from 2"] * 3 + ["from 3"])
    assert out == [[{"subtask": 0, "size": 5, "limit": 10}]]


def test_broadcast_state_is_read_only_in_process(tmp_path) -> None:
    class Writes(_Buffer):
        def process(self, rows, ctx):
            ctx.broadcast_state("rules").put("limit", 1)

    with pytest.raises(InvalidValue) as info:
        process_partition(_ctx(tmp_path, 1, 1), Writes(), 0, _table(0, [1], []))
    assert str(info.value) == (
        "broadcast state 'rules' is read-only in process(); write it in process_broadcast(), "
        "which every subtask runs on the same rows"
    )


def test_an_undeclared_state_name_and_a_dropped_state_are_refused(tmp_path) -> None:
    class Typo(_Buffer):
        def process(self, rows, ctx):
            ctx.list_state("bufer")

    with pytest.raises(ConfigError, match=r"'bufer' is invalid: a name the function declares"):
        process_partition(_ctx(tmp_path, 1, 1), Typo(), 0, _table(0, [], []))
    _, handles, _ = _epoch(tmp_path, 1, 1, {0: [1]}, [], ())
    ctx = _ctx(tmp_path, 1, 2, handles)
    fewer = PartitionStageContext(
        **{**ctx.__dict__, "declared": {"buf": "list", "rules": "broadcast"}}
    )
    with pytest.raises(IncompatibleCheckpoint) as info:
        process_partition(fewer, _Buffer(), 0, _table(0, [], []))
    assert str(info.value) == (
        "operator 'buffered' restores union state 'seen', but its function drops it: "
        "declare union state 'seen', or give the operator a new uid"
    )


def test_a_state_value_that_is_not_json_is_refused_naming_the_state(tmp_path) -> None:
    class Bad(_Buffer):
        def process(self, rows, ctx):
            ctx.union_list_state("seen").add({1, 2})

    with pytest.raises(InvalidValue, match=r"operator 'buffered' state \['seen'\] holds a value"):
        process_partition(_ctx(tmp_path, 1, 1), Bad(), 0, _table(0, [], []))
