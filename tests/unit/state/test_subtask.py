"""One subtask's state over epochs: lookups of touched keys, deltas, compaction, TTL, memory."""

from __future__ import annotations

import pytest

from microcheckpoint.errors import StateTooLarge
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.chains import key_group_chains, load_key_group
from microcheckpoint.state.files import FileCache, read_rows
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.reader import keyed_state_of
from microcheckpoint.state.subtask import SubtaskState
from microcheckpoint.storage.file import FileStore

OWNED = range(0, 4)


def ck(key: str) -> str:
    return canonical_key(key)


class Epochs:
    """Runs epochs of one subtask the way the engine does: restore, change, snapshot."""

    def __init__(self, store: FileStore, backend: str = "table", **options) -> None:
        self.store = store
        self.backend = backend
        self.options = options
        self.handles: list[StateHandle] = []
        self.n = 0

    def state(self, now_ms: int | None = None, **extra) -> SubtaskState:
        self.n += 1
        return SubtaskState(
            self.store,
            uid="op",
            owned=OWNED,
            chains=key_group_chains(self.handles),
            backend=self.backend,
            prefix=f"p/chk-{self.n:010d}/state/op/00000-a00002/",
            now_ms=now_ms if now_ms is not None else self.n * 1000,
            cache=FileCache(1 << 20),
            **{**self.options, **extra},
        )

    def run(self, changes: dict[tuple[int, str], int | None], **extra) -> list[StateHandle]:
        state = self.state(**extra)
        for (kg, key), value in changes.items():
            if value is None:
                state.delete(kg, ck(key))
            else:
                state.put(kg, ck(key), value)
        self.handles = state.snapshot()
        return self.handles

    def everything(self) -> dict[tuple[int, str], int]:
        """Every key's state, read back through the chains of the latest snapshot."""
        out = {}
        for kg, chain in key_group_chains(self.handles).items():
            rows = load_key_group(chain, kg, lambda h: read_rows(self.store, h, None))
            out.update({(kg, key): value for key, (value, _) in rows.items()})
        return out


@pytest.fixture
def store(tmp_path) -> FileStore:
    return FileStore(tmp_path.as_uri())


def test_epochs_write_deltas_of_changed_keys_and_reference_the_rest(store) -> None:
    epochs = Epochs(store)
    first = epochs.run({(0, "a"): 1, (1, "b"): 2, (2, "c"): 3})
    assert [h.key.rsplit("/", 1)[1] for h in first] == ["delta.parquet"]
    assert first[0].key_groups == (0, 1, 2)
    second = epochs.run({(1, "b"): 20})
    assert len(second) == 2
    assert second[-1].key_groups == (1,)
    assert second[-1].key.startswith("p/chk-0000000002/")
    assert epochs.everything() == {(0, ck("a")): 1, (1, ck("b")): 20, (2, ck("c")): 3}


def test_previous_reads_only_the_touched_keys(store) -> None:
    epochs = Epochs(store)
    epochs.run({(0, f"k{i}"): i for i in range(50)})
    epochs.run({(0, "k1"): 100})
    state = epochs.state()
    assert state.previous({0: [ck("k1"), ck("k2"), ck("nope")]}) == {
        ck("k1"): (100, 2000),
        ck("k2"): (2, 1000),
    }
    assert state.previous({3: [ck("k1")]}) == {}


@pytest.mark.parametrize(
    "values",
    [
        [0, -1, 7, 2**63 - 1, -(2**63)],  # integers within 64 bits: decoded in Arrow
        [1, 2**64, -(2**70)],  # past 64 bits
        [1, 2.5, -0.0, "7", [1, 2], {"n": 3}, True, None],  # any JSON
    ],
)
def test_previous_gives_back_every_value_as_it_was_put(store, values) -> None:
    epochs = Epochs(store)
    epochs.run({(i % 4, f"k{i}"): v for i, v in enumerate(values)})
    state = epochs.state()
    keys = {kg: [ck(f"k{i}") for i in range(len(values)) if i % 4 == kg] for kg in OWNED}
    got = state.previous(keys)
    by_group = state.previous_by_group(keys)
    stored = [i for i, v in enumerate(values) if v is not None]  # None deletes
    assert {k: v for k, (v, _) in got.items()} == {ck(f"k{i}"): values[i] for i in stored}
    assert [type(got[ck(f"k{i}")][0]) for i in stored] == [type(values[i]) for i in stored]
    assert {k: v for kg in by_group for k, (v, _) in by_group[kg].items()} == {
        k: v for k, (v, _) in got.items()
    }


def test_deletes_are_tombstones_until_compaction_drops_them(store) -> None:
    epochs = Epochs(store, max_deltas=2)
    epochs.run({(0, "a"): 1, (0, "b"): 2})
    epochs.run({(0, "a"): None})
    assert epochs.everything() == {(0, ck("b")): 2}
    handles = epochs.run({(0, "c"): 3})  # the chain holds 2 deltas: this epoch compacts
    assert [h.key.rsplit("/", 1)[1] for h in handles] == ["base.parquet"]
    rows = read_rows(store, handles[0], None)
    assert rows.column("key").to_pylist() == [ck("b"), ck("c")]
    assert epochs.everything() == {(0, ck("b")): 2, (0, ck("c")): 3}


def test_a_full_snapshot_references_nothing_restored(store) -> None:
    epochs = Epochs(store)
    before = epochs.run({(0, "a"): 1, (3, "d"): 4})
    after = epochs.run({(0, "a"): 5}, full_snapshot=True)
    assert {h.key for h in after}.isdisjoint({h.key for h in before})
    assert after[0].key_groups == (0, 3)
    assert epochs.everything() == {(0, ck("a")): 5, (3, ck("d")): 4}


def test_state_older_than_the_ttl_reads_as_absent_and_is_not_compacted(store) -> None:
    epochs = Epochs(store)
    epochs.run({(0, "old"): 1}, now_ms=1_000)
    epochs.run({(0, "new"): 2}, now_ms=9_000)
    state = epochs.state(now_ms=10_000, ttl_ms=5_000)
    assert state.previous({0: [ck("old"), ck("new")]}) == {ck("new"): (2, 9_000)}
    handles = epochs.run({}, now_ms=10_000, ttl_ms=5_000, full_snapshot=True)
    assert read_rows(store, handles[0], None).column("key").to_pylist() == [ck("new")]


def test_the_memory_backend_rewrites_every_owned_key_group(store) -> None:
    epochs = Epochs(store, backend="memory")
    epochs.run({(0, "a"): 1, (2, "c"): 3})
    handles = epochs.run({(2, "c"): 30})
    assert [h.key.rsplit("/", 1)[1] for h in handles] == ["state.json"]
    assert handles[0].key_groups == (0, 2)
    state = epochs.state()
    assert state.previous({0: [ck("a")], 2: [ck("c")]}) == {ck("a"): (1, 1000), ck("c"): (30, 2000)}


def test_the_memory_backend_refuses_state_over_its_limit(store) -> None:
    epochs = Epochs(store, backend="memory")
    with pytest.raises(StateTooLarge, match="operator 'op'"):
        epochs.run({(0, f"k{i}"): "x" * 100 for i in range(60_000)})


def test_the_reader_sees_the_same_state(store) -> None:
    from microcheckpoint.ids import CheckpointId, TaskId
    from microcheckpoint.protocol.barrier import Barrier
    from microcheckpoint.protocol.records import Ack, CheckpointMetadata

    epochs = Epochs(store, max_deltas=1)
    epochs.run({(0, "a"): 1, (1, "b"): 2})
    epochs.run({(0, "a"): 3})
    handles = epochs.run({(1, "b"): None, (2, "c"): 4})
    task = TaskId.of("op", 0)
    meta = CheckpointMetadata(
        "p", CheckpointId(3), 2, Barrier({}), {task: Ack(task, 2, tuple(handles))}, 0, 0
    )
    assert keyed_state_of(store, meta, "op") == {"a": 3, "c": 4}


@pytest.mark.parametrize("backend", ["table", "memory"])
def test_a_compaction_leaves_expired_ttl_entries_out(tmp_path, backend) -> None:
    """``clean`` runs on every key a base (or memory) snapshot rewrites: a key whose state
    all expired leaves the files; a pseudo key is the cleaner's to keep."""

    def clean(key, value):
        if key.startswith("\u0000"):
            return value
        live = [v for v in value if v > 1]
        return live or None

    epochs = Epochs(FileStore(f"file://{tmp_path}"), backend)
    epochs.run({(0, "a"): [1, 2], (1, "b"): [1], (2, "c"): [3]})
    epochs.run({}, full_snapshot=True, clean=clean)
    assert epochs.everything() == {(0, ck("a")): [2], (2, ck("c")): [3]}
