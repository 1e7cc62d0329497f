"""State evolution (what a restore allows between a point's state descriptors and the
pipeline's) and the offline form of every state kind (export, import, export again)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from microcheckpoint.engine import (
    FileSource,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    running_sum,
)
from microcheckpoint.errors import ConfigError, IncompatibleCheckpoint
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.barrier import Barrier
from microcheckpoint.protocol.records import Ack, CheckpointMetadata
from microcheckpoint.protocol.savepoints import RestorePoint, read_savepoint
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.bootstrap import bootstrap_savepoint, read_state_table
from microcheckpoint.state.evolution import (
    DESCRIPTORS_FIELD,
    Change,
    check_evolution,
    compare,
    pipeline_descriptors,
    recorded_descriptors,
)
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.kinds import (
    LATE_KEY,
    Aggregator,
    StateTtl,
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from microcheckpoint.state.offline import (
    KeyedTable,
    decode_key,
    encode_key,
    read_table_extras,
    table_of,
)
from microcheckpoint.state.reader import keyed_table_of
from microcheckpoint.state.verify import state_rows
from tests.unit.conftest import PIPELINE, TP0, TP1, Harness

AVG = Aggregator(lambda: [0, 0], lambda a, v: [a[0] + v, a[1] + 1], lambda a: a[0] / a[1])
STATES = (
    value_state("count", default=0, type="long"),
    list_state("recent", ttl=StateTtl(60)),
    map_state("seen"),
    reducing_state("top", reduce=max),
    aggregating_state("avg", AVG),
)
V1 = [d.schema() for d in STATES]


def schemas(*descs) -> list[dict]:
    return [d.schema() for d in descs]


def point(recorded: dict[str, list[dict] | None]) -> RestorePoint:
    """A savepoint whose operators record ``recorded`` (None: a plain function's files)."""
    acks = {}
    for uid, descs in recorded.items():
        task = TaskId.of(uid, 0)
        info = {} if descs is None else {DESCRIPTORS_FIELD: descs}
        acks[task] = Ack(task, 1, (StateHandle(f"state/{uid}/00000/base.parquet", 1, (0,)),), info)
    meta = CheckpointMetadata(PIPELINE, CheckpointId(3), 1, Barrier({}), acks, 0, 0)
    return RestorePoint("file:///sp/savepoint-3", meta, None, "sp/")  # type: ignore[arg-type]


def changes(old: list[dict], new: list[dict]) -> list[tuple[str, Change]]:
    return [(c.name, c.change) for c in compare({"cnt": old}, {"cnt": new})]


def test_each_change_is_named() -> None:
    new = schemas(
        value_state("count", default=0, type="string"),  # type
        map_state("recent"),  # kind
        map_state("seen", ttl=StateTtl(5)),  # ttl
        reducing_state("top", reduce=max, fields={"at": 0}),  # fields
        list_state("fresh"),  # added; avg dropped
    )
    assert changes(V1, new) == [
        ("count", Change.TYPE),
        ("recent", Change.KIND),
        ("seen", Change.TTL),
        ("top", Change.FIELDS),
        ("avg", Change.DROPPED),
        ("fresh", Change.ADDED),
    ]
    assert changes(V1, V1) == [(d["name"], Change.KEPT) for d in V1]


def test_a_changed_type_is_refused_in_one_line_naming_operator_state_and_fix() -> None:
    new = schemas(value_state("count", default=0, type="string"), *STATES[1:])
    with pytest.raises(IncompatibleCheckpoint) as caught:
        check_evolution(point({"cnt": V1}), {"cnt": new}, allow_non_restored_state=True)
    assert str(caught.value) == (
        "state 'count' of operator 'cnt' is a value state of long in file:///sp/savepoint-3 "
        "and the pipeline declares a value state of string; keep its type, or declare the new "
        "one under another name (restore with allow_non_restored_state to drop the old one)"
    )


def test_a_dropped_state_needs_allow_non_restored_state() -> None:
    new = schemas(*STATES[:4])
    with pytest.raises(IncompatibleCheckpoint) as caught:
        check_evolution(point({"cnt": V1}), {"cnt": new})
    assert str(caught.value) == (
        "file:///sp/savepoint-3 holds state 'avg' of operator 'cnt' that the pipeline no "
        "longer declares; restore with allow_non_restored_state to leave it unread, or "
        "declare it again"
    )
    dropped = check_evolution(point({"cnt": V1}), {"cnt": new}, allow_non_restored_state=True)
    assert [(c.uid, c.name) for c in dropped] == [("cnt", "avg")]


def test_added_states_fields_and_ttl_pass_and_a_layout_switch_is_refused() -> None:
    new = schemas(
        value_state("count", default=0, type="long", fields={"n": 0}),
        list_state("recent"),
        *STATES[2:],
        value_state("more"),
    )
    assert check_evolution(point({"cnt": V1, "sum": None}), {"cnt": new, "sum": None}) == []
    with pytest.raises(IncompatibleCheckpoint, match=r"^operator 'sum' holds the row of a plain"):
        check_evolution(point({"sum": None}), {"sum": V1})


def test_the_pipeline_declares_its_process_functions_states(tmp_path: Path) -> None:
    class F(KeyedProcessFunction):
        states = STATES

    source = FileSource("files", tmp_path.as_uri())
    pipeline = (
        Pipeline("p", source)
        .then(KeyedProcess("cnt", "k", F(), "k string"))
        .then(running_sum("sum", key="k"))
    )
    assert pipeline_descriptors(pipeline) == {"cnt": V1, "sum": None}
    assert recorded_descriptors(point({"cnt": V1, "sum": None}).metadata) == {
        "cnt": V1,
        "sum": None,
    }


def test_verify_rows_list_the_descriptors_against_the_pipelines() -> None:
    rows = state_rows(point({"cnt": schemas(*STATES[:2])}), {"cnt": schemas(STATES[0])})
    assert [(r.check, r.ok, r.warning, r.detail) for r in rows] == [
        ("state cnt/count", True, False, "value state of long"),
        (
            "state cnt/recent",
            True,
            True,
            "dropped: list state of json, ttl 60000 ms (kept unread): restore with "
            "allow_non_restored_state",
        ),
    ]


STORED = {
    "s": {
        "count": [7, 100],
        "recent": [["a", 101], ["b", 102]],
        "seen": {canonical_key([1, "x"]): [True, 103], canonical_key("k"): [2, 104]},
        "top": [9, 105],
        "avg": [[12, 3], 106],
        "gone": {"any": "shape"},  # a dropped state, kept unread
    }
}


def test_every_kind_decodes_with_its_ttl_timestamps_and_encodes_back() -> None:
    decoded = decode_key(V1, STORED)
    assert decoded == {
        "count": {"value": 7, "ttl_ts": 100},
        "recent": [{"value": "a", "ttl_ts": 101}, {"value": "b", "ttl_ts": 102}],
        "seen": [{"key": "k", "value": 2, "ttl_ts": 104}, {"key": [1, "x"], "value": True, "ttl_ts": 103}],
        "top": {"value": 9, "ttl_ts": 105},
        "avg": {"accumulator": [12, 3], "ttl_ts": 106},
        "gone": {"undeclared": {"any": "shape"}},
    }  # fmt: skip
    assert encode_key(V1, json.loads(json.dumps(decoded)), "row 1") == STORED
    assert encode_key(V1, {}, "row 1") is None


def test_export_import_export_is_exact_with_timers_and_key_group_entries(
    h: Harness, tmp_path: Path
) -> None:
    keys = {canonical_key(k): STORED for k in ("a", 7, [1, 2])}
    timers = {
        canonical_key("a"): [[150, "event"], [160, "processing"]],
        canonical_key("t"): [[9, "event"]],
    }
    groups = {4: {LATE_KEY: 3}}
    first = table_of(KeyedTable("cnt", V1, keys, timers, groups))  # fmt: skip
    assert first.column_names == ["key", "state", "timers"]
    assert first.column("key").to_pylist() == ['"a"', '"t"', "7", "[1, 2]"]
    assert first.column("state").to_pylist()[1] == "{}"  # timers only
    assert json.loads(first.column("timers").to_pylist()[0]) == timers[canonical_key("a")]
    path = tmp_path / "export.parquet"
    pq.write_table(first, path)
    read, descriptors = read_table_extras(str(path), read_state_table(str(path)))
    assert (descriptors, read.keys, read.timers, read.groups) == (V1, keys, timers, groups)
    done = bootstrap_savepoint(
        h.store, PIPELINE, "cnt", read.keys, parallelism=3, timers=read.timers,
        groups=read.groups, descriptors=descriptors,
    )  # fmt: skip
    saved = read_savepoint(h.store, done.url.removeprefix(h.store.url + "/"))
    again = keyed_table_of(h.store, saved.metadata, "cnt", prefix=saved.prefix)
    assert table_of(again) == first
    assert done.keys == 4


def test_a_plain_functions_table_keeps_its_format(tmp_path: Path) -> None:
    table = table_of(KeyedTable("sum", None, {canonical_key("to"): 3}))
    assert (table.column_names, table.to_pylist()) == (
        ["key", "state"],
        [{"key": '"to"', "state": "3"}],
    )
    assert not table.schema.metadata


def test_named_states_go_only_into_a_process_function_and_write_nothing(h: Harness) -> None:
    h.epoch(h.coordinator(), {TP0: 4, TP1: 6})  # "agg" holds a plain function's values
    before = h.contents()
    with pytest.raises(ConfigError) as caught:
        bootstrap_savepoint(h.store, PIPELINE, "agg", {}, descriptors=V1)
    assert str(caught.value) == (
        "config field 'from' = 'a table of named states' is invalid: a table of values, as "
        "`state export` writes for 'agg' (a plain KeyedOperator(fn) in checkpoint 1)"
    )
    assert h.contents() == before
