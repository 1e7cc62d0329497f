"""Read a keyed operator's state as of a completed checkpoint or savepoint."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.chains import key_group_chains, load_key_group
from microcheckpoint.state.files import read_rows
from microcheckpoint.storage.port import ObjectStore

__all__ = ["keyed_state_of", "read_keyed_state", "state_dataframe"]


def read_keyed_state(
    store: ObjectStore,
    pipeline: str,
    uid: str,
    checkpoint: CheckpointId | None = None,
    ttl_s: float | None = None,
) -> dict[Any, Any]:
    """``{key: state}`` of operator ``uid`` at ``checkpoint`` (default: the latest completed).

    With ``ttl_s``, entries older than the TTL at that checkpoint's trigger time are left out.
    """
    view = scan(store, Layout(pipeline))
    cid = checkpoint or view.latest_completed
    if cid is None or cid not in view.completed:
        raise CheckpointNotFound(
            f"pipeline {pipeline!r} has no completed checkpoint {cid or ''}; "
            f"completed: {[c.value for c in view.completed]}"
        )
    return keyed_state_of(store, view.metadata(cid), uid, ttl_s)


def keyed_state_of(
    store: ObjectStore,
    meta: CheckpointMetadata,
    uid: str,
    ttl_s: float | None = None,
    prefix: str = "",
) -> dict[Any, Any]:
    """The state of ``uid`` held by the checkpoint or savepoint ``meta`` (``prefix`` for relative handles)."""
    out: dict[Any, Any] = {}
    floor = None if ttl_s is None else meta.trigger_time_ms - int(ttl_s * 1000)
    handles = [
        replace(h, key=(prefix if meta.relative else "") + h.key)
        for task, ack in meta.acks.items()
        if task.uid.value == uid
        for h in ack.handles
    ]
    for kg, chain in sorted(key_group_chains(handles).items()):
        for ck, (value, updated) in load_key_group(
            chain, kg, lambda h: read_rows(store, h)
        ).items():
            if floor is None or updated >= floor:
                out[_hashable(json.loads(ck))] = value
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
    ``state`` (the state value as JSON text), sorted by key.
    """
    rows = [
        (key if isinstance(key, str) else json.dumps(key), json.dumps(value, sort_keys=True))
        for key, value in read_keyed_state(store, pipeline, uid, checkpoint, ttl_s).items()
    ]
    return spark.createDataFrame(sorted(rows), "key string, state string")
