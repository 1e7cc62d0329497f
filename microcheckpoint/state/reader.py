"""Read a keyed operator's state as of a completed checkpoint or savepoint, of every kind.

A key group holds, next to the user keys, pseudo keys (``kinds.is_pseudo_key``: a process
function's timers and late count, a source's watermarks) that are not JSON: they are never
returned as keys. ``read_keyed_table`` gives all of it (``offline.KeyedTable``), the form of
``state export``; ``read_keyed_state`` gives ``{key: state}``: a process function's stored
``{"s": {...}}`` object, or with ``decoded=True`` its states decoded per kind
(``offline.decode_key``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.chains import key_group_chains, load_key_group
from microcheckpoint.state.evolution import recorded_descriptors
from microcheckpoint.state.files import read_rows
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.kinds import TIMERS_KEY, is_pseudo_key
from microcheckpoint.state.offline import KeyedTable, decode_key, table_of
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "handle_rows",
    "keyed_state_of",
    "keyed_table_of",
    "read_keyed_state",
    "read_keyed_table",
    "state_dataframe",
]


def _metadata(
    store: ObjectStore, pipeline: str, checkpoint: CheckpointId | None
) -> CheckpointMetadata:
    view = scan(store, Layout(pipeline))
    cid = checkpoint or view.latest_completed
    if cid is None or cid not in view.completed:
        raise CheckpointNotFound(
            f"pipeline {pipeline!r} has no completed checkpoint {cid or ''}; "
            f"completed: {[c.value for c in view.completed]}"
        )
    return view.metadata(cid)


def read_keyed_state(
    store: ObjectStore,
    pipeline: str,
    uid: str,
    checkpoint: CheckpointId | None = None,
    ttl_s: float | None = None,
    decoded: bool = False,
) -> dict[Any, Any]:
    """``{key: state}`` of operator ``uid`` at ``checkpoint`` (default: the latest completed).

    With ``ttl_s``, entries older than the TTL at that checkpoint's trigger time are left out
    (a plain function's row TTL). A process function's state is its stored ``{"s": {...}}``,
    or with ``decoded`` ``{name: decoded}`` (``offline.decode_key``); its timers are in
    ``read_keyed_table``.
    """
    meta = _metadata(store, pipeline, checkpoint)
    return keyed_state_of(store, meta, uid, ttl_s, decoded=decoded)


def read_keyed_table(
    store: ObjectStore, pipeline: str, uid: str, checkpoint: CheckpointId | None = None
) -> KeyedTable:
    """Everything operator ``uid`` holds at ``checkpoint`` (default: the latest completed):
    keys, timers, key-group entries and its recorded descriptors."""
    return keyed_table_of(store, _metadata(store, pipeline, checkpoint), uid)


def _rows(
    store: ObjectStore, meta: CheckpointMetadata, uid: str, prefix: str
) -> list[tuple[int, str, Any, int]]:
    """``(key group, stored key, value, updated ms)`` of every row ``uid`` holds in ``meta``."""
    return handle_rows(
        store,
        [
            replace(h, key=(prefix if meta.relative else "") + h.key)
            for task, ack in meta.acks.items()
            if task.uid.value == uid
            for h in ack.handles
        ],
    )


def handle_rows(
    store: ObjectStore, handles: Iterable[StateHandle]
) -> list[tuple[int, str, Any, int]]:
    """``(key group, stored key, value, updated ms)`` of every row that the state files
    ``handles`` (one keyed operator's, of all its subtasks) hold, by key group."""
    out = []
    for kg, chain in sorted(key_group_chains(handles).items()):
        for ck, (value, updated) in load_key_group(
            chain, kg, lambda h: read_rows(store, h)
        ).items():
            out.append((kg, ck, value, updated))
    return out


def keyed_table_of(
    store: ObjectStore, meta: CheckpointMetadata, uid: str, prefix: str = ""
) -> KeyedTable:
    """The ``KeyedTable`` of ``uid`` in the checkpoint or savepoint ``meta`` (``prefix`` for
    relative handles). Edge case: timers stored for a key with no state give it a row."""
    table = KeyedTable(uid, recorded_descriptors(meta).get(uid))
    for kg, ck, value, _ in _rows(store, meta, uid, prefix):
        if ck == TIMERS_KEY:
            table.timers.update({k: [list(t) for t in ts] for k, ts in value.items()})
        elif is_pseudo_key(ck):
            table.groups.setdefault(kg, {})[ck] = value
        else:
            table.keys[ck] = value
    return table


def keyed_state_of(
    store: ObjectStore,
    meta: CheckpointMetadata,
    uid: str,
    ttl_s: float | None = None,
    prefix: str = "",
    decoded: bool = False,
) -> dict[Any, Any]:
    """The state of ``uid`` held by the checkpoint or savepoint ``meta`` (``prefix`` for
    relative handles); pseudo keys left out, with ``decoded`` a process function's state
    decoded."""
    out: dict[Any, Any] = {}
    floor = None if ttl_s is None else meta.trigger_time_ms - int(ttl_s * 1000)
    descriptors = recorded_descriptors(meta).get(uid) if decoded else None
    for _, ck, value, updated in _rows(store, meta, uid, prefix):
        if is_pseudo_key(ck) or (floor is not None and updated < floor):
            continue
        state = value if descriptors is None else decode_key(descriptors, value)
        out[_hashable(json.loads(ck))] = state
    return out


def _hashable(value: Any) -> Any:
    """Keys as dict keys: lists become tuples and dicts sorted tuples of items."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def state_dataframe(
    spark: Any,
    store: ObjectStore,
    pipeline: str,
    uid: str,
    checkpoint: CheckpointId | None = None,
    ttl_s: float | None = None,
) -> Any:
    """Operator ``uid``'s keyed state at ``checkpoint`` as a Spark DataFrame.

    Columns: ``key`` (the key's canonical JSON, or the string itself for string keys) and
    ``state`` (the state value as JSON text), sorted by key; for a process function (no
    ``ttl_s``: its states carry their own TTL) the columns of ``state export`` (``key``,
    ``state``, ``timers``, module ``state.offline``).
    """
    if ttl_s is None:
        table = read_keyed_table(store, pipeline, uid, checkpoint)
        if table.descriptors is not None:
            return spark.createDataFrame(table_of(table).to_pylist())
    rows = [
        (key if isinstance(key, str) else json.dumps(key), json.dumps(value, sort_keys=True))
        for key, value in read_keyed_state(store, pipeline, uid, checkpoint, ttl_s).items()
    ]
    return spark.createDataFrame(sorted(rows), "key string, state string")
