"""A keyed subtask begins reading the state files it restores from as it starts, while its
rows still arrive (``keyed._prefetch``, ``state.files.prefetch``): on S3 those GETs overlap
the shuffle's read instead of coming between it and the subtask's writes, so the longest
task of an epoch's critical path is two round trips (its state file, then its ack), not
three. A local store (``remote`` False) is read when the rows are there, as before.
``FileCache`` reads a file once at a time. Real file stores (one that says it is remote);
no Spark.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest

from microcheckpoint.engine import keyed
from microcheckpoint.engine.keyed import merge_partition, process_partition
from microcheckpoint.state.files import FILES, FileCache
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage import FileStore
from microcheckpoint.storage.port import StoredObject
from tests.unit.engine.test_merge_partition import (
    _ack,
    _batch,
    _count_rows,
    _ctx,
    _fn_ctx,
    _rows,
    _split,
)

PATIENCE = 5.0


class Remote(FileStore):
    """A file store that says its requests are round trips, as S3's are (``remote``)."""

    remote = True


def remote_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyed engine opens its stores as ``Remote``."""
    monkeypatch.setattr(keyed, "open_store", lambda url, **_: Remote(url))


class StateReads:
    """Every GET of a state file (``/state/`` in its key) through any ``FileStore``, and an
    event set when the first one begins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.began = threading.Event()
        self.keys: list[str] = []
        reads = self
        get = FileStore.get

        def watched(store: FileStore, key: str) -> StoredObject | None:
            if "/state/" in key:
                reads.keys.append(key)
                reads.began.set()
            return get(store, key)

        monkeypatch.setattr(FileStore, "get", watched)


def _arriving(batch: pa.RecordBatch, reads: StateReads, waited: list[bool]) -> Iterator:
    """The partition's rows, handed over only once a state read began (or ``PATIENCE``
    passed): ``waited`` records whether one had."""
    waited.append(reads.began.wait(PATIENCE))
    yield batch


def _totals(batches) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out = pa.Table.from_batches(list(batches))
    return dict(zip(out.column("key").to_pylist(), out.column("total").to_pylist(), strict=True))


@pytest.mark.parametrize("kind", ["aggregation", "function"])
def test_a_subtask_reads_its_state_files_before_its_rows_arrive(
    tmp_path, monkeypatch, kind: str
) -> None:
    mine, _ = _split()
    aggregation = kind == "aggregation"
    first = _ctx(tmp_path) if aggregation else _fn_ctx(tmp_path)
    batch = _batch(mine) if aggregation else _rows(mine)

    def run(ctx, rows):  # type: ignore[no-untyped-def]
        if aggregation:
            return merge_partition(ctx, 0, rows)
        return process_partition(ctx, _count_rows, 0, rows)

    assert _totals(run(first, iter([batch]))) == mine
    handles = _ack(tmp_path, 0).handles
    assert handles
    # Checkpoint 2 restores from 1, in a worker that has not cached its files.
    FILES.clear()
    remote_stores(monkeypatch)
    reads = StateReads(monkeypatch)
    waited: list[bool] = []
    second = replace(first, checkpoint_id=2, restore=tuple(handles))
    assert _totals(run(second, _arriving(batch, reads, waited))) == {
        w: 2 * n for w, n in mine.items()
    }
    assert waited == [True]
    # Each file once: the subtask's own read waited for the prefetch's.
    assert sorted(reads.keys) == sorted(h.key for h in handles)


def test_a_subtask_with_nothing_to_restore_reads_nothing(tmp_path, monkeypatch) -> None:
    mine, _ = _split()
    remote_stores(monkeypatch)
    reads = StateReads(monkeypatch)
    assert _totals(merge_partition(_ctx(tmp_path), 0, iter([_batch(mine)]))) == mine
    assert reads.keys == []


def test_on_a_local_store_a_subtask_reads_its_state_once_its_rows_arrived(
    tmp_path, monkeypatch
) -> None:
    mine, _ = _split()
    first = _ctx(tmp_path)
    assert _totals(merge_partition(first, 0, iter([_batch(mine)]))) == mine
    FILES.clear()
    reads = StateReads(monkeypatch)
    before: list[bool] = []

    def arriving():  # type: ignore[no-untyped-def]
        before.append(reads.began.wait(0.5))  # a read begun by now would be a prefetch's
        yield _batch(mine)

    second = replace(first, checkpoint_id=2, restore=tuple(_ack(tmp_path, 0).handles))
    assert _totals(merge_partition(second, 0, arriving())) == {w: 2 * n for w, n in mine.items()}
    assert before == [False] and reads.keys  # read, but only after the rows came


def _handle(key: str) -> StateHandle:
    return StateHandle(key=key, size=1, key_groups=(0,))


def test_a_file_being_read_is_waited_for_not_read_again(tmp_path) -> None:
    cache, store = FileCache(1 << 20), FileStore(f"file://{tmp_path}")
    loading, release = threading.Event(), threading.Event()
    loads: list[str] = []
    table = pa.table({"x": [1]})

    def slow() -> pa.Table:
        loads.append("slow")
        loading.set()
        release.wait(PATIENCE)
        return table

    def again() -> pa.Table:
        loads.append("again")
        return table

    first: list[pa.Table] = []
    reader = threading.Thread(target=lambda: first.append(cache.get(store, _handle("a"), slow)))
    reader.start()
    assert loading.wait(PATIENCE)
    waiter: list[pa.Table] = []
    second = threading.Thread(target=lambda: waiter.append(cache.get(store, _handle("a"), again)))
    second.start()
    release.set()
    reader.join(PATIENCE)
    second.join(PATIENCE)
    assert first == [table] and waiter == [table]
    assert loads == ["slow"]


def test_a_failed_read_is_read_again_by_its_waiter_which_reports_its_own(tmp_path) -> None:
    cache, store = FileCache(1 << 20), FileStore(f"file://{tmp_path}")
    loading, release = threading.Event(), threading.Event()

    def failing() -> pa.Table:
        loading.set()
        release.wait(PATIENCE)
        raise OSError("the prefetch's read failed")

    def missing() -> pa.Table:
        raise FileNotFoundError("state file s3://b/chk-1/state/x is missing")

    errors: list[BaseException] = []

    def read(load) -> None:  # type: ignore[no-untyped-def]
        try:
            cache.get(store, _handle("a"), load)
        except Exception as exc:
            errors.append(exc)

    reader = threading.Thread(target=read, args=(failing,))
    reader.start()
    assert loading.wait(PATIENCE)
    waiter = threading.Thread(target=read, args=(missing,))
    waiter.start()
    release.set()
    reader.join(PATIENCE)
    waiter.join(PATIENCE)
    assert sorted(type(e).__name__ for e in errors) == ["FileNotFoundError", "OSError"]
    # Nothing failed stays behind: the next read loads the file.
    assert cache.get(store, _handle("a"), lambda: pa.table({"x": [2]})).column("x").to_pylist() == [
        2
    ]
