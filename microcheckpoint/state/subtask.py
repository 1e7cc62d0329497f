"""One keyed operator subtask's state for one epoch: restore what it touches, snapshot, hand back.

Cost follows the work. ``previous`` reads, of every file in the chains of the touched key
groups, only the touched keys (an Arrow filter over cached state rows), so an epoch's Python
work grows with the keys it touches, not with the state. ``snapshot`` writes one delta file
holding only the changed keys; the subtask compacts (rewrites its key groups into one base
file, in Arrow) when a chain grows past ``max_deltas`` or a snapshot must be full.

The ``memory`` backend keeps Flink's heap-backend shape instead: all the subtask's state in
one JSON file, rewritten every epoch and capped at ``MEMORY_LIMIT_BYTES``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.state.backends import encode_memory
from microcheckpoint.state.chains import fold, is_delta, written_at
from microcheckpoint.state.files import (
    BASE_NAME,
    DELTA_NAME,
    FILES,
    ROWS,
    FileCache,
    encode_rows,
    read_rows,
    select,
    state_json,
)
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore

__all__ = ["SubtaskState"]

KeyGroupState = dict[str, tuple[Any, int]]
_DELETED = object()


class SubtaskState:
    """The state of the key groups ``owned`` by one subtask, as of the epoch's base checkpoint.

    Args:
        store: checkpoint storage.
        uid: the operator's uid (named in errors).
        owned: the key groups this subtask owns at the epoch's parallelism.
        chains: per key group, its file chain in the state restored from.
        backend: ``table`` or ``memory``.
        prefix: where this attempt writes its files (unique per attempt).
        now_ms: the epoch's trigger time; every changed key records it.
        ttl_ms: state older than this at ``now_ms`` reads as absent (None: forever).
        full_snapshot: write full snapshots that reference nothing restored.
        max_deltas: compact once a key group's chain holds more deltas than this.
        timer: started at the subtask's barrier; each file upload counts as its async part
            (a fresh one when not given).
        clean: ``clean(key, value) -> value or None``, applied to every key a compaction
            (or a memory snapshot) rewrites: how expired state TTL entries leave the files.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        uid: str,
        owned: Iterable[int],
        chains: Mapping[int, list[StateHandle]],
        backend: str,
        prefix: str,
        now_ms: int,
        ttl_ms: int | None = None,
        full_snapshot: bool = False,
        max_deltas: int = 8,
        cache: FileCache | None = FILES,
        timer: AckTimer | None = None,
        clean: Callable[[str, Any], Any] | None = None,
    ) -> None:
        self.store = store
        self.uid = uid
        self.owned = sorted(set(owned))
        self.chains = {kg: list(chains[kg]) for kg in self.owned if chains.get(kg)}
        self.backend = backend
        self.prefix = prefix
        self.now_ms = now_ms
        self.floor = None if ttl_ms is None else now_ms - ttl_ms
        self.full_snapshot = full_snapshot
        self.max_deltas = max_deltas
        self.cache = cache
        self.changes: dict[int, dict[str, Any]] = {}
        self.changed_rows: pa.Table | None = None  # ``put_rows``: changes already in Arrow
        self.timer = timer or AckTimer()
        self.clean = clean

    # ---- reading ----------------------------------------------------------------------

    def _rows(self, handle: StateHandle) -> pa.Table:
        return read_rows(self.store, handle, self.cache)

    def _live(self, state: KeyGroupState) -> KeyGroupState:
        if self.floor is None:
            return state
        return {k: v for k, v in state.items() if v[1] >= self.floor}

    def previous(self, keys_by_kg: Mapping[int, Iterable[str]]) -> dict[str, tuple[Any, int]]:
        """``(value, updated_ms)`` of the given keys (canonical JSON) before this epoch.

        A key with no state, or state older than the TTL, is left out. Reads only the touched
        keys of the touched key groups' chains, resolves them in Arrow (one filter per file)
        and decodes only each key's newest state.
        """
        chains = {kg: self.chains[kg] for kg in keys_by_kg if self.chains.get(kg)}
        if not chains:
            return {}
        wanted = [key for kg in chains for key in keys_by_kg[kg]]
        rows = self._latest(chains, wanted)
        return {
            key: (value, int(updated))
            for key, value, updated in zip(
                rows.column("key").to_pylist(),
                _values(rows.column("state")),
                rows.column("updated_ms").to_pylist(),
                strict=True,
            )
        }

    def previous_rows(self, kgs: Iterable[int], keys: pa.Array) -> pa.Table:
        """``previous`` in Arrow, for a caller that works in Arrow: the state rows (``kg,
        key, state, updated_ms``; ``state`` is the value's JSON) of ``keys``, canonical JSON
        in a string array, within the key groups ``kgs``, one row per key that has state."""
        chains = {kg: self.chains[kg] for kg in set(kgs) if self.chains.get(kg)}
        if not chains:
            return ROWS.empty_table()
        return self._latest(chains, keys)

    def previous_by_group(
        self, keys_by_kg: Mapping[int, Iterable[str]]
    ) -> dict[int, dict[str, tuple[Any, int]]]:
        """As ``previous``, by key group: for keys every group holds (a process function's
        timers and late count)."""
        chains = {kg: self.chains[kg] for kg in keys_by_kg if self.chains.get(kg)}
        if not chains:
            return {}
        wanted = sorted({key for kg in chains for key in keys_by_kg[kg]})
        rows = self._latest(chains, wanted)
        out: dict[int, dict[str, tuple[Any, int]]] = {}
        for kg, key, value, updated in zip(
            rows.column("kg").to_pylist(),
            rows.column("key").to_pylist(),
            _values(rows.column("state")),
            rows.column("updated_ms").to_pylist(),
            strict=True,
        ):
            out.setdefault(kg, {})[key] = (value, int(updated))
        return out

    # ---- changing ---------------------------------------------------------------------

    def put(self, kg: int, key: str, value: Any) -> None:
        """Set ``key``'s state (``key`` is its canonical JSON)."""
        self.changes.setdefault(kg, {})[key] = value

    def delete(self, kg: int, key: str) -> None:
        """Delete ``key``'s state (a tombstone in the delta)."""
        self.changes.setdefault(kg, {})[key] = _DELETED

    def put_rows(self, rows: pa.Table) -> None:
        """Set the state of many keys at once, in Arrow: ``rows`` as ``put`` would leave
        them (``kg, key, state, updated_ms``: canonical JSON key, the value's JSON as
        ``state_json`` writes it, ``updated_ms`` this epoch's). No key may also be ``put``.
        """
        if rows.num_rows:
            self.changed_rows = rows.cast(ROWS)

    def _changed(self) -> pa.Table | None:
        """This epoch's changes as state rows (None: no change)."""
        parts = []
        if self.changes:
            # Unsorted: every reader of these rows sorts them in Arrow (``encode_rows``).
            kgs: list[int] = []
            keys: list[str] = []
            states: list[str | None] = []
            for kg, changes in self.changes.items():
                kgs += [kg] * len(changes)
                keys += changes
                states += [None if v is _DELETED else state_json(v) for v in changes.values()]
            updated = pa.repeat(pa.scalar(self.now_ms, pa.int64()), len(keys))
            parts.append(pa.table([kgs, keys, states, updated], schema=ROWS))
        if self.changed_rows is not None:
            parts.append(self.changed_rows)
        return pa.concat_tables(parts) if parts else None

    # ---- snapshotting -----------------------------------------------------------------

    def _compacts(self) -> bool:
        return self.full_snapshot or any(
            sum(1 for h in chain if is_delta(h.key)) >= self.max_deltas
            for chain in self.chains.values()
        )

    def snapshot(self) -> list[StateHandle]:
        """Write this epoch's files; the handles of every file the subtask's state is in now.

        ``table``: a delta of the changed keys, referencing the unchanged chains, or, when
        compacting, one base file of all the subtask's live state. ``memory``: one JSON file.
        """
        if self.backend == "memory":
            return self._snapshot_memory()
        if self._compacts():
            return self._snapshot_base()
        handles = [h for chain in self.chains.values() for h in chain]
        changed = self._changed()
        if changed is not None:
            groups = pc.unique(changed.column("kg")).to_pylist()
            handles.append(self._put(DELTA_NAME, encode_rows(changed), groups))
        return list({h.key: h for h in handles}.values())

    def _put(self, name: str, data: bytes, groups: Iterable[int]) -> StateHandle:
        key = self.prefix + name
        with self.timer.uploading():
            self.store.put(key, data)
        return StateHandle.of(key, data, sorted(groups))

    def _all_rows(self) -> pa.Table:
        """Every live state row of the owned key groups, resolved in Arrow (latest wins)."""
        return self._latest(self.chains)

    def _latest(
        self, chains: Mapping[int, list[StateHandle]], keys: Iterable[str] | pa.Array | None = None
    ) -> pa.Table:
        """The newest live row of every key (of ``keys``, when given) in ``chains``."""
        groups: dict[str, list[int]] = {}
        for kg, chain in chains.items():
            for handle in chain:
                groups.setdefault(handle.key, []).append(kg)
        handles = {h.key: h for chain in chains.values() for h in chain}
        # the keys once for every file (``select`` would build them per file)
        wanted = (
            keys
            if keys is None or isinstance(keys, pa.Array)
            else pa.array(sorted(set(keys)), pa.string())
        )
        parts = []
        for seq, key in enumerate(_chain_order(chains)):
            rows = select(self._rows(handles[key]), groups[key], wanted)
            parts.append(rows.append_column("seq", pa.array([seq] * rows.num_rows, pa.int32())))
        if not parts:
            return ROWS.empty_table()
        rows = pa.concat_tables(parts).sort_by(
            [("kg", "ascending"), ("key", "ascending"), ("seq", "ascending")]
        )
        if rows.num_rows:
            kg, key = rows.column("kg"), rows.column("key")
            n = rows.num_rows
            # The last row of each (kg, key) run is the newest.
            last = pc.or_(
                pc.not_equal(kg.slice(0, n - 1), kg.slice(1)),
                pc.not_equal(key.slice(0, n - 1), key.slice(1)),
            )
            rows = rows.filter(pa.concat_arrays([last.combine_chunks(), pa.array([True])]))
        rows = rows.filter(pc.is_valid(rows.column("state")))
        if self.floor is not None:
            rows = rows.filter(pc.greater_equal(rows.column("updated_ms"), self.floor))
        return rows.select(ROWS.names)

    def _snapshot_base(self) -> list[StateHandle]:
        rows = self._all_rows()
        changed = self._changed()
        if changed is not None:
            stale = pc.is_in(
                pc.binary_join_element_wise(
                    rows.column("kg").cast(pa.string()), rows.column("key"), "\x00"
                ),
                value_set=pc.binary_join_element_wise(
                    changed.column("kg").cast(pa.string()), changed.column("key"), "\x00"
                ),
            )
            rows = pa.concat_tables(
                [
                    rows.filter(pc.invert(stale)),
                    changed.filter(pc.is_valid(changed.column("state"))),
                ]
            )
        if self.clean is not None:
            rows = self._cleaned(rows)
        if rows.num_rows == 0:
            return []
        kgs = sorted(set(rows.column("kg").to_pylist()))
        return [self._put(BASE_NAME, encode_rows(rows), kgs)]

    def _cleaned(self, rows: pa.Table) -> pa.Table:
        """``rows`` after ``clean`` (a row whose value cleans to None is left out)."""
        keep, states = [], []
        for key, text in zip(
            rows.column("key").to_pylist(), rows.column("state").to_pylist(), strict=True
        ):
            value = self.clean(key, json.loads(text))  # type: ignore[misc]
            keep.append(value is not None)
            states.append(text if value is None else json.dumps(value, sort_keys=True))
        rows = rows.set_column(2, "state", pa.array(states, pa.string()))
        return rows.filter(pa.array(keep, pa.bool_()))

    def _snapshot_memory(self) -> list[StateHandle]:
        groups: dict[int, KeyGroupState] = {}
        for kg in self.owned:
            chain = self.chains.get(kg)
            state = self._live(fold((self._rows(h) for h in chain), kg)) if chain else {}
            for key, value in self.changes.get(kg, {}).items():
                if value is _DELETED:
                    state.pop(key, None)
                else:
                    state[key] = (value, self.now_ms)
            if self.clean is not None:
                cleaned = {k: (self.clean(k, v), u) for k, (v, u) in state.items()}
                state = {k: vu for k, vu in cleaned.items() if vu[0] is not None}
            if state:
                groups[kg] = state
        data = encode_memory(self.uid, groups)
        return [self._put("state.json", data, groups)]


def _values(states: pa.ChunkedArray) -> list[Any]:
    """The values of state JSON texts (``state_json``'s): all at once in Arrow when every
    one is an integer within 64 bits (a count, an integer sum: the common state), else one
    ``json.loads`` each."""
    try:
        return states.cast(pa.int64()).to_pylist()
    except pa.ArrowInvalid:
        return [json.loads(text) for text in states.to_pylist()]  # other JSON, or past 64 bits


def _chain_order(chains: Mapping[int, list[StateHandle]]) -> list[str]:
    """Every file of ``chains``: bases first, then deltas oldest first. A key group's chain is
    one base and the deltas after it, so this order is every chain's own order."""
    keys = {h.key for chain in chains.values() for h in chain}
    return sorted(keys, key=lambda k: (is_delta(k), *written_at(k)))
