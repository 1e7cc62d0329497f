"""Key-group file chains: a base snapshot plus the deltas written after it.

A key group's state is its newest base file (if any), then every delta written after that
base, oldest first (a delta holds only the keys that changed in one epoch, a null state
marking a deletion). A file's checkpoint folder tells when it was written, so compacting a
key group into a new base makes older deltas irrelevant to it while they stay referenced
for other key groups. A key group whose first state came in a delta has no base yet: its
chain is its deltas, until the subtask owning it compacts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from microcheckpoint.state.files import DELTA_NAME, select
from microcheckpoint.state.handles import StateHandle

__all__ = [
    "DELTA_SUFFIXES",
    "fold",
    "is_delta",
    "key_group_chains",
    "load_key_group",
    "written_at",
]

# ``delta.json`` is the format-1 name; ``delta.parquet`` is written today.
DELTA_SUFFIXES = ("delta.json", DELTA_NAME)
_CHK = re.compile(r"chk-(\d{10})/")

KeyGroupState = dict[str, tuple[Any, int]]


def is_delta(key: str) -> bool:
    return key.endswith(DELTA_SUFFIXES)


def written_at(key: str) -> tuple[int, str]:
    """When a file was written: its checkpoint folder's id (then its key, for a total order)."""
    match = _CHK.search(key)
    return (int(match.group(1)) if match else 0, key)


def key_group_chains(handles: Iterable[StateHandle]) -> dict[int, list[StateHandle]]:
    """Per key group: its newest base (if any), then the deltas written after it, oldest first."""
    bases: dict[int, StateHandle] = {}
    deltas: list[StateHandle] = []
    # After a rescale, two subtasks' acks may reference the same file: one handle per file.
    for handle in {h.key: h for h in handles}.values():
        if is_delta(handle.key):
            deltas.append(handle)
            continue
        for kg in handle.key_groups:
            if kg not in bases or written_at(handle.key) > written_at(bases[kg].key):
                bases[kg] = handle
    deltas.sort(key=lambda h: written_at(h.key))
    chains = {kg: [base] for kg, base in bases.items()}
    for delta in deltas:
        for kg in delta.key_groups:
            chain = chains.setdefault(kg, [])
            base = chain[0] if chain and not is_delta(chain[0].key) else None
            if base is None or written_at(delta.key) > written_at(base.key):
                chain.append(delta)
    return chains


def fold(tables: Iterable[pa.Table], kg: int, keys: Iterable[str] | None = None) -> KeyGroupState:
    """The state of key group ``kg`` from its chain's state rows, oldest first.

    Later rows win; a null state deletes the key. With ``keys``, only those keys.
    """
    wanted = None if keys is None else list(keys)
    state: KeyGroupState = {}
    for rows in tables:
        part = select(rows, [kg], wanted)
        for key, text, updated in zip(
            part.column("key").to_pylist(),
            part.column("state").to_pylist(),
            part.column("updated_ms").to_pylist(),
            strict=True,
        ):
            if text is None:
                state.pop(key, None)
            else:
                state[key] = (json.loads(text), int(updated))
    return state


def load_key_group(
    chain: list[StateHandle], kg: int, read: Callable[[StateHandle], pa.Table]
) -> KeyGroupState:
    """The whole state of key group ``kg``: its base with every delta applied in order."""
    return fold((read(handle) for handle in chain), kg)
