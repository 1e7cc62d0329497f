"""State files as Arrow tables: every format a state handle can point at, read the same way.

Whatever its format, a state file reads as *state rows*: ``kg`` (key group), ``key`` (the
key's canonical JSON), ``state`` (the value as JSON text; null marks a deletion in a delta)
and ``updated_ms``, sorted by ``(kg, key)``.

| file name | format | written by |
|---|---|---|
| ``base.parquet`` | Parquet of state rows | ``table`` backend, when a subtask compacts |
| ``delta.parquet`` | the same, holding only what changed in one epoch | ``table`` backend, every other epoch |
| ``state.json`` | JSON ``{kg: {key: [value, updated_ms]}}`` of one subtask | ``memory`` backend, every epoch |
| ``kg-<n>.parquet`` | Parquet ``(key, state, updated_ms)`` of one key group | ``table`` backend before format 2 (read only) |
| ``delta.json`` | JSON like ``state.json``, a null value marks a deletion | ``table`` backend before format 2 (read only) |
| ``operator.json`` | JSON of one subtask's operator state, a row per state (``state.operator_files``) | ``PartitionOperator``, every epoch |

Files are immutable (their names are unique per attempt), so a process keeps the tables it
read in ``FILES``, a cache bounded by bytes: a warm engine re-reads only new files.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from microcheckpoint.errors import CheckpointNotFound, MetadataFormatError
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore, started

__all__ = [
    "BASE_NAME",
    "DELTA_NAME",
    "FILES",
    "ROWS",
    "FileCache",
    "encode_rows",
    "prefetch",
    "read_parquet",
    "read_rows",
    "rows_from_groups",
    "rows_of",
    "state_json",
]

BASE_NAME = "base.parquet"
DELTA_NAME = "delta.parquet"
ROWS = pa.schema(
    [
        ("kg", pa.int32()),
        ("key", pa.string()),
        ("state", pa.string()),
        ("updated_ms", pa.int64()),
    ]
)
_V1_BASE = re.compile(r"kg-(\d{5})\.parquet$")


# ``json.dumps(value, sort_keys=True)``, with one encoder for every value.
_STATE_JSON = json.JSONEncoder(sort_keys=True)


def state_json(value: Any) -> str:
    """``json.dumps(value, sort_keys=True)``; an int (a count, a sum: the common state) is
    its digits, without the encoder's set-up per call."""
    return repr(value) if type(value) is int else _STATE_JSON.encode(value)


def rows_from_groups(groups: Mapping[int, Mapping[str, tuple[Any, int]]]) -> pa.Table:
    """State rows from ``{kg: {key: (value, updated_ms)}}`` (a None value is a deletion)."""
    kgs, keys, states, updated = [], [], [], []
    for kg in sorted(groups):
        for key in sorted(groups[kg]):
            value, ms = groups[kg][key]
            kgs.append(kg)
            keys.append(key)
            states.append(None if value is None else state_json(value))
            updated.append(ms)
    return pa.table([kgs, keys, states, updated], schema=ROWS)


def encode_rows(rows: pa.Table) -> bytes:
    """Parquet bytes of state rows, sorted by ``(kg, key)``.

    Deterministic: the same rows give the same bytes, so a retried task rewrites its files
    identically. One row group: readers cache whole files and select in Arrow, and a small
    delta stays small.
    """
    rows = rows.cast(ROWS).sort_by([("kg", "ascending"), ("key", "ascending")])
    sink = io.BytesIO()
    pq.write_table(
        rows,
        sink,
        compression="zstd",
        row_group_size=max(rows.num_rows, 1),
        # Small deltas stay small: no Arrow schema copy, statistics or dictionary pages.
        store_schema=False,
        write_statistics=False,
        use_dictionary=False,
    )
    return sink.getvalue()


def read_parquet(source: bytes | str, columns: list[str] | None = None) -> pa.Table:
    """The table of a Parquet file (its bytes, or a local path), read on the calling thread.

    ``pq.read_table`` goes through Arrow's datasets, which start Arrow's C++ thread pools; a
    process that then exits can abort in their teardown with ``terminate called without an
    active exception`` (apache/arrow#34314: 7 of 180 ``state export`` runs on a busy 2-core
    machine). State, sink and imported files are small: threads buy them nothing.
    """
    file = pa.BufferReader(source) if isinstance(source, bytes) else source
    return pq.ParquetFile(file, pre_buffer=False).read(columns=columns, use_threads=False)


def _from_json_groups(data: bytes, source: str) -> pa.Table:
    try:
        body = json.loads(data)
        return rows_from_groups(
            {
                int(kg): {k: (v[0], int(v[1])) for k, v in state.items()}
                for kg, state in body.items()
            }
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise MetadataFormatError(f"state file {source} is corrupt: {exc}") from exc


def rows_of(data: bytes, handle: StateHandle, source: str) -> pa.Table:
    """The state rows of a file's bytes, whatever its format (see the module's table).

    Raises:
        MetadataFormatError: the bytes are not a state file of that format.
    """
    if handle.key.endswith("/operator.json"):  # operator (non-keyed) state
        from microcheckpoint.state.operator_files import operator_rows

        return operator_rows(data, source)
    if handle.key.endswith(".json"):
        return _from_json_groups(data, source)
    try:
        table = read_parquet(data)
    except Exception as exc:  # pyarrow raises many types for a corrupt file
        raise MetadataFormatError(f"state file {source} is corrupt: {exc}") from exc
    if "kg" in table.column_names:
        return table.select(ROWS.names).cast(ROWS)
    # Format 1: one key group per file, named by it.
    match = _V1_BASE.search(handle.key)
    kg = handle.key_groups[0] if handle.key_groups else int(match.group(1)) if match else 0
    try:
        kgs = pa.array([kg] * table.num_rows, pa.int32())
        return pa.table(
            [kgs, table.column("key"), table.column("state"), table.column("updated_ms")],
            schema=ROWS,
        )
    except (KeyError, pa.ArrowInvalid) as exc:
        raise MetadataFormatError(f"state file {source} is corrupt: {exc}") from exc


class FileCache:
    """State rows of files already read, by store URL and key; least recently used go first.

    A file is read once at a time: a ``get`` of a file another thread is reading (a
    subtask's ``prefetch``) waits for that read instead of sending its own, and reads it
    itself only if that read failed (so the error it reports is its own).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._reading: dict[tuple[str, str], Future[pa.Table]] = {}

    def get(
        self, store: ObjectStore, handle: StateHandle, load: Callable[[], pa.Table]
    ) -> pa.Table:
        key = (store.url, handle.key)
        waited = False
        while True:
            with self._lock:
                table = self._tables.get(key)
                if table is not None:
                    self._tables.move_to_end(key)
                    return table
                theirs = None if waited else self._reading.get(key)
                if theirs is None:
                    mine: Future[pa.Table] = Future()
                    self._reading.setdefault(key, mine)
                    break
            waited = True
            with contextlib.suppress(Exception):  # their read failed: read it ourselves
                return theirs.result()
        try:
            table = load()
        except BaseException as exc:
            self._done(key, mine)
            mine.set_exception(exc)
            raise
        with self._lock:
            if key not in self._tables:
                self._tables[key] = table
                self._bytes += table.nbytes
            while self._bytes > self.max_bytes and len(self._tables) > 1:
                _, old = self._tables.popitem(last=False)
                self._bytes -= old.nbytes
        self._done(key, mine)
        mine.set_result(table)
        return table

    def _done(self, key: tuple[str, str], read: Future[pa.Table]) -> None:
        with self._lock:
            if self._reading.get(key) is read:
                del self._reading[key]

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._bytes = 0


FILES = FileCache(256 * 1024 * 1024)


def read_rows(store: ObjectStore, handle: StateHandle, cache: FileCache | None = FILES) -> pa.Table:
    """The state rows of ``handle``'s file in ``store`` (through ``cache``).

    Raises:
        CheckpointNotFound: the file is missing.
        MetadataFormatError: the file is corrupt.
    """

    def load() -> pa.Table:
        obj = store.get(handle.key)
        url = store.child_url(handle.key)
        if obj is None:
            raise CheckpointNotFound(f"state file {url} is missing")
        return rows_of(handle.check(obj.data, url), handle, url)

    return load() if cache is None else cache.get(store, handle, load)


def prefetch(
    store: ObjectStore, handles: Iterable[StateHandle], cache: FileCache = FILES
) -> list[Future[pa.Table]]:
    """Begin reading the files of ``handles`` into ``cache``, at once, on the storage pool
    (``storage.started``): a subtask sends them as it starts, while its rows still arrive,
    so no state read waits after them. A file already cached costs nothing; a read that
    fails is left for the subtask's own (``FileCache.get`` reads it again and reports it).
    """

    def read(handle: StateHandle) -> pa.Table | None:
        with contextlib.suppress(Exception):
            return read_rows(store, handle, cache)
        return None

    return [started(partial(read, h)) for h in {h.key: h for h in handles}.values()]


def select(
    rows: pa.Table, kgs: Iterable[int], keys: Iterable[str] | pa.Array | None = None
) -> pa.Table:
    """The rows of key groups ``kgs`` (and of ``keys``, when given: an Arrow string array
    is taken as it is), in Arrow."""
    mask = pc.is_in(rows.column("kg"), value_set=pa.array(sorted(set(kgs)), pa.int32()))
    if keys is not None:
        wanted = keys if isinstance(keys, pa.Array) else pa.array(sorted(set(keys)), pa.string())
        mask = pc.and_(mask, pc.is_in(rows.column("key"), value_set=wanted))
    return rows.filter(mask)
