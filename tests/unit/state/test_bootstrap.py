"""Bootstrapping a savepoint from a table: the files a compacting subtask would write, the
other operators' state carried, the offsets chosen, and bad input refused writing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from microcheckpoint.errors import ConfigError, InvalidValue
from microcheckpoint.protocol.savepoints import read_savepoint
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.bootstrap import bootstrap_savepoint, read_state_table
from microcheckpoint.state.chains import key_group_chains
from microcheckpoint.state.files import FileCache, read_rows
from microcheckpoint.state.keygroups import key_group_for, key_group_range
from microcheckpoint.state.reader import keyed_state_of
from microcheckpoint.state.subtask import SubtaskState
from tests.unit.conftest import PIPELINE, TP0, TP1, Harness

STATES = {canonical_key(k): v for k, v in [("a", 1), ("b", 2), ([1, "x"], {"n": 3}), (7, 4.5)]}


def point(h: Harness, url: str):
    return read_savepoint(h.store, url.removeprefix(h.store.url + "/"))


def table(tmp_path: Path, keys: list, states: list) -> str:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"key": keys, "state": states}), path)
    return str(path)


def test_a_first_bootstrap_holds_the_state_in_key_groups_and_no_offsets(h: Harness) -> None:
    done = bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, parallelism=3, now_ms=5)
    saved = point(h, done.url)
    meta = saved.metadata
    assert (meta.kind, meta.relative, meta.offsets, done.carried_from) == (
        "savepoint",
        True,
        {},
        None,
    )
    assert sorted(str(t) for t in meta.acks) == ["agg#0", "agg#1", "agg#2"]
    assert keyed_state_of(h.store, meta, "agg", prefix=saved.prefix) == {
        "a": 1,
        "b": 2,
        (1, "x"): {"n": 3},
        7: 4.5,
    }
    # Each subtask's file holds only its own key groups, each key in the engine's group.
    for task, ack in meta.acks.items():
        owned = key_group_range(128, 3, task.subtask)
        for handle in ack.handles:
            rows = read_rows(h.store, handle.__class__(saved.prefix + handle.key, handle.size))
            assert set(handle.key_groups) <= set(owned)
            for kg, key, updated in zip(
                *rows.select(["kg", "key", "updated_ms"]).to_pydict().values(), strict=True
            ):
                assert kg == key_group_for(key.encode(), 128) and updated == 5


def test_a_subtask_of_another_parallelism_restores_the_imported_values(h: Harness) -> None:
    done = bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, parallelism=3, now_ms=5)
    saved = point(h, done.url)
    chains = key_group_chains(
        handle.__class__(saved.prefix + handle.key, handle.size, handle.key_groups)
        for handle in saved.metadata.handles
    )
    seen = {}
    for subtask in range(2):
        owned = key_group_range(128, 2, subtask)
        state = SubtaskState(
            h.store,
            uid="agg",
            owned=owned,
            chains=chains,
            backend="table",
            prefix=f"{PIPELINE}/chk-0000000001/state/agg/{subtask:05d}-a00002/",
            now_ms=10,
            cache=FileCache(1 << 20),
        )
        wanted = {}
        for ck in STATES:
            kg = key_group_for(ck.encode(), 128)
            if kg in owned:
                wanted.setdefault(kg, []).append(ck)
        seen.update({ck: value for ck, (value, _) in state.previous(wanted).items()})
    assert seen == STATES


def test_with_a_checkpoint_other_operators_and_offsets_are_carried(h: Harness) -> None:
    coord = h.coordinator()
    h.epoch(coord, {TP0: 4, TP1: 6})
    done = bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, parallelism=2)
    meta = point(h, done.url).metadata
    assert (done.carried_from.value, done.carried_uids, done.offsets) == (
        1,
        ("source",),
        "those of checkpoint 1",
    )
    assert meta.offsets == {TP0: 4, TP1: 6}
    source = meta.acks[next(t for t in meta.acks if t.uid.value == "source")]
    copied = h.store.get(point(h, done.url).prefix + source.handles[0].key)
    assert copied is not None and copied.data == b"source#0@1"
    given = bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, offsets="events:1=2")
    assert point(h, given.url).metadata.offsets == {TP1: 2}
    startup = bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, offsets="startup")
    assert point(h, startup.url).metadata.offsets == {}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"uid": "nope"},
            ConfigError,
            "a keyed operator uid of 'pipe' (checkpoint 1): ['agg', 'source']",
        ),
        ({"parallelism": 0}, ConfigError, "an integer from 1 to max_parallelism (128)"),
        ({"max_parallelism": 64}, ConfigError, "the pipeline's max_parallelism 128 (checkpoint 1)"),
        ({"offsets": "events:0"}, ConfigError, "TOPIC:PARTITION=OFFSET pairs"),
        ({"offsets": "other:0=1"}, ConfigError, "not ['other:0']"),
        ({"uid": "a b"}, InvalidValue, "operator uid 'a b' must be"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(h: Harness, options, error, message) -> None:
    h.epoch(h.coordinator(), {TP0: 4})
    before = h.contents()
    uid = options.pop("uid", "agg")
    with pytest.raises(error) as caught:
        bootstrap_savepoint(h.store, PIPELINE, uid, STATES, **options)
    assert message in str(caught.value)
    assert h.contents() == before


def test_checkpoint_offsets_need_a_checkpoint(h: Harness) -> None:
    with pytest.raises(ConfigError, match=r"pipeline 'pipe' in .* has no completed checkpoint"):
        bootstrap_savepoint(h.store, PIPELINE, "agg", STATES, offsets="checkpoint")
    assert h.keys() == []


def test_the_table_is_read_by_canonical_key(tmp_path: Path) -> None:
    path = table(tmp_path, ['"to"', "[1, 2]", '{"b": 1, "a": 2}'], ["3", '{"x": [1]}', "null"])
    with pytest.raises(InvalidValue, match=r"row 3 of .*: key \{\"b\": 1, \"a\": 2\} has no state"):
        read_state_table(path)
    path = table(tmp_path, ['"to"', "[1, 2]"], ["3", '{"x": [1]}'])
    assert read_state_table(path) == {'"to"': 3, "[1,2]": {"x": [1]}}
    path = table(tmp_path, ['"to"', ' "to"'], ["3", "4"])
    with pytest.raises(InvalidValue, match=r'rows 1 and 2 of .* hold the same key "to"; keep one'):
        read_state_table(path)
    path = table(tmp_path, ['"to"'], ["{"])
    with pytest.raises(InvalidValue, match=r"row 1 of .*: state '\{' of key \"to\" is not JSON"):
        read_state_table(path)


def test_the_table_round_trips_what_state_export_writes(tmp_path: Path) -> None:
    keys = sorted(["to", "naïve", "be"])
    # ``state export`` writes keys with json.dumps' defaults: "na\u00efve", not "naïve".
    path = table(tmp_path, [json.dumps(k, sort_keys=True) for k in keys], ["1", "2", "3"])
    assert read_state_table(path) == {
        canonical_key(k): v for k, v in zip(keys, [1, 2, 3], strict=True)
    }
