"""Operator (non-keyed) state files and their redistribution on restore.

Every subtask of a ``PartitionOperator`` writes one ``operator.json`` per epoch under its
state prefix (``chk-<n>/state/<uid>/<subtask>-a<attempt>/operator.json``), referenced by
its ack. The file is canonical JSON (sorted keys, so a retried task writes the same bytes)::

    {"format": 1, "subtask": 0, "parallelism": 2,
     "states": {"buffer": {"kind": "list", "value": [1, 2]},
                "seen": {"kind": "union", "value": ["a"]},
                "rules": {"kind": "broadcast", "value": {"\\"x\\"": 10}}}}

A broadcast map is stored ``{canonical JSON of the key: value}``. As state rows
(``state.files.rows_of``, read by ``verify``), a file is one row per state: ``kg`` the
subtask, ``key`` the canonical JSON of ``[kind, name]``, ``state`` the value's JSON,
``updated_ms`` 0.

``redistribute`` gives a subtask its state from every old subtask's snapshot:

- same parallelism: each subtask gets its own lists and map, as written;
- another parallelism: list state is every old subtask's list concatenated in old-subtask
  order and cut into contiguous parts whose sizes differ by at most one, the first
  ``total % parallelism`` parts one longer (Flink's even split); union-list state is the
  whole concatenation, to every subtask; broadcast state is old subtask 0's map (all are
  equal), to every subtask.

Pure Python and Arrow: no Spark or client import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import CheckpointNotFound, IncompatibleCheckpoint, MetadataFormatError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "KINDS",
    "OPERATOR_NAME",
    "OperatorSnapshot",
    "decode_snapshot",
    "encode_snapshot",
    "even_split",
    "load_snapshots",
    "operator_rows",
    "read_operator_state",
    "redistribute",
]

OPERATOR_NAME = "operator.json"
KINDS = ("list", "union", "broadcast")
_FORMAT = 1


@dataclass(frozen=True)
class OperatorSnapshot:
    """One subtask's operator state: ``states`` is ``{name: (kind, value)}``, a list for
    ``list`` and ``union``, ``{canonical key: value}`` for ``broadcast``."""

    subtask: int
    parallelism: int
    states: dict[str, tuple[str, Any]] = field(default_factory=dict)


def encode_snapshot(snapshot: OperatorSnapshot) -> bytes:
    """The file's bytes: canonical JSON, so equal snapshots give equal bytes.

    Raises:
        TypeError: a value is not JSON-serializable (the caller names the state).
    """
    body = {
        "format": _FORMAT,
        "subtask": snapshot.subtask,
        "parallelism": snapshot.parallelism,
        "states": {n: {"kind": k, "value": v} for n, (k, v) in snapshot.states.items()},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_snapshot(data: bytes, source: str) -> OperatorSnapshot:
    """The snapshot in a file's bytes.

    Raises:
        MetadataFormatError: not an operator state file, or of a newer format (``source``,
            the file's URL, is named).
    """
    try:
        body = json.loads(data)
        if body["format"] != _FORMAT:
            raise MetadataFormatError(
                f"operator state file {source} has format {body['format']!r}, this version "
                f"reads {_FORMAT}: upgrade microcheckpoint"
            )
        states = {str(n): (s["kind"], s["value"]) for n, s in body["states"].items()}
        bad = [n for n, (k, v) in states.items() if k not in KINDS or not _fits(k, v)]
        if bad:
            raise ValueError(f"states {bad} have an unknown kind or a value of the wrong type")
        return OperatorSnapshot(int(body["subtask"]), int(body["parallelism"]), states)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise MetadataFormatError(f"operator state file {source} is corrupt: {exc}") from exc


def _fits(kind: str, value: Any) -> bool:
    return isinstance(value, dict) if kind == "broadcast" else isinstance(value, list)


def operator_rows(data: bytes, source: str) -> Any:
    """A file's state rows, an Arrow table (see the module docstring).

    Raises:
        MetadataFormatError: the file is corrupt.
    """
    import pyarrow as pa  # not at import: the pipeline API loads this module

    from microcheckpoint.state.files import ROWS

    snap = decode_snapshot(data, source)
    names = sorted(snap.states)
    return pa.table(
        [
            [snap.subtask] * len(names),
            [json.dumps([snap.states[n][0], n], separators=(",", ":")) for n in names],
            [json.dumps(snap.states[n][1], sort_keys=True) for n in names],
            [0] * len(names),
        ],
        schema=ROWS,
    )


def even_split(items: list[Any], parts: int, index: int) -> list[Any]:
    """Part ``index`` of ``items`` cut into ``parts`` contiguous parts (sizes differ by at
    most one; the first ``len(items) % parts`` are the longer ones). Edge case: with fewer
    items than parts, the last parts are empty."""
    base, extra = divmod(len(items), parts)
    start = index * base + min(index, extra)
    return items[start : start + base + (1 if index < extra else 0)]


def redistribute(
    snapshots: list[OperatorSnapshot], parallelism: int, subtask: int
) -> dict[str, tuple[str, Any]]:
    """The operator state of ``subtask`` of ``parallelism`` restored from ``snapshots``.

    ``snapshots`` are every old subtask's, in any order. Edge cases: no snapshots (a new
    operator) gives ``{}``; the old and new parallelism being equal gives each subtask its
    own snapshot unchanged (the module docstring has the rule for another parallelism).

    Raises:
        IncompatibleCheckpoint: the snapshots are not one of each old subtask, or a state
            name has two kinds.
    """
    if not snapshots:
        return {}
    # Step 1: one snapshot of each old subtask, in subtask order.
    ordered = sorted(snapshots, key=lambda s: s.subtask)
    old = ordered[0].parallelism
    if [s.subtask for s in ordered] != list(range(old)) or any(
        s.parallelism != old for s in ordered
    ):
        raise IncompatibleCheckpoint(
            f"operator state holds subtasks {[s.subtask for s in ordered]} of parallelism "
            f"{sorted({s.parallelism for s in ordered})}, not one of each of 0..{old - 1}: "
            "restore another checkpoint or savepoint"
        )
    # Step 2: the same parallelism keeps every subtask's own state.
    if old == parallelism:
        return dict(ordered[subtask].states)
    # Step 3: another parallelism redistributes each state by its kind.
    kinds: dict[str, str] = {}
    for snap in ordered:
        for name, (kind, _) in snap.states.items():
            if kinds.setdefault(name, kind) != kind:
                raise IncompatibleCheckpoint(
                    f"operator state {name!r} is {kinds[name]} state in one subtask and "
                    f"{kind} in another: restore another checkpoint or savepoint"
                )
    out: dict[str, tuple[str, Any]] = {}
    for name, kind in sorted(kinds.items()):
        if kind == "broadcast":
            out[name] = (kind, dict(ordered[0].states.get(name, (kind, {}))[1]))
            continue
        whole = [v for snap in ordered for v in snap.states.get(name, (kind, []))[1]]
        out[name] = (kind, whole if kind == "union" else even_split(whole, parallelism, subtask))
    return out


def load_snapshots(
    store: ObjectStore, handles: tuple[StateHandle, ...] | list[StateHandle]
) -> list[tuple[StateHandle, OperatorSnapshot]]:
    """Every operator state file among ``handles`` (each read once) with its snapshot.

    Raises:
        CheckpointNotFound: a file is missing.
        MetadataFormatError: a handle is not an operator state file, or a file is corrupt.
    """
    out = []
    for handle in {h.key: h for h in handles}.values():
        url = store.child_url(handle.key)
        if not handle.key.endswith("/" + OPERATOR_NAME):
            raise MetadataFormatError(
                f"{url} is not an operator state file ({OPERATOR_NAME}): was this uid a "
                "keyed operator? give the operator a new uid or restore a matching point"
            )
        obj = store.get(handle.key)
        if obj is None:
            raise CheckpointNotFound(f"operator state file {url} is missing")
        data = handle.check(obj.data, url, "operator state file")
        out.append((handle, decode_snapshot(data, url)))
    return out


def read_operator_state(
    store: ObjectStore, pipeline: str, uid: str, checkpoint: CheckpointId | None = None
) -> dict[int, dict[str, Any]]:
    """``{subtask: {state name: value}}`` of operator ``uid`` at ``checkpoint`` (default:
    the latest completed); broadcast maps have their keys decoded from JSON when they are
    strings or numbers (other keys stay canonical JSON).

    Raises:
        CheckpointNotFound: no such completed checkpoint.
    """
    view = scan(store, Layout(pipeline))
    cid = checkpoint or view.latest_completed
    if cid is None or cid not in view.completed:
        raise CheckpointNotFound(
            f"pipeline {pipeline!r} has no completed checkpoint {cid or ''}; "
            f"completed: {[c.value for c in view.completed]}"
        )
    meta = view.metadata(cid)
    handles = [h for t, a in meta.acks.items() if t.uid.value == uid for h in a.handles]
    out: dict[int, dict[str, Any]] = {}
    for _, snap in load_snapshots(store, handles):
        out[snap.subtask] = {n: _plain(k, v) for n, (k, v) in snap.states.items()}
    return dict(sorted(out.items()))


def _plain(kind: str, value: Any) -> Any:
    if kind != "broadcast":
        return value
    decoded = {ck: json.loads(ck) for ck in value}
    simple = all(isinstance(k, str | int | float) for k in decoded.values())
    return {(decoded[ck] if simple else ck): v for ck, v in value.items()}
