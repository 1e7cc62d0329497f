"""Operator (non-keyed) state for user operators: list, union-list and broadcast state.

A ``PartitionOperator`` runs a ``PartitionFunction`` once per epoch in each of its
subtasks, on the rows that subtask got (a hash of each row picks it, so a re-run gives
every subtask the same rows). Its state belongs to the subtask, not to a key (Flink's
operator state)::

    class Buffered(PartitionFunction):
        states = (operator_list_state("buffer"), union_list_state("seen"),
                  broadcast_state("rules"))

        def process_broadcast(self, rows, ctx):   # every subtask, all rule rows, first
            for r in rows:
                ctx.broadcast_state("rules").put(r["name"], r["limit"])

        def process(self, rows, ctx):             # this subtask's rows, source order
            ctx.list_state("buffer").add_all(r["v"] for r in rows)
            return [{"subtask": ctx.subtask, "size": len(ctx.list_state("buffer").get())}]

    PartitionOperator("buffered", Buffered(), "subtask int, size long", broadcast_input="rules")

Snapshot, restore and rescale: ``state.operator_files`` (one ``operator.json`` per subtask
and epoch; the redistribution rule). This module imports no Spark: ``operator_stage`` builds
the Spark stage, ``operator_subtask.process_partition`` runs in the executors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ConfigError, InvalidValue
from microcheckpoint.ids import OperatorUid
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.operator_files import KINDS

__all__ = [
    "BroadcastStateHandle",
    "ListStateHandle",
    "OperatorStateDescriptor",
    "PartitionContext",
    "PartitionFunction",
    "PartitionOperator",
    "broadcast_state",
    "operator_list_state",
    "union_list_state",
]


@dataclass(frozen=True)
class OperatorStateDescriptor:
    """A named operator state: ``kind`` is ``list``, ``union`` or ``broadcast``."""

    kind: str
    name: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError("operator state kind", self.kind, f"one of {', '.join(KINDS)}")
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("operator state name", self.name, "a non-empty string")


def operator_list_state(name: str) -> OperatorStateDescriptor:
    """List state, split evenly over the subtasks when the parallelism changes."""
    return OperatorStateDescriptor("list", name)


def union_list_state(name: str) -> OperatorStateDescriptor:
    """List state given whole (every subtask's list, concatenated) to every subtask when
    the parallelism changes."""
    return OperatorStateDescriptor("union", name)


def broadcast_state(name: str) -> OperatorStateDescriptor:
    """A map written only by ``process_broadcast``, equal in every subtask."""
    return OperatorStateDescriptor("broadcast", name)


class ListStateHandle:
    """A subtask's list (operator list or union-list state). Elements are JSON values."""

    def __init__(self, values: list[Any]) -> None:
        self._values = values

    def get(self) -> list[Any]:
        """A copy of the elements, in the order they were added."""
        return list(self._values)

    def add(self, value: Any) -> None:
        self._values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._values.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        """Replace every element by ``values``."""
        self._values[:] = list(values)

    def clear(self) -> None:
        self._values.clear()


class BroadcastStateHandle:
    """A broadcast map: keys and values are JSON values. Read-only in ``process``
    (Flink's ``ReadOnlyBroadcastState``); ``put``, ``remove`` and ``clear`` only in
    ``process_broadcast``, so every subtask holds the same map."""

    def __init__(self, name: str, entries: dict[str, Any], ctx: PartitionContext) -> None:
        self._name, self._entries, self._ctx = name, entries, ctx

    def get(self, key: Any, default: Any = None) -> Any:
        return self._entries.get(canonical_key(key), default)

    def contains(self, key: Any) -> bool:
        return canonical_key(key) in self._entries

    def keys(self) -> Iterator[Any]:
        return (json.loads(ck) for ck in sorted(self._entries))

    def values(self) -> Iterator[Any]:
        return (self._entries[ck] for ck in sorted(self._entries))

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` pairs, in canonical-key order (the same in every subtask)."""
        return ((json.loads(ck), self._entries[ck]) for ck in sorted(self._entries))

    def is_empty(self) -> bool:
        return not self._entries

    def _writable(self) -> None:
        if not self._ctx.broadcast_writable:
            raise InvalidValue(
                f"broadcast state {self._name!r} is read-only in process(); write it in "
                "process_broadcast(), which every subtask runs on the same rows"
            )

    def put(self, key: Any, value: Any) -> None:
        self._writable()
        self._entries[canonical_key(key)] = value

    def remove(self, key: Any) -> None:
        self._writable()
        self._entries.pop(canonical_key(key), None)

    def clear(self) -> None:
        self._writable()
        self._entries.clear()


@dataclass
class PartitionContext:
    """What a ``PartitionFunction`` sees: its subtask, the parallelism and its state.

    ``rescaled_from`` is the old parallelism when this epoch's state was redistributed
    from another parallelism, else None; ``processing_time`` is the checkpoint's trigger
    time (ms), the same on a re-run.
    """

    subtask: int
    parallelism: int
    processing_time: int
    states: dict[str, tuple[str, Any]]
    declared: dict[str, str]
    rescaled_from: int | None = None
    broadcast_writable: bool = False

    def _state(self, name: str, kind: str) -> Any:
        if self.declared.get(name) != kind:
            mine = [n for n, k in sorted(self.declared.items()) if k == kind]
            raise ConfigError(
                f"{kind} state", name, f"a name the function declares in states: {mine}"
            )
        return self.states.setdefault(name, (kind, {} if kind == "broadcast" else []))[1]

    def list_state(self, name: str) -> ListStateHandle:
        return ListStateHandle(self._state(name, "list"))

    def union_list_state(self, name: str) -> ListStateHandle:
        return ListStateHandle(self._state(name, "union"))

    def broadcast_state(self, name: str) -> BroadcastStateHandle:
        return BroadcastStateHandle(name, self._state(name, "broadcast"), self)


class PartitionFunction:
    """A user operator with operator state: subclass it, declare ``states``, override
    ``process`` (and ``process_broadcast`` with a broadcast input).

    Per epoch and subtask: ``process_broadcast(rows, ctx)`` first, when the epoch has
    broadcast rows (all of them, in source order, in every subtask), then
    ``process(rows, ctx)``, even with no rows (an epoch with no records at all runs
    neither). Both return an iterable of output dicts, or None.
    """

    states: tuple[OperatorStateDescriptor, ...] = ()

    def process(self, rows: list[dict[str, Any]], ctx: PartitionContext) -> Any:
        return None

    def process_broadcast(self, rows: list[dict[str, Any]], ctx: PartitionContext) -> Any:
        return None


@dataclass(frozen=True)
class PartitionOperator:
    """A stage of ``parallelism`` subtasks, each running ``function`` on its share of rows.

    Args:
        uid: stable, unique operator id (state is matched to it on restore).
        function: a ``PartitionFunction`` instance.
        output_schema: Spark DDL of the output rows.
        broadcast_input: with a ``UnionSource``, the uid of the input whose rows go, all of
            them, to ``process_broadcast`` in every subtask; None for none.
    """

    uid: str
    function: PartitionFunction
    output_schema: str
    broadcast_input: str | None = None
    declared: dict[str, str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "uid", OperatorUid(str(self.uid)).value)
        except ValueError as exc:
            raise ConfigError("uid", self.uid, f"a stable, unique uid: {exc}") from exc
        if not isinstance(self.function, PartitionFunction):
            raise ConfigError(
                "function", self.function, "an instance of a PartitionFunction subclass"
            )
        declared: dict[str, str] = {}
        for d in self.function.states:
            if not isinstance(d, OperatorStateDescriptor) or d.name in declared:
                raise ConfigError(
                    "states", d, "operator_list_state, union_list_state or broadcast_state "
                    "descriptors with distinct names"
                )  # fmt: skip
            declared[d.name] = d.kind
        if "broadcast" in declared.values() and self.broadcast_input is None:
            raise ConfigError(
                "broadcast_input", None, f"the input uid whose rows write the broadcast "
                f"state of operator {self.uid!r} (a UnionSource input)"
            )  # fmt: skip
        object.__setattr__(self, "declared", declared)

    def check_source(self, inputs: Iterable[str] | None) -> None:
        """Refuse a ``broadcast_input`` that is not one of the source's ``inputs`` (the
        uids of a ``UnionSource``'s inputs; None for another source)."""
        names = None if inputs is None else sorted(inputs)
        if self.broadcast_input is not None and self.broadcast_input not in (names or ()):
            raise ConfigError(
                "broadcast_input", self.broadcast_input,
                f"one of the UnionSource's input uids {names}" if names
                else "None: the pipeline's source is not a UnionSource",
            )  # fmt: skip
