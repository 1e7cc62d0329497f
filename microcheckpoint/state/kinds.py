"""Named keyed state of five kinds, with TTL: descriptors, handles and their stored form.

A keyed process function declares its state with descriptors (Flink's ``ValueState``,
``ListState``, ``MapState``, ``ReducingState``, ``AggregatingState``); per key, the engine
hands it one handle per descriptor. Everything a key holds is one JSON object, the key's
state row in the backends (``state.backends``), so state of every kind is snapshotted
incrementally, by key group, and rescales on restore like any keyed state::

    {"s": {"count": [7, 1700000000000],          # value:  [value, ttl timestamp]
           "recent": [["a", 1700000000000]],      # list:   [[element, ttl timestamp], ...]
           "seen": {"\\"k\\"": [true, 1700000000000]},  # map: {canonical key: [value, ttl ts]}
           "total": [42, 1700000000000]}}         # reducing, aggregating: [accumulator, ttl ts]

TTL is measured in the epoch's processing time (the checkpoint's trigger time, so a re-run
sees the same entries). An entry whose ttl timestamp + TTL <= now is invisible at once; it is
removed when its key is written, and when its key group is compacted (``cleanup``).

Pure Python: no Spark, Arrow or client import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ConfigError
from microcheckpoint.state.backends import canonical_key

__all__ = [
    "KINDS",
    "LATE_KEY",
    "TIMERS_KEY",
    "Aggregator",
    "KeyState",
    "StateDescriptor",
    "StateTtl",
    "aggregating_state",
    "cleanup",
    "is_pseudo_key",
    "list_state",
    "map_state",
    "reducing_state",
    "value_state",
]

KINDS = ("value", "list", "map", "reducing", "aggregating")
TYPES = ("json", "string", "long", "double", "boolean")
# Per key group, next to the keys: not JSON, so no user key's canonical JSON equals them.
TIMERS_KEY = "\u0000timers"
LATE_KEY = "\u0000late"
_TTL_UPDATES = ("on_create_and_write", "on_create")


def is_pseudo_key(key: str) -> bool:
    """Whether a stored key is a key group's timers or late count rather than a user key."""
    return key.startswith("\u0000")


@dataclass(frozen=True)
class StateTtl:
    """Time to live of a state's entries (Flink's ``StateTtlConfig``).

    Args:
        ttl_s: seconds an entry lives after its ttl timestamp.
        update: ``on_create_and_write`` (a write refreshes the timestamp) or ``on_create``
            (only creating the entry sets it).
    """

    ttl_s: float
    update: str = "on_create_and_write"

    def __post_init__(self) -> None:
        if (
            isinstance(self.ttl_s, bool)
            or not isinstance(self.ttl_s, int | float)
            or self.ttl_s <= 0
        ):
            raise ConfigError("ttl", self.ttl_s, "a number of seconds > 0")
        if self.update not in _TTL_UPDATES:
            raise ConfigError("ttl update", self.update, f"one of {', '.join(_TTL_UPDATES)}")

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)


@dataclass(frozen=True)
class Aggregator:
    """An incremental aggregation (Flink's ``AggregateFunction``): ``create() -> acc``,
    ``add(acc, value) -> acc``, ``result(acc) -> output``, and ``merge(a, b) -> acc`` for
    merging windows (sessions). Accumulators are JSON values."""

    create: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    result: Callable[[Any], Any] = lambda acc: acc
    merge: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class StateDescriptor:
    """One named state of a keyed process function.

    ``type`` is the declared type of the values (``json`` accepts any JSON value); ``fields``
    makes a value a record whose missing fields read as the given defaults (how a field is
    added across a savepoint). Both are recorded in every checkpoint, so a restore can refuse
    a changed type (``state.evolution``).
    """

    name: str
    kind: str
    ttl: StateTtl | None = None
    default: Any = None
    type: str = "json"
    fields: dict[str, Any] | None = None
    reduce: Callable[[Any, Any], Any] | None = field(default=None, compare=False)
    aggregator: Aggregator | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name.startswith("\u0000"):
            raise ConfigError("state name", self.name, "a non-empty string")
        if self.kind not in KINDS:
            raise ConfigError("state kind", self.kind, f"one of {', '.join(KINDS)}")
        if self.type not in TYPES:
            raise ConfigError(
                f"type of state {self.name!r}", self.type, f"one of {', '.join(TYPES)}"
            )
        if self.kind == "reducing" and not callable(self.reduce):
            raise ConfigError(
                f"reduce of state {self.name!r}", self.reduce, "a function (a, b) -> a"
            )
        if self.kind == "aggregating" and not isinstance(self.aggregator, Aggregator):
            raise ConfigError(
                f"aggregator of state {self.name!r}", self.aggregator, "an Aggregator"
            )

    def schema(self) -> dict[str, Any]:
        """What a checkpoint records of this descriptor (JSON)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "type": self.type,
            "fields": None if self.fields is None else dict(sorted(self.fields.items())),
            "ttl_ms": None if self.ttl is None else self.ttl.ttl_ms,
        }

    def complete(self, value: Any) -> Any:
        """``value`` with the record's missing fields set to their defaults."""
        if self.fields is None or not isinstance(value, dict):
            return value
        return {**self.fields, **value}


def value_state(name: str, default: Any = None, **options: Any) -> StateDescriptor:
    """A single value per key; ``value()`` reads ``default`` when none is set."""
    return StateDescriptor(name, "value", default=default, **options)


def list_state(name: str, **options: Any) -> StateDescriptor:
    """A list of elements per key (each element has its own TTL)."""
    return StateDescriptor(name, "list", **options)


def map_state(name: str, **options: Any) -> StateDescriptor:
    """A map per key from JSON keys to JSON values (each entry has its own TTL)."""
    return StateDescriptor(name, "map", **options)


def reducing_state(name: str, reduce: Callable[[Any, Any], Any], **options: Any) -> StateDescriptor:
    """One value per key folded with ``reduce(acc, value)`` as values are added."""
    return StateDescriptor(name, "reducing", reduce=reduce, **options)


def aggregating_state(name: str, aggregator: Aggregator, **options: Any) -> StateDescriptor:
    """An accumulator per key: ``add`` folds values in, ``get`` returns ``result(acc)``."""
    return StateDescriptor(name, "aggregating", aggregator=aggregator, **options)


class _Entry:
    """Reading and writing ``[value, ttl timestamp]`` pairs under one descriptor's TTL."""

    def __init__(self, desc: StateDescriptor, now_ms: int) -> None:
        self.desc, self.now = desc, now_ms

    def live(self, pair: list | None) -> bool:
        ttl = self.desc.ttl
        return pair is not None and (ttl is None or pair[1] + ttl.ttl_ms > self.now)

    def write(self, old: list | None, value: Any) -> list:
        keep = self.live(old) and self.desc.ttl is not None and self.desc.ttl.update == "on_create"
        return [value, old[1] if keep else self.now]


class _Handle:
    def __init__(self, owner: KeyState, desc: StateDescriptor) -> None:
        self._owner, self._desc, self._e = owner, desc, _Entry(desc, owner.now_ms)

    @property
    def _raw(self) -> Any:
        return self._owner.raw.get(self._desc.name)

    def _set(self, raw: Any) -> None:
        self._owner.set_raw(self._desc.name, raw)

    def clear(self) -> None:
        """Remove everything this state holds for the key."""
        self._set(None)


class ValueState(_Handle):
    def value(self) -> Any:
        raw = self._raw
        return self._desc.complete(raw[0]) if self._e.live(raw) else self._desc.default

    def update(self, value: Any) -> None:
        self._set(None if value is None else self._e.write(self._raw, value))


class ListState(_Handle):
    """Elements are appended in place; expired ones are skipped on reading and left out
    when the key is stored (``KeyState.stored``), so adding n elements costs O(n)."""

    def _pairs(self) -> list[list]:
        return [p for p in (self._raw or []) if self._e.live(p)]

    def get(self) -> list[Any]:
        return [self._desc.complete(p[0]) for p in self._pairs()]

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        pairs = self._raw if self._raw is not None else []
        pairs.extend(self._e.write(None, v) for v in values)
        self._set(pairs or None)

    def update(self, values: Iterable[Any]) -> None:
        self._set([self._e.write(None, v) for v in values] or None)


class MapState(_Handle):
    """Entries change in place; expired ones read as absent and are left out when the key
    is stored (``KeyState.stored``), so a put or remove costs O(1)."""

    def _live(self) -> dict[str, list]:
        return {k: p for k, p in (self._raw or {}).items() if self._e.live(p)}

    def get(self, key: Any, default: Any = None) -> Any:
        pair = (self._raw or {}).get(canonical_key(key))
        return self._desc.complete(pair[0]) if self._e.live(pair) else default

    def contains(self, key: Any) -> bool:
        return self._e.live((self._raw or {}).get(canonical_key(key)))

    def put(self, key: Any, value: Any) -> None:
        entries = self._raw if self._raw is not None else {}
        ck = canonical_key(key)
        entries[ck] = self._e.write(entries.get(ck), value)
        self._set(entries)

    def remove(self, key: Any) -> None:
        entries = self._raw
        if entries is not None and entries.pop(canonical_key(key), None) is not None:
            self._set(entries or None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        for k, p in sorted(self._live().items()):
            yield json.loads(k), self._desc.complete(p[0])

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return not self._live()


class ReducingState(_Handle):
    def get(self) -> Any:
        raw = self._raw
        return raw[0] if self._e.live(raw) else None

    def add(self, value: Any) -> None:
        raw = self._raw if self._e.live(self._raw) else None
        acc = value if raw is None else self._desc.reduce(raw[0], value)  # type: ignore[misc]
        self._set(self._e.write(raw, acc))


class AggregatingState(_Handle):
    def accumulator(self) -> Any:
        """The accumulator itself (None when empty)."""
        raw = self._raw
        return raw[0] if self._e.live(raw) else None

    def get(self) -> Any:
        acc = self.accumulator()
        return None if acc is None else self._desc.aggregator.result(acc)  # type: ignore[union-attr]

    def add(self, value: Any) -> None:
        agg = self._desc.aggregator
        raw = self._raw if self._e.live(self._raw) else None
        acc = agg.create() if raw is None else raw[0]  # type: ignore[union-attr]
        self._set(self._e.write(raw, agg.add(acc, value)))  # type: ignore[union-attr]

    def set_accumulator(self, acc: Any) -> None:
        """Replace the accumulator (a merging window's merged one); None clears it."""
        self._set(None if acc is None else self._e.write(self._raw, acc))


_HANDLES: dict[str, type[_Handle]] = {
    "value": ValueState,
    "list": ListState,
    "map": MapState,
    "reducing": ReducingState,
    "aggregating": AggregatingState,
}


class KeyState:
    """Every state of one key in one epoch: handles by name over the key's stored object.

    Args:
        descriptors: the function's descriptors, by name.
        stored: the key's stored object (``{"s": {...}}``) or None for a new key.
        now_ms: the epoch's processing time (TTL).
    """

    def __init__(self, descriptors: dict[str, StateDescriptor], stored: Any, now_ms: int) -> None:
        self.descriptors = descriptors
        self.now_ms = now_ms
        self.raw: dict[str, Any] = dict((stored or {}).get("s", {}))
        self.changed = False
        self._handles: dict[str, _Handle] = {}

    def state(self, name: str) -> Any:
        """The handle of state ``name``."""
        if name not in self._handles:
            desc = self.descriptors.get(name)
            if desc is None:
                raise ConfigError(
                    "state", name, f"one of the declared states: {', '.join(self.descriptors)}"
                )
            self._handles[name] = _HANDLES[desc.kind](self, desc)
        return self._handles[name]

    def set_raw(self, name: str, raw: Any) -> None:
        self.changed = True
        if raw is None:
            self.raw.pop(name, None)
        else:
            self.raw[name] = raw

    def stored(self) -> Any:
        """The object to store for the key (expired entries removed), or None for no state."""
        return cleanup(self.descriptors, {"s": self.raw}, self.now_ms)


def cleanup(descriptors: dict[str, StateDescriptor], stored: Any, now_ms: int) -> Any:
    """``stored`` without its expired entries; None when nothing is left.

    A state not in ``descriptors`` is kept unchanged: whether it may be dropped is the
    restore's decision (``allow_non_restored_state``), not TTL's.
    """
    out: dict[str, Any] = {}
    for name, raw in (stored or {}).get("s", {}).items():
        desc = descriptors.get(name)
        if desc is None or desc.ttl is None:
            out[name] = raw
            continue
        entry = _Entry(desc, now_ms)
        if desc.kind == "list":
            raw = [p for p in raw if entry.live(p)] or None
        elif desc.kind == "map":
            raw = {k: p for k, p in raw.items() if entry.live(p)} or None
        elif not entry.live(raw):
            raw = None
        if raw is not None:
            out[name] = raw
    return {"s": out} if out else None
