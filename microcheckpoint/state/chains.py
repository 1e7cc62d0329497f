"""Key-group file chains: a base snapshot plus the deltas written after it.

A ``table`` key group's state is a Parquet base file, then zero or more delta files (one
per subtask and epoch, holding only the keys that changed, a None value marking a
deletion). A ``memory`` subtask file is a base for all its key groups. A delta applies to
a key group only if it was written after that key group's base (its checkpoint folder
sorts later), so compacting a key group into a new base makes older deltas irrelevant to
it while they stay referenced for other key groups.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.state.backends import KeyGroupState, decode_memory, decode_table
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore

__all__ = ["DELTA_SUFFIX", "cached_reader", "is_delta", "key_group_chains", "load_key_group"]

DELTA_SUFFIX = "delta.json"
_CHK = re.compile(r"chk-(\d{10})/")


def cached_reader(store: ObjectStore, cache: dict[str, bytes]) -> Callable[[str], bytes]:
    """Read state files through ``cache`` (a delta file serves many key groups)."""

    def read(key: str) -> bytes:
        if key not in cache:
            obj = store.get(key)
            if obj is None:
                raise CheckpointNotFound(f"state file {store.child_url(key)} is missing")
            cache[key] = obj.data
        return cache[key]

    return read


def is_delta(key: str) -> bool:
    return key.endswith(DELTA_SUFFIX)


def _written_at(key: str) -> tuple[int, str]:
    match = _CHK.search(key)
    return (int(match.group(1)) if match else 0, key)


def key_group_chains(handles: Iterable[StateHandle]) -> dict[int, list[StateHandle]]:
    """Per key group: its newest base, then the deltas written after it, oldest first."""
    bases: dict[int, StateHandle] = {}
    deltas: list[StateHandle] = []
    for handle in handles:
        if is_delta(handle.key):
            deltas.append(handle)
            continue
        for kg in handle.key_groups:
            if kg not in bases or _written_at(handle.key) > _written_at(bases[kg].key):
                bases[kg] = handle
    deltas.sort(key=lambda h: _written_at(h.key))
    chains = {kg: [base] for kg, base in bases.items()}
    for delta in deltas:
        for kg in delta.key_groups:
            if kg in chains and _written_at(delta.key) > _written_at(chains[kg][0].key):
                chains[kg].append(delta)
    return chains


def load_key_group(
    chain: list[StateHandle], kg: int, read: Callable[[str], bytes], name: Callable[[str], str]
) -> KeyGroupState:
    """The state of key group ``kg``: its base with every delta applied in order."""
    state: KeyGroupState = {}
    for handle in chain:
        data = read(handle.key)
        if handle.key.endswith(".parquet"):
            state = decode_table(data, name(handle.key))
        elif is_delta(handle.key):
            for key, (value, updated) in (
                decode_memory(data, name(handle.key), [kg]).get(kg, {}).items()
            ):
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = (value, updated)
        else:
            state = decode_memory(data, name(handle.key), [kg]).get(kg, {})
    return state
