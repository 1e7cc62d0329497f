"""State evolution across a savepoint: the state descriptors a point holds against those a
pipeline declares (Flink's state schema compatibility).

Where a point records its descriptors: subtask 0 of every keyed process operator puts
``{"state_descriptors": [StateDescriptor.schema(), ...]}`` in its ack's ``operator_state``
(``engine.keyed``), so the descriptors live inline in ``_metadata``. Nothing is referenced,
so retention deletes nothing they need; savepoints, global savepoints, imports and
CLAIM / NO_CLAIM restores copy the acks, so every copy keeps them. A plain
``KeyedOperator(fn)`` records none (its row is the value itself).

What a restore allows, per operator the point and the pipeline both have:

- **a state added**: it starts empty for every key;
- **a field added** (``StateDescriptor.fields``): stored records read the new field's default;
  a field removed is ignored (the stored records keep it, unread);
- **a TTL added, changed or removed**: every entry already carries its ttl timestamp;
- **a state dropped**: refused unless ``allow_non_restored_state``; then its entries stay in
  each key's row, **unread** (they are carried when the key is written, as ``kinds.cleanup``
  keeps undeclared states), so restoring the older pipeline later still finds them, and
  declaring the same name again reads them again (give a new state a new name);
- **a changed kind or type** (``StateDescriptor.kind``, ``.type``), or a switch between a
  plain function and a process function: refused, one line naming the operator, the
  state and the fix.

Pure Python: no Spark or client import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from microcheckpoint.errors import IncompatibleCheckpoint
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.state.kinds import StateDescriptor

if TYPE_CHECKING:
    from microcheckpoint.protocol.savepoints import RestorePoint

__all__ = [
    "DESCRIPTORS_FIELD",
    "Change",
    "Declared",
    "KeyedOperatorLike",
    "PipelineLike",
    "ProcessFunction",
    "StateChange",
    "check_evolution",
    "compare",
    "declared_from_point",
    "describe",
    "function_descriptors",
    "pipeline_descriptors",
    "recorded_descriptors",
]

DESCRIPTORS_FIELD = "state_descriptors"
# uid -> the operator's descriptor schemas, or None for a plain KeyedOperator(fn)
Declared = Mapping[str, list[dict[str, Any]] | None]


class ProcessFunction(Protocol):
    """What this module reads of ``engine.process.KeyedProcessFunction`` (a later layer)."""

    states: Sequence[StateDescriptor]
    bare: bool


class KeyedOperatorLike(Protocol):
    """What this module reads of ``engine.api.KeyedOperator``."""

    @property
    def uid(self) -> str: ...

    @property
    def process_function(self) -> ProcessFunction | None: ...


class PipelineLike(Protocol):
    """What this module reads of ``engine.api.Pipeline``."""

    @property
    def operators(self) -> Sequence[KeyedOperatorLike]: ...


def function_descriptors(function: ProcessFunction | None) -> list[dict[str, Any]] | None:
    """The schemas of a ``KeyedProcessFunction``'s states; None for no function (a plain
    ``fn``) or the bare layout of a plain ``fn`` (``ValueFunction``)."""
    if function is None or function.bare:
        return None
    return [d.schema() for d in function.states]


def pipeline_descriptors(pipeline: PipelineLike) -> dict[str, list[dict[str, Any]] | None]:
    """``{uid: schemas or None}`` for every keyed operator of ``pipeline`` (an
    ``engine.Pipeline``)."""
    return {op.uid: function_descriptors(op.process_function) for op in pipeline.operators}


def recorded_descriptors(meta: CheckpointMetadata) -> dict[str, list[dict[str, Any]] | None]:
    """What a point records, for every operator holding state in it: ``{uid: schemas}``,
    None for an operator whose acks carry no descriptors (a plain function, a source, a
    sink). Edge case: an operator whose acks hold no files and no descriptors is left out."""
    out: dict[str, list[dict[str, Any]] | None] = {}
    for task, ack in sorted(meta.acks.items(), key=lambda item: str(item[0])):
        uid = task.uid.value
        found = ack.operator_state.get(DESCRIPTORS_FIELD)
        if found is not None:
            out[uid] = [dict(d) for d in found]
        elif ack.handles:
            out.setdefault(uid, None)
    return out


class Change(Enum):
    """How one state differs between a point and the pipeline (the value names it)."""

    KEPT = "kept"
    ADDED = "added"
    FIELDS = "fields changed"
    TTL = "ttl changed"
    DROPPED = "dropped"
    TYPE = "type changed"
    KIND = "kind changed"
    LAYOUT = "layout changed"


_REFUSED = (Change.TYPE, Change.KIND, Change.LAYOUT)


def describe(schema: Mapping[str, Any] | None) -> str:
    """``value state of long, fields a, b, ttl 600000 ms``; a plain function's row."""
    if schema is None:
        return "the row of a plain KeyedOperator(fn)"
    text = f"{schema['kind']} state of {schema['type']}"
    if schema.get("fields"):
        text += f", fields {', '.join(sorted(schema['fields']))}"
    if schema.get("ttl_ms") is not None:
        text += f", ttl {schema['ttl_ms']} ms"
    return text


@dataclass(frozen=True)
class StateChange:
    """One state of one operator: what the point holds, what the pipeline declares."""

    uid: str
    name: str
    change: Change
    stored: dict[str, Any] | None
    declared: dict[str, Any] | None

    @property
    def refused(self) -> bool:
        return self.change in _REFUSED

    def detail(self) -> str:
        """``stored -> declared`` for a person (a verify row)."""
        if self.change is Change.ADDED:
            return f"added: {describe(self.declared)} (starts empty)"
        if self.change is Change.DROPPED:
            return f"dropped: {describe(self.stored)} (kept unread)"
        if self.change is Change.KEPT:
            return describe(self.declared)
        return f"{self.change.value}: {describe(self.stored)} -> {describe(self.declared)}"

    def problem(self, location: str) -> str:
        """The refusal of this change: the operator, the state and the fix."""
        if self.change is Change.DROPPED:
            return (
                f"{location} holds state {self.name!r} of operator {self.uid!r} that the "
                "pipeline no longer declares; restore with allow_non_restored_state to leave "
                "it unread, or declare it again"
            )
        if self.change is Change.LAYOUT:
            return (
                f"operator {self.uid!r} holds {describe(self.stored)} in {location} and the "
                f"pipeline declares {describe(self.declared)}; keep the operator's function "
                "kind, or give the new function a new uid (with allow_non_restored_state)"
            )
        return (
            f"state {self.name!r} of operator {self.uid!r} is a {describe(self.stored)} in "
            f"{location} and the pipeline declares a {describe(self.declared)}; keep its "
            f"{'kind' if self.change is Change.KIND else 'type'}, or declare the new one "
            "under another name (restore with allow_non_restored_state to drop the old one)"
        )


def _compare_state(uid: str, name: str, old: dict | None, new: dict | None) -> StateChange:
    if old is None or new is None:
        change = Change.ADDED if old is None else Change.DROPPED
    elif old["kind"] != new["kind"]:
        change = Change.KIND
    elif old["type"] != new["type"]:
        change = Change.TYPE
    elif (old.get("fields") or None) != (new.get("fields") or None):
        change = Change.FIELDS
    elif old.get("ttl_ms") != new.get("ttl_ms"):
        change = Change.TTL
    else:
        change = Change.KEPT
    return StateChange(uid, name, change, old, new)


def compare(recorded: Declared, declared: Declared) -> list[StateChange]:
    """Every state of the operators in both maps, by uid then name (point's order first).

    An operator in only one map is the uid check's business (``check_restorable``), not
    this one's. A switch between a plain function (None) and a process function is one
    ``LAYOUT`` row named ``*``; two plain functions give no row.
    """
    rows: list[StateChange] = []
    for uid in sorted(set(recorded) & set(declared)):
        old, new = recorded[uid], declared[uid]
        if old is None and new is None:
            continue
        if old is None or new is None:
            rows.append(StateChange(uid, "*", Change.LAYOUT, _layout(old), _layout(new)))
            continue
        before = {d["name"]: d for d in old}
        after = {d["name"]: d for d in new}
        names = [*before, *(n for n in after if n not in before)]
        rows += [_compare_state(uid, n, before.get(n), after.get(n)) for n in names]
    return rows


def _layout(schemas: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """A process function's states as one pseudo schema (for a ``LAYOUT`` row)."""
    if schemas is None:
        return None
    names = ", ".join(d["name"] for d in schemas) or "none"
    return {"kind": "process function", "type": f"states {names}"}


def check_evolution(
    point: RestorePoint, declared: Declared, allow_non_restored_state: bool = False
) -> list[StateChange]:
    """Refuse a restore of ``point`` into operators declaring incompatible state.

    Steps: 1. compare the point's recorded descriptors with ``declared``; 2. refuse a changed
    kind, type or layout (always) and a dropped state (unless ``allow_non_restored_state``),
    naming every one in one line; 3. return the dropped states.

    Raises:
        IncompatibleCheckpoint: a refused change (the message names operator, state, fix).
    """
    # Step 1
    changes = compare(recorded_descriptors(point.metadata), declared)
    # Step 2
    refused = [c for c in changes if c.refused]
    if not allow_non_restored_state:
        refused += [c for c in changes if c.change is Change.DROPPED]
    if refused:
        raise IncompatibleCheckpoint("; ".join(c.problem(point.location) for c in refused))
    # Step 3
    return [c for c in changes if c.change is Change.DROPPED]


def declared_from_point(meta: CheckpointMetadata | None, uids: Iterable[str]) -> Declared:
    """The descriptors a pipeline is taken to declare when its code is not at hand: those
    ``meta`` (its latest checkpoint) records for ``uids``; empty without a checkpoint."""
    if meta is None:
        return {}
    recorded = recorded_descriptors(meta)
    return {uid: recorded[uid] for uid in uids if uid in recorded}
