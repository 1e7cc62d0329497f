"""The replay audit: run epoch N again in a sandbox and compare it with what was committed.

An epoch's input is fixed when it is triggered (its barrier: one offset range per source
partition, or a file list), and its checkpoint names the one it continued from. So epoch N
can be run again as it first ran: from the state of checkpoint N's base, over N's barrier,
at N's trigger time (processing time, state TTL), with N's subtasks. ``audit_epoch`` does
that and compares, operator by operator, what the replay wrote with what N holds:

- a keyed operator: its rows (keys, timers, per key group entries, each with its updated
  time), folded per key group from the state files, then hashed per key group; for each key
  group that differs, the keys whose values differ;
- a sink: each subtask's staged part, by SHA-256 (parts are staged sorted, so equal rows
  are equal bytes); for a part that differs, the rows only one side has;
- every other task (the source, operators with operator state): its inline state and the
  SHA-256 of its files.

The sandbox is a pipeline of its own in the same store (``<pipeline>.audit-<N>-<hex>``):
the replay reads the base's files where they are and writes only there. Nothing is
published (sinks stage, as in any exactly-once epoch; notify never runs), nothing is
committed, no offset moves; the sandbox is deleted afterwards. A deterministic pipeline
gives no difference. A difference names the epoch, the operator, the key group and key (or
the sink part and row): a function that is not deterministic, or input that changed.
It is also a restore rehearsal: it reads every file of the base and the epoch's records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.errors import CheckpointNotFound, ConfigError
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.plan import EpochPlan, epoch_plan
from microcheckpoint.protocol.records import Ack, CheckpointMetadata, read
from microcheckpoint.protocol.view import PipelineView, scan
from microcheckpoint.state.kinds import is_pseudo_key
from microcheckpoint.state.reader import handle_rows
from microcheckpoint.state.verify import Check
from microcheckpoint.storage.port import ObjectStore, each

__all__ = ["Audit", "Difference", "OperatorAudit", "audit_epoch", "plan_audit"]

# Differences listed per operator (the first ones, in key order); the count says how many.
SHOWN = 5


@dataclass(frozen=True)
class Difference:
    """One key (or sink row) where the replay and the commit differ.

    ``where``: the key group (``kg 17``), sink part (``word-sink#1``) or task; ``key``: the
    stored key (canonical JSON) or the row; ``committed`` / ``replayed``: the two values
    (None: that side has none).
    """

    where: str
    key: str
    committed: Any
    replayed: Any

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        def shown(value: Any) -> str:
            return "absent" if value is None else json.dumps(value, sort_keys=True, default=str)

        return (
            f"{self.where} key {self.key}: committed {shown(self.committed)}, "
            f"replayed {shown(self.replayed)}"
        )


@dataclass(frozen=True)
class OperatorAudit:
    """One operator's comparison: how many units (key groups, parts, tasks) were compared,
    how many differ, and the first differences."""

    uid: str
    kind: str  # keyed, sink, source, operator
    compared: int
    differing: int
    differences: tuple[Difference, ...] = ()
    unit: str = "key groups"
    keys: int | None = None  # a keyed operator's keys (committed), pseudo keys left out

    @property
    def ok(self) -> bool:
        return self.differing == 0

    def check(self) -> Check:
        unit = self.unit.removesuffix("s") if self.compared == 1 else self.unit
        units = f"{self.compared} {unit}"
        if self.keys is not None:
            units += f" ({self.keys} keys)"
        if self.ok:
            detail = f"{units} compared, all equal"
        else:
            shown = "; ".join(str(d) for d in self.differences)
            detail = f"{self.differing} of {units} differ: {shown}"
        return Check(f"{self.kind} {self.uid}", self.ok, detail)

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "kind": self.kind,
            "unit": self.unit,
            "compared": self.compared,
            "differing": self.differing,
            "keys": self.keys,
            "ok": self.ok,
            "differences": [d.to_json() for d in self.differences],
        }


@dataclass(frozen=True)
class Audit:
    """The replay of epoch ``checkpoint`` against its commit."""

    pipeline: str
    checkpoint: int
    base: int | None
    records: int
    operators: tuple[OperatorAudit, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.operators)

    def checks(self) -> list[Check]:
        start = "no base (the first checkpoint)" if self.base is None else f"checkpoint {self.base}"
        head = Check(
            "replay",
            True,
            f"epoch {self.checkpoint} from {start}: {self.records} records, in a sandbox "
            f"(nothing published or committed), {self.seconds:.1f} s",
        )
        return [head, *(o.check() for o in self.operators)]

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "checkpoint": self.checkpoint,
            "base": self.base,
            "records": self.records,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "operators": [o.to_json() for o in self.operators],
        }


def plan_audit(store: ObjectStore, pipeline: Any, checkpoint: int) -> EpochPlan:
    """The plan that runs epoch ``checkpoint`` again (``_planned``): an edge calls it to
    refuse bad input before Spark starts."""
    return _planned(store, pipeline, checkpoint)[0]


def _planned(
    store: ObjectStore, pipeline: Any, checkpoint: int
) -> tuple[EpochPlan, CheckpointMetadata]:
    """The plan that runs epoch ``checkpoint`` of ``pipeline`` (a ``Pipeline``) again, as it
    first ran, checked before anything runs, and checkpoint N's ``_metadata``.

    Raises:
        CheckpointNotFound: no such completed checkpoint.
        ConfigError: the epoch cannot be replayed: at least once (its sinks published while
            it ran), its base is no longer stored, it was the first after a restore, or the
            pipeline's operators are not the checkpoint's. Each names the value and the fix.
    """
    view = scan(store, Layout(pipeline.name))
    cid = CheckpointId(checkpoint)
    completed = [c.value for c in view.completed]
    if cid not in view.completed:
        raise CheckpointNotFound(
            f"pipeline {pipeline.name!r} has no completed checkpoint {checkpoint} in "
            f"{store.url} (completed: {completed}); audit one of those"
        )
    meta = view.metadata(cid)
    mode = CheckpointingMode(meta.config.get("mode", CheckpointingMode.EXACTLY_ONCE.value))
    if mode is not CheckpointingMode.EXACTLY_ONCE:
        raise ConfigError(
            "checkpoint",
            checkpoint,
            "an exactly-once epoch: at least once, sinks publish while the epoch runs, so a "
            "replay would publish again",
        )
    base = view.pending_record(cid).base
    if base is None and view.restore_marker is not None:
        raise ConfigError(
            "checkpoint",
            checkpoint,
            "an epoch with a base checkpoint: this one began from a restore; audit a later one",
        )
    if base is not None and base not in view.completed:
        auditable = [c for c in completed if _base_stored(view, CheckpointId(c))]
        raise ConfigError(
            "checkpoint",
            checkpoint,
            f"one whose base is still stored: it continued from checkpoint {base}, which "
            f"retention deleted; these can be audited: {auditable}",
        )
    stored = {t.uid.value for t in meta.acks}
    if stored != set(pipeline.uids):
        raise ConfigError(
            "module",
            sorted(pipeline.uids),
            f"the pipeline that wrote checkpoint {checkpoint}: its operators are {sorted(stored)}",
        )
    plan = epoch_plan(
        view,
        cid,
        meta.attempt,
        incremental=bool(meta.config.get("incremental", True)),
        mode=mode,
        max_parallelism=int(meta.config.get("max_parallelism", 128)),
    )
    return plan, meta


def _base_stored(view: PipelineView, cid: CheckpointId) -> bool:
    base = view.pending_record(cid).base
    return base in view.completed if base is not None else view.restore_marker is None


def audit_epoch(
    spark: Any,
    store: ObjectStore,
    pipeline: Any,
    checkpoint: int,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None = None,
) -> Audit:
    """Run epoch ``checkpoint`` of ``pipeline`` again in a sandbox and compare (module doc).

    Steps: 1. the plan (``plan_audit``: checked before anything runs); 2. the replay, as
    pipeline ``<name>.audit-<N>-<hex>`` in the same store; 3. its acks against the
    checkpoint's, operator by operator; 4. the sandbox deleted, whatever happened.
    """
    from microcheckpoint.engine.runner import run_epoch

    # Step 1: the plan, and the sandbox it runs in.
    plan, meta = _planned(store, pipeline, checkpoint)  # one listing: the plan and N's acks
    sandbox = f"{pipeline.name}.audit-{checkpoint}-{secrets.token_hex(3)}"[-128:]
    layout = Layout(sandbox)
    began = time.monotonic()
    try:
        # Step 2: the replay. Its files and acks go under the sandbox; the base's are read
        # where they are (the plan's handles are store keys).
        replay = dataclasses.replace(pipeline, name=sandbox)
        run_epoch(
            spark,
            replay,
            dataclasses.replace(plan, pipeline=sandbox),
            store,
            bootstrap=bootstrap,
            store_options=store_options,
        )
        seconds = time.monotonic() - began
        # Step 3: compare.
        keys = list(store.list(layout.acks(plan.checkpoint_id, plan.attempt)))
        replayed = {a.task: a for a in each(lambda k: read(store, k, Ack), keys) if a is not None}
        operators = compare(store, pipeline, meta, replayed)
    finally:
        # Step 4: nothing of the sandbox stays.
        store.delete_all(list(store.list(layout.root)))
    return Audit(
        pipeline.name,
        checkpoint,
        None if plan.base is None else plan.base.value,
        plan.barrier.record_count,
        operators,
        seconds,
    )


def compare(
    store: ObjectStore, pipeline: Any, meta: CheckpointMetadata, replayed: Mapping[TaskId, Ack]
) -> tuple[OperatorAudit, ...]:
    """Every operator of ``pipeline``: the committed acks of ``meta`` against ``replayed``."""
    keyed = {op.uid for op in pipeline.operators}
    sinks = {s.uid for s in pipeline.sinks}
    out = []
    for uid in pipeline.uids:
        mine = {t: a for t, a in meta.acks.items() if t.uid.value == uid}
        theirs = {t: a for t, a in replayed.items() if t.uid.value == uid}
        if uid in keyed:
            out.append(_keyed(store, uid, mine, theirs))
        elif uid in sinks:
            out.append(_sink(store, uid, mine, theirs))
        else:
            kind = "source" if uid == pipeline.source.uid else "operator"
            out.append(_tasks(kind, uid, mine, theirs))
    return tuple(out)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _by_key_group(store: ObjectStore, acks: Iterable[Ack]) -> dict[int, dict[str, tuple[Any, int]]]:
    handles = [h for a in acks for h in a.handles]
    groups: dict[int, dict[str, tuple[Any, int]]] = {}
    for kg, key, value, updated in handle_rows(store, handles):
        groups.setdefault(kg, {})[key] = (value, updated)
    return groups


def _digest(rows: Mapping[str, tuple[Any, int]]) -> str:
    body = _canonical(sorted((k, _canonical(v), u) for k, (v, u) in rows.items()))
    return hashlib.sha256(body.encode()).hexdigest()


def _keyed(
    store: ObjectStore, uid: str, mine: Mapping[TaskId, Ack], theirs: Mapping[TaskId, Ack]
) -> OperatorAudit:
    """Per key group: the folded rows' hash; for the groups that differ, the keys."""
    committed = _by_key_group(store, mine.values())
    replayed = _by_key_group(store, theirs.values())
    groups = sorted(set(committed) | set(replayed))
    differing = [
        kg for kg in groups if _digest(committed.get(kg, {})) != _digest(replayed.get(kg, {}))
    ]
    differences: list[Difference] = []
    for kg in differing:
        ours, other = committed.get(kg, {}), replayed.get(kg, {})
        for key in sorted(set(ours) | set(other)):
            if ours.get(key) != other.get(key) and len(differences) < SHOWN:
                differences.append(
                    Difference(
                        f"kg {kg}",
                        key,
                        None if key not in ours else ours[key][0],
                        None if key not in other else other[key][0],
                    )
                )
    missing = _missing(mine, theirs)
    keys = sum(1 for rows in committed.values() for key in rows if not is_pseudo_key(key))
    return OperatorAudit(
        uid, "keyed", len(groups) + len(missing), len(differing) + len(missing),
        tuple(missing + differences), keys=keys,
    )  # fmt: skip


def _missing(mine: Mapping[TaskId, Ack], theirs: Mapping[TaskId, Ack]) -> list[Difference]:
    """Subtasks only one side acked (a replay that did not run them all)."""
    return [
        Difference(str(t), "ack", "acked" if t in mine else None, "acked" if t in theirs else None)
        for t in sorted(set(mine) ^ set(theirs), key=str)
    ]


def _sink(
    store: ObjectStore, uid: str, mine: Mapping[TaskId, Ack], theirs: Mapping[TaskId, Ack]
) -> OperatorAudit:
    """Per subtask: the staged part's SHA-256; for a part that differs, its rows."""
    tasks = sorted(set(mine) | set(theirs), key=lambda t: t.subtask)
    differences: list[Difference] = []
    differing = 0
    for task in tasks:
        ours = _hashes(mine.get(task))
        other = _hashes(theirs.get(task))
        if ours == other and task in mine and task in theirs:
            continue
        differing += 1
        committed = _part_rows(store, mine.get(task))
        replayed = _part_rows(store, theirs.get(task))
        for row in sorted((committed - replayed) + (replayed - committed)):
            if len(differences) < SHOWN:
                differences.append(
                    Difference(str(task), row, committed[row] or None, replayed[row] or None)
                )
    return OperatorAudit(uid, "sink", len(tasks), differing, tuple(differences), "parts")


def _hashes(ack: Ack | None) -> list[str]:
    return [] if ack is None else sorted(h.sha256 or str(h.size) for h in ack.handles)


def _part_rows(store: ObjectStore, ack: Ack | None) -> Counter[str]:
    """A staged part's rows (their JSON lines), counted."""
    rows: Counter[str] = Counter()
    for handle in () if ack is None else ack.handles:
        obj = store.get(handle.key)
        if obj is not None:
            rows.update(line.decode() for line in obj.data.splitlines() if line)
    return rows


def _tasks(
    kind: str, uid: str, mine: Mapping[TaskId, Ack], theirs: Mapping[TaskId, Ack]
) -> OperatorAudit:
    """Per task: its inline state and the SHA-256 of its files."""
    tasks = sorted(set(mine) | set(theirs), key=str)
    differences = []
    for task in tasks:
        ours, other = mine.get(task), theirs.get(task)
        if _task_state(ours) != _task_state(other):
            differences.append(
                Difference(str(task), "state", _task_state(ours), _task_state(other))
            )
    return OperatorAudit(
        uid, kind, len(tasks), len(differences), tuple(differences[:SHOWN]), "tasks"
    )


def _task_state(ack: Ack | None) -> dict[str, Any] | None:
    if ack is None:
        return None
    files = sorted(h.sha256 or f"{h.size} bytes" for h in ack.handles)
    return {"operator_state": dict(ack.operator_state), "files": files}
