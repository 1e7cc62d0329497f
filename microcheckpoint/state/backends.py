"""State backends: how a keyed operator's state is written to and read from checkpoint storage.

Keyed state is a map ``key -> (value, updated_ms)`` per key group. Keys and values are
JSON-serializable; a key's identity is its canonical JSON (``canonical_key``).

- ``table``: one Parquet file per (operator uid, key group), written only when the key group
  changed in the epoch (incremental); unchanged key groups keep referencing earlier files.
- ``memory``: one JSON file per operator subtask with all its key groups, rewritten every
  epoch; for small state, capped at ``MEMORY_LIMIT_BYTES`` like Flink's heap backend.

Imports pyarrow lazily (table backend only); no Spark, boto3 or Kafka client.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

from microcheckpoint.errors import ConfigError, MetadataFormatError, StateTooLarge

__all__ = [
    "BACKENDS",
    "MEMORY_LIMIT_BYTES",
    "KeyGroupState",
    "StateTooLarge",
    "canonical_key",
    "key_of",
    "decode_memory",
    "decode_table",
    "encode_memory",
    "encode_table",
]

BACKENDS = ("memory", "table")
MEMORY_LIMIT_BYTES = 5 * 1024 * 1024

# key (canonical JSON) -> (state value, last update time in ms)
KeyGroupState = dict[str, tuple[Any, int]]


# ``json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, with one
# encoder for every key (``dumps`` with options builds one per call: a third of the cost).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_key(key: Any) -> str:
    """The canonical JSON of a key: equal keys give equal strings in every process."""
    try:
        return _CANONICAL.encode(key)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            "key", repr(key), "a JSON-serializable value (str, int, list, dict)"
        ) from exc


# A string that JSON escapes nothing in: its canonical JSON is itself in quotes.
_ESCAPED = r'["\\\x00-\x1f]'


def canonical_string_keys(keys: Any) -> Any:
    """``canonical_key`` of every string of the Arrow string array ``keys``, in Arrow; None
    when one of them is null or has a character JSON escapes (the caller goes key by key)."""
    import pyarrow.compute as pc

    if keys.null_count or pc.any(pc.match_substring_regex(keys, _ESCAPED)).as_py():
        return None
    quoted = pc.binary_join_element_wise('"', keys, '"', "")
    return quoted.combine_chunks() if hasattr(quoted, "combine_chunks") else quoted


def key_of(ck: str) -> Any:
    """The key whose canonical JSON is ``ck`` (``json.loads``; a string without escapes is
    read directly)."""
    if ck[:1] == '"' and "\\" not in ck:
        return ck[1:-1]
    return json.loads(ck)


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ConfigError("state_backend", name, f"one of {', '.join(BACKENDS)}")
    return name


def encode_table(state: KeyGroupState) -> bytes:
    """Parquet bytes of one key group's state, rows sorted by key (deterministic)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = sorted(state)
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "state": pa.array([json.dumps(state[k][0], sort_keys=True) for k in keys], pa.string()),
            "updated_ms": pa.array([state[k][1] for k in keys], pa.int64()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_table(data: bytes, source: str) -> KeyGroupState:
    from microcheckpoint.state.files import read_parquet

    try:
        table = read_parquet(data)
        columns = table.to_pydict()
        return {
            k: (json.loads(s), int(u))
            for k, s, u in zip(columns["key"], columns["state"], columns["updated_ms"], strict=True)
        }
    except Exception as exc:  # pyarrow raises many types for a corrupt file
        raise MetadataFormatError(f"state file {source} is corrupt: {exc}") from exc


def encode_memory(uid: str, groups: Mapping[int, KeyGroupState]) -> bytes:
    """JSON of every key group of one subtask; refuses more than ``MEMORY_LIMIT_BYTES``."""
    body = {
        str(kg): {k: [v, u] for k, (v, u) in sorted(state.items())}
        for kg, state in sorted(groups.items())
    }
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MEMORY_LIMIT_BYTES:
        raise StateTooLarge(
            f"operator {uid!r}: memory state snapshot of {len(data)} bytes exceeds the "
            f"{MEMORY_LIMIT_BYTES} byte limit of the memory backend; use state_backend='table'"
        )
    return data


def decode_memory(data: bytes, source: str, key_groups: Iterable[int]) -> dict[int, KeyGroupState]:
    try:
        body = json.loads(data)
        wanted = {str(kg) for kg in key_groups}
        return {
            int(kg): {k: (v[0], int(v[1])) for k, v in state.items()}
            for kg, state in body.items()
            if kg in wanted
        }
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise MetadataFormatError(f"state file {source} is corrupt: {exc}") from exc
