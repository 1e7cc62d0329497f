"""The offline form of a keyed operator's state: what ``state export`` writes and ``state
import`` reads, for state of every kind.

One Parquet row per key, columns JSON text:

- ``key``: the key (any JSON value);
- ``state``: a plain ``KeyedOperator(fn)``'s value itself (the format before named state);
  for a keyed process function, ``{name: decoded}`` per declared state, decoded per kind
  with each entry's ttl timestamp (ms; the time a TTL counts from)::

      value        {"value": 7, "ttl_ts": 1700000000000}
      list         [{"value": "a", "ttl_ts": 1700000000000}, ...]
      map          [{"key": "k", "value": true, "ttl_ts": 1700000000000}, ...]  by stored key
      reducing     {"value": 42, "ttl_ts": 1700000000000}
      aggregating  {"accumulator": [3, 2], "ttl_ts": 1700000000000}
      (undeclared) {"undeclared": <stored form>}   a dropped state kept unread

  ``{}`` for a key that has timers and no state;
- ``timers`` (process functions only): the key's pending timers, ``[[ts, "event" |
  "processing"], ...]`` in firing order.

Parquet key-value metadata carries what is not per key: ``microcheckpoint.descriptors``
(the operator's recorded ``StateDescriptor.schema()`` list; absent for a plain function) and
``microcheckpoint.key_groups`` (``{key group: {pseudo key: value}}``: late-row counts, a
source's watermarks). Expired TTL entries still stored are exported as stored, so export,
import and export again give equal tables.

Pure: pyarrow, no Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from microcheckpoint.errors import InvalidValue
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.files import read_parquet

__all__ = [
    "DESCRIPTORS_META",
    "GROUPS_META",
    "KeyedTable",
    "decode_key",
    "encode_key",
    "read_table_extras",
    "table_of",
]

DESCRIPTORS_META = b"microcheckpoint.descriptors"
GROUPS_META = b"microcheckpoint.key_groups"
_SCALAR = {"value": "value", "reducing": "value", "aggregating": "accumulator"}


@dataclass
class KeyedTable:
    """One operator's keyed state as stored: per canonical key its stored object (None for a
    key with timers only) and timers, per key group its pseudo keys other than timers."""

    uid: str
    descriptors: list[dict[str, Any]] | None
    keys: dict[str, Any] = field(default_factory=dict)
    timers: dict[str, list[list[Any]]] = field(default_factory=dict)
    groups: dict[int, dict[str, Any]] = field(default_factory=dict)


def decode_key(descriptors: list[dict[str, Any]], stored: Any) -> dict[str, Any]:
    """A key's stored ``{"s": {...}}`` as ``{name: decoded}`` (module docstring)."""
    kinds = {d["name"]: d["kind"] for d in descriptors}
    out: dict[str, Any] = {}
    for name, raw in (stored or {}).get("s", {}).items():
        kind = kinds.get(name)
        if kind is None:
            out[name] = {"undeclared": raw}
        elif kind == "list":
            out[name] = [{"value": v, "ttl_ts": t} for v, t in raw]
        elif kind == "map":
            out[name] = [
                {"key": json.loads(k), "value": v, "ttl_ts": t} for k, (v, t) in sorted(raw.items())
            ]
        else:
            out[name] = {_SCALAR[kind]: raw[0], "ttl_ts": raw[1]}
    return out


def encode_key(descriptors: list[dict[str, Any]], decoded: Mapping[str, Any], where: str) -> Any:
    """The stored object of a key's ``{name: decoded}``; None for ``{}``.

    Raises:
        InvalidValue: a state name the descriptors do not declare (and not ``undeclared``),
            or an entry not of its kind's shape; ``where`` names the row.
    """
    kinds = {d["name"]: d["kind"] for d in descriptors}
    out: dict[str, Any] = {}
    for name, value in decoded.items():
        kind = kinds.get(name)
        try:
            if isinstance(value, dict) and set(value) == {"undeclared"}:
                out[name] = value["undeclared"]
            elif kind == "list":
                out[name] = [[e["value"], int(e["ttl_ts"])] for e in value]
            elif kind == "map":
                out[name] = {canonical_key(e["key"]): [e["value"], int(e["ttl_ts"])] for e in value}
            elif kind in _SCALAR:
                out[name] = [value[_SCALAR[kind]], int(value["ttl_ts"])]
            else:
                declared = ", ".join(kinds) or "none"
                raise InvalidValue(
                    f"{where}: state {name!r} is not declared (declared: {declared}); "
                    'write it as {"undeclared": ...} or drop it'
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidValue(
                f"{where}: state {name!r} ({kind}) is not in `state export`'s form ({exc!r}); "
                "write it as the module doc of state.offline shows"
            ) from None
    return {"s": out} if out else None


def table_of(table: KeyedTable) -> pa.Table:
    """``table`` as the exported Parquet table (columns and metadata: module docstring),
    rows sorted by key."""
    named = table.descriptors is not None
    cks = sorted({*table.keys, *table.timers}, key=lambda ck: json.dumps(json.loads(ck)))
    columns: dict[str, list[str]] = {"key": [], "state": []}
    if named:
        columns["timers"] = []
    for ck in cks:
        stored = table.keys.get(ck)
        state = decode_key(table.descriptors, stored) if named else stored  # type: ignore[arg-type]
        columns["key"].append(json.dumps(json.loads(ck), sort_keys=True))
        columns["state"].append(json.dumps(state, sort_keys=True))
        if named:
            columns["timers"].append(json.dumps(table.timers.get(ck, [])))
    schema = pa.schema([(name, pa.string()) for name in columns])
    meta: dict[bytes, bytes] = {}
    if named:
        meta[DESCRIPTORS_META] = json.dumps(table.descriptors, sort_keys=True).encode()
    if table.groups:
        groups = {str(kg): entries for kg, entries in sorted(table.groups.items())}
        meta[GROUPS_META] = json.dumps(groups, sort_keys=True).encode()
    return pa.table(columns, schema=schema.with_metadata(meta or None))


def read_table_extras(
    path: str, states: Mapping[str, Any]
) -> tuple[KeyedTable, list[dict[str, Any]] | None]:
    """What ``bootstrap.read_state_table`` leaves out of a table: its descriptors, timers and
    key-group entries; ``states`` (``{ck: state JSON}`` of the same file) encoded into the
    stored form. Returns the table and its descriptors (None: a plain function's values).

    Raises:
        InvalidValue: a timers cell that is not a JSON list of ``[ts, domain]`` pairs, or a
            state not in the exported form.
    """
    file = pq.ParquetFile(path)
    meta = file.schema_arrow.metadata or {}
    descriptors = json.loads(meta[DESCRIPTORS_META]) if DESCRIPTORS_META in meta else None
    groups = {int(kg): dict(v) for kg, v in json.loads(meta.get(GROUPS_META, b"{}")).items()}
    out = KeyedTable("", descriptors, groups=groups)
    if descriptors is None:
        out.keys = dict(states)
        return out, None
    columns = read_parquet(path, ["key", "timers"]).to_pylist()
    for row, cells in enumerate(columns, start=1):
        ck = canonical_key(json.loads(cells["key"]))
        where = f"row {row} of {path}"
        timers = json.loads(cells["timers"] or "[]")
        if not isinstance(timers, list) or not all(_is_timer(t) for t in timers):
            raise InvalidValue(
                f'{where}: timers {cells["timers"]!r} are not [[ts, "event"|"processing"], '
                "...]; write them as `state export` does"
            )
        if timers:
            out.timers[ck] = sorted([int(t), str(d)] for t, d in timers)
        stored = encode_key(descriptors, states[ck], where)
        if stored is not None:
            out.keys[ck] = stored
    return out, descriptors


def _is_timer(entry: Any) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], int)
        and not isinstance(entry[0], bool)
        and entry[1] in ("event", "processing")
    )
