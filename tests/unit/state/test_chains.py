"""Key-group file chains: which base and deltas make a key group's state, pure logic."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.state.backends import encode_memory, encode_table
from microcheckpoint.state.chains import (
    DELTA_SUFFIX,
    cached_reader,
    is_delta,
    key_group_chains,
    load_key_group,
)
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore


def base(n: int, kg: int) -> StateHandle:
    return StateHandle(f"p/chk-{n:010d}/state/op/00000-a00002/kg-{kg:05d}.parquet", 1, (kg,))


def delta(n: int, *kgs: int, subtask: int = 0) -> StateHandle:
    return StateHandle(f"p/chk-{n:010d}/state/op/{subtask:05d}-a00002/{DELTA_SUFFIX}", 1, kgs)


def test_a_chain_is_the_newest_base_then_later_deltas_oldest_first() -> None:
    chains = key_group_chains([delta(3, 0, 1), base(1, 0), delta(2, 0), base(1, 1), delta(4, 1)])
    assert chains == {
        0: [base(1, 0), delta(2, 0), delta(3, 0, 1)],
        1: [base(1, 1), delta(3, 0, 1), delta(4, 1)],
    }


def test_a_newer_base_makes_older_deltas_irrelevant_to_its_key_group_only() -> None:
    handles = [base(1, 0), base(1, 1), delta(2, 0, 1), base(3, 0), delta(4, 0)]
    assert key_group_chains(handles) == {
        0: [base(3, 0), delta(4, 0)],
        1: [base(1, 1), delta(2, 0, 1)],
    }


def test_deltas_without_a_base_start_no_chain() -> None:
    assert key_group_chains([delta(2, 5)]) == {}
    assert key_group_chains([]) == {}


def test_one_file_serving_many_key_groups_is_a_base_for_each() -> None:
    memory = StateHandle("p/chk-0000000001/state/op/00000-a00002/state.json", 9, (3, 4))
    assert key_group_chains([memory]) == {3: [memory], 4: [memory]}


def test_delta_names() -> None:
    assert is_delta(delta(1, 0).key)
    assert not is_delta(base(1, 0).key)


def files(tmp_path):
    store = FileStore(tmp_path.as_uri())
    b = base(1, 7)
    store.put(b.key, encode_table({'"a"': (1, 10), '"b"': (2, 10)}))
    d1 = delta(2, 7)
    store.put(d1.key, encode_memory("op", {7: {'"a"': (5, 20), '"c"': (3, 20)}}))
    d2 = delta(3, 7)
    store.put(d2.key, encode_memory("op", {7: {'"b"': (None, 30)}}))
    return store, [b, d1, d2]


def test_loading_applies_every_delta_in_order_and_tombstones_delete(tmp_path) -> None:
    store, chain = files(tmp_path)
    read = cached_reader(store, {})
    assert load_key_group(chain, 7, read, store.child_url) == {'"a"': (5, 20), '"c"': (3, 20)}
    assert load_key_group(chain[:2], 7, read, store.child_url) == {
        '"a"': (5, 20),
        '"b"': (2, 10),
        '"c"': (3, 20),
    }
    assert load_key_group(chain[:1], 7, read, store.child_url) == {'"a"': (1, 10), '"b"': (2, 10)}


def test_the_cached_reader_reads_a_file_once_and_names_a_missing_one(tmp_path) -> None:
    store, chain = files(tmp_path)
    cache: dict[str, bytes] = {}
    read = cached_reader(store, cache)
    data = read(chain[1].key)
    store.delete(chain[1].key)
    assert read(chain[1].key) == data
    with pytest.raises(
        CheckpointNotFound, match=r"state file file://.*kg-00007.parquet is missing"
    ):
        cached_reader(store, {})(chain[0].key.replace("chk-0000000001", "chk-0000000009"))
