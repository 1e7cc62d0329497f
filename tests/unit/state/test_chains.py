"""Key-group file chains: which base and deltas make a key group's state, pure logic."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import CheckpointNotFound, CorruptFile, MetadataFormatError
from microcheckpoint.state.backends import encode_memory, encode_table
from microcheckpoint.state.chains import is_delta, key_group_chains, load_key_group
from microcheckpoint.state.files import (
    DELTA_NAME,
    FileCache,
    encode_rows,
    read_rows,
    rows_from_groups,
)
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore


def base(n: int, *kgs: int) -> StateHandle:
    return StateHandle(f"p/chk-{n:010d}/state/op/00000-a00002/base.parquet", 1, kgs)


def delta(n: int, *kgs: int, subtask: int = 0) -> StateHandle:
    return StateHandle(f"p/chk-{n:010d}/state/op/{subtask:05d}-a00002/{DELTA_NAME}", 1, kgs)


def test_a_chain_is_the_newest_base_then_later_deltas_oldest_first() -> None:
    chains = key_group_chains([delta(3, 0, 1), base(1, 0, 1), delta(2, 0), delta(4, 1)])
    assert chains == {
        0: [base(1, 0, 1), delta(2, 0), delta(3, 0, 1)],
        1: [base(1, 0, 1), delta(3, 0, 1), delta(4, 1)],
    }


def test_a_newer_base_makes_older_deltas_irrelevant_to_its_key_groups_only() -> None:
    handles = [base(1, 0, 1), delta(2, 0, 1), base(3, 0), delta(4, 0)]
    assert key_group_chains(handles) == {
        0: [base(3, 0), delta(4, 0)],
        1: [base(1, 0, 1), delta(2, 0, 1)],
    }


def test_deltas_without_a_base_are_a_chain_of_their_own() -> None:
    assert key_group_chains([delta(3, 5), delta(2, 5)]) == {5: [delta(2, 5), delta(3, 5)]}
    assert key_group_chains([]) == {}


def test_a_file_referenced_twice_after_a_rescale_is_one_link() -> None:
    assert key_group_chains([base(1, 3, 4), base(1, 3, 4), delta(2, 4), delta(2, 4)]) == {
        3: [base(1, 3, 4)],
        4: [base(1, 3, 4), delta(2, 4)],
    }


def test_delta_names() -> None:
    assert is_delta(delta(1, 0).key)
    assert is_delta("p/chk-0000000001/state/op/00000-a00002/delta.json")
    assert not is_delta(base(1, 0).key)


def stored(store, handle: StateHandle, data: bytes) -> StateHandle:
    """``handle``'s file written with ``data``: the handle with its size and content hash,
    as a writer makes it (a read checks both)."""
    store.put(handle.key, data)
    return StateHandle.of(handle.key, data, handle.key_groups)


def files(tmp_path):
    """A format-1 base and delta (stored before content hashes: size only), then a format-2
    delta: the chain reads across formats."""
    store = FileStore(tmp_path.as_uri())
    b = stored(
        store,
        StateHandle("p/chk-0000000001/state/op/00000-a00002/kg-00007.parquet", 1, (7,)),
        encode_table({'"a"': (1, 10), '"b"': (2, 10)}),
    )
    b = StateHandle(b.key, b.size, b.key_groups)  # written before hashes
    d1 = stored(
        store,
        StateHandle("p/chk-0000000002/state/op/00000-a00002/delta.json", 1, (7,)),
        encode_memory("op", {7: {'"a"': (5, 20), '"c"': (3, 20)}}),
    )
    d1 = StateHandle(d1.key, d1.size, d1.key_groups)
    rows = rows_from_groups({7: {'"b"': (None, 30)}, 8: {'"z"': (9, 30)}})
    d2 = stored(store, delta(3, 7), encode_rows(rows))
    return store, [b, d1, d2]


def test_loading_applies_every_delta_in_order_and_tombstones_delete(tmp_path) -> None:
    store, chain = files(tmp_path)
    assert key_group_chains(chain)[7] == chain

    def read(h):
        return read_rows(store, h, None)

    assert load_key_group(chain, 7, read) == {'"a"': (5, 20), '"c"': (3, 20)}
    assert load_key_group(chain[:2], 7, read) == {'"a"': (5, 20), '"b"': (2, 10), '"c"': (3, 20)}
    assert load_key_group(chain[:1], 7, read) == {'"a"': (1, 10), '"b"': (2, 10)}
    assert load_key_group(chain[2:], 8, read) == {'"z"': (9, 30)}


def test_the_file_cache_reads_a_file_once_and_a_missing_one_is_named(tmp_path) -> None:
    store, chain = files(tmp_path)
    cache = FileCache(1 << 20)
    rows = read_rows(store, chain[1], cache)
    store.delete(chain[1].key)
    assert read_rows(store, chain[1], cache) is rows
    with pytest.raises(CheckpointNotFound, match=r"state file file://.*delta\.json is missing"):
        read_rows(store, chain[1], None)


def test_a_corrupt_file_is_named(tmp_path) -> None:
    store = FileStore(tmp_path.as_uri())
    bad = stored(store, delta(1, 0), b"\x00not parquet")  # written so: its hash matches
    with pytest.raises(MetadataFormatError, match=r"state file file://.*delta\.parquet is corrupt"):
        read_rows(store, bad, None)


def test_a_file_changed_after_it_was_written_is_named_before_it_is_decoded(tmp_path) -> None:
    store = FileStore(tmp_path.as_uri())
    data = encode_rows(rows_from_groups({7: {'"b"': (1, 30)}}))
    handle = stored(store, delta(4, 7), data)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    store.put(handle.key, bytes(flipped))
    url = store.child_url(handle.key)
    with pytest.raises(CorruptFile, match=f"state file {url} has sha256 "):
        read_rows(store, handle, None)
    store.put(handle.key, data[:-3])
    with pytest.raises(CorruptFile, match=f"state file {url} is {len(data) - 3} bytes"):
        read_rows(store, handle, None)


def test_rows_are_written_sorted_and_deterministically() -> None:
    import io

    import pyarrow.parquet as pq

    data = encode_rows(rows_from_groups({9: {'"b"': (1, 1), '"a"': (2, 1)}, 2: {'"z"': (3, 1)}}))
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert meta.num_row_groups == 1
    table = pq.read_table(io.BytesIO(data))
    assert table.column("kg").to_pylist() == [2, 9, 9]
    assert table.column("key").to_pylist() == ['"z"', '"a"', '"b"']
    assert (
        encode_rows(rows_from_groups({2: {'"z"': (3, 1)}, 9: {'"a"': (2, 1), '"b"': (1, 1)}}))
        == data
    )
