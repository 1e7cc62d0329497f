"""Verify a restore point: read what its ``_metadata`` references, as a restore would.

``dry_run_restore``, the core of ``microcheckpoint verify``, reads the point's ``_metadata``
and then every file its acknowledgements reference, once each, and reports one ``Check`` row
per file. Nothing is written.

What a handle references decides how it is checked, and the handle's **key tail** decides
what it references, against the uid of the task whose ack holds it:

- ``…/state/<uid>/<folder>/<name>`` with ``<name>`` one of the state formats of
  ``state.files`` (``base.parquet``, ``delta.parquet``, ``state.json``, ``kg-<n>.parquet``,
  ``delta.json``, and operator state's ``operator.json``): a **state file**. It must exist,
  have the handle's size and content hash (``StateHandle.check``; handles written before
  hashes have none), and decode as state rows of its format.
- ``…/sink/<uid>/part-<subtask>-a<attempt>.jsonl``: a **staged sink part** (EXACTLY_ONCE
  sinks, ``engine.sinkstage``). It must exist and have the handle's size and content
  hash; it is never parsed, since it is sink output, not state.
- anything else: a failed row. A file verify cannot classify is never passed unread (a
  newer microcheckpoint may have written it: upgrade).

Why the tail and not the key groups: a ``memory`` subtask that owns no key writes a
``state.json`` with no key groups, like a sink part. The tails are fixed by
``Layout.state_prefix``, ``Layout.sink_part`` and ``state.bootstrap`` (``files/bootstrap/
state/<uid>/<subtask>/``), and savepoints, imports and CLAIM-mode checkpoints keep them
(``files/`` + the original key), so the rule holds for every copy. Requiring the ack's
own uid in the tail means a state file and a sink part cannot be confused: a state name
never ends ``.jsonl`` and ``sink/<uid>/`` is never followed by a folder.

Then one row per state descriptor the point records (``state.evolution``): the state as
stored, or, given the pipeline's descriptors, as the restore would treat it: kept, added,
fields or TTL changed (ok), dropped (a WARNING: the restore needs
``allow_non_restored_state``), a changed kind, type or layout (failed).

A point's ``_metadata`` that cannot be read is a verification result too:
``dry_run_restore`` turns the resolver's ``MetadataFormatError`` (and the ``RestoreError``
of ``latest`` when no checkpoint is usable) into a failed ``_metadata`` row naming the
file. Kafka offsets are not checked here (the core imports no Kafka client); the caller
adds those rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from microcheckpoint.errors import CorruptFile, InvalidValue, MetadataFormatError, RestoreError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.savepoints import RestorePoint
from microcheckpoint.state.evolution import Change, Declared, compare, recorded_descriptors
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "Check",
    "FileKind",
    "Verification",
    "classify",
    "dry_run_restore",
    "state_rows",
    "verify_chain",
    "verify_point",
]

_STATE_NAME = re.compile(
    r"(base\.parquet|delta\.parquet|state\.json|delta\.json|kg-\d{5}\.parquet|operator\.json)"
)
_SINK_NAME = re.compile(r"part-\d{5}-a\d{5}\.jsonl")


@dataclass(frozen=True)
class Check:
    """One row of a verification: what was checked, whether it passed, and why.

    ``warning`` marks a row that passed but needs a person's attention (the point still
    verifies).
    """

    check: str
    ok: bool
    detail: str
    warning: bool = False

    def to_json(self) -> dict[str, Any]:
        """``check``, ``ok``, ``detail``, and ``warning`` only when it is set."""
        out: dict[str, Any] = {"check": self.check, "ok": self.ok, "detail": self.detail}
        if self.warning:
            out["warning"] = True
        return out


@dataclass(frozen=True)
class Verification:
    """The rows of one verification; ``point`` is None when its ``_metadata`` was unreadable."""

    point: RestorePoint | None
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


class FileKind(Enum):
    """What a handle references (see the module docstring); the value names it in rows."""

    STATE = "state file"
    SINK_PART = "staged sink part"
    UNKNOWN = "unknown file"


def classify(handle: StateHandle, uid: str) -> FileKind:
    """The ``FileKind`` of ``handle`` held by an ack of operator ``uid``, from its key tail.

    Edge cases: a ``state.json`` with no key groups is a state file; a key with fewer
    folders than the rule needs, or another operator's folder, is ``UNKNOWN``.
    """
    parts = ["", "", "", "", *handle.key.split("/")]  # padded: short keys match nothing
    if parts[-4] == "state" and parts[-3] == uid and _STATE_NAME.fullmatch(parts[-1]):
        return FileKind.STATE
    if parts[-3] == "sink" and parts[-2] == uid and _SINK_NAME.fullmatch(parts[-1]):
        return FileKind.SINK_PART
    return FileKind.UNKNOWN


def _check_file(store: ObjectStore, key: str, handle: StateHandle, kind: FileKind) -> Check:
    """Step 2 of ``verify_point`` for one file."""
    url, what = store.child_url(key), kind.value
    if kind is FileKind.UNKNOWN:
        return Check(
            url,
            False,
            f"{handle.key} is neither a state file nor a staged sink part of its operator; "
            "it was not read (written by a newer microcheckpoint? upgrade it)",
        )
    obj = store.get(key)
    if obj is None:
        return Check(url, False, f"{what} is missing; restore another checkpoint or savepoint")
    try:
        handle.check(obj.data, url, what)
    except CorruptFile as exc:
        return Check(url, False, str(exc))
    hashed = ", sha256 matches" if handle.sha256 else ", no content hash (written before them)"
    if kind is FileKind.SINK_PART:
        return Check(url, True, f"{what}, {handle.size} bytes{hashed} (sink output is not parsed)")
    from microcheckpoint.state.files import rows_of  # pyarrow: not at the CLI's start

    try:
        rows = rows_of(obj.data, handle, url)
    except MetadataFormatError as exc:
        return Check(url, False, str(exc))
    return Check(url, True, f"{what}, {handle.size} bytes{hashed}, {rows.num_rows} rows")


def verify_point(point: RestorePoint) -> list[Check]:
    """The ``_metadata`` row, then one row per file the point's acks reference.

    Steps: 1. the ``_metadata`` row (it was read when ``point`` was resolved), and a WARNING
    row when the point fell back to an older checkpoint (``point.note``); 2. each file once
    (two acks of a rescaled operator may reference the same one), in ack order, checked by
    its ``FileKind``. Reads every file fully; writes nothing.
    """
    meta = point.metadata
    # Step 1: the _metadata.
    files: dict[str, tuple[StateHandle, FileKind]] = {}
    for task in sorted(meta.acks, key=str):
        for handle in meta.acks[task].handles:
            key = point.prefix + handle.key if meta.relative else handle.key
            files.setdefault(key, (handle, classify(handle, task.uid.value)))
    what = f"{meta.kind} {meta.checkpoint_id.value}" if meta.kind == "checkpoint" else meta.kind
    checks = [
        Check(
            "_metadata",
            True,
            f"{point.store.child_url(point.prefix + '_metadata')}: {what} of "
            f"{meta.pipeline!r}, {len(meta.acks)} tasks, {len(files)} files (format ok)",
        )
    ]
    if point.note:
        checks.append(Check("latest", True, point.note, warning=True))
    # Step 2: the files.
    checks += [_check_file(point.store, key, h, kind) for key, (h, kind) in files.items()]
    return checks


def state_rows(point: RestorePoint, declared: Declared | None = None) -> list[Check]:
    """One row per state of the point's keyed process operators, by uid and name.

    Without ``declared`` (the pipeline's descriptors) a row shows the state as recorded;
    with it, the change a restore would see. Edge cases: operators that only one side has
    give no rows (the uid check's business); a plain ``KeyedOperator(fn)`` gives none.
    """
    recorded = recorded_descriptors(point.metadata)
    changes = compare(recorded, recorded if declared is None else declared)
    rows = []
    for c in changes:
        dropped = c.change is Change.DROPPED
        detail = c.detail() + (": restore with allow_non_restored_state" if dropped else "")
        rows.append(Check(f"state {c.uid}/{c.name}", not c.refused, detail, warning=dropped))
    return rows


def dry_run_restore(
    resolve: Callable[[], RestorePoint],
    more: Callable[[RestorePoint], Iterable[Check]] | None = None,
    declared: Declared | None = None,
) -> Verification:
    """Resolve a point and verify it: ``verify_point``'s rows, then ``more(point)``'s.

    Steps: 1. ``resolve()``; an unreadable ``_metadata`` (corrupt, empty, foreign) or no
    usable checkpoint for ``latest`` is one failed ``_metadata`` row whose detail names the
    file; 2. ``verify_point``, then ``state_rows`` (against ``declared``, the pipeline's
    state descriptors, when given); 3. the caller's rows (the CLI's Kafka offsets).

    Raises:
        Whatever ``resolve`` raises for bad input (a malformed point, no such checkpoint,
        another pipeline's point), unchanged.
    """
    # Step 1: the point.
    try:
        point = resolve()
    except (MetadataFormatError, RestoreError) as exc:
        return Verification(None, (Check("_metadata", False, str(exc)),))
    # Steps 2 and 3: its files, then the caller's checks.
    checks = verify_point(point) + state_rows(point, declared)
    if more is not None:
        checks += more(point)
    return Verification(point, tuple(checks))


def verify_chain(
    store: ObjectStore, pipeline: str, first: int, last: int
) -> tuple[list[CheckpointId], list[Check]]:
    """Prove the lineage from checkpoint ``first`` to ``last``: the checkpoints it holds, in
    order, and one row per fact (``verify --from first --to last``).

    Steps: 1. follow ``base`` links back from ``last`` until ``first``: each checkpoint on
    the way must be completed; 2. per checkpoint, one writer: its COMPLETED claim
    (``_outcome``) is its ``_metadata``'s writer's, and every ack is of its attempt;
    3. per link, the SHA-256 of the base's ``_metadata`` bytes is the one the next
    checkpoint recorded (``previous_sha256``), and each partition's offsets continue where
    the base's ended (no gap, no overlap); 4. every file each checkpoint references, once,
    with its size and hash (``verify_point``). Writes nothing.

    Raises:
        InvalidValue: ``first`` or ``last`` is not a checkpoint id, or ``first > last``.
    """
    from microcheckpoint.protocol.history import run_attempt
    from microcheckpoint.protocol.layout import Layout
    from microcheckpoint.protocol.records import OutcomeRecord, read
    from microcheckpoint.protocol.view import CheckpointStatus, scan

    for name, value in (("--from", first), ("--to", last)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidValue(f"{name} {value!r} is not a checkpoint id: give a number >= 1")
    if first > last:
        raise InvalidValue(f"--from {first} is after --to {last}: give --from <= --to")
    layout = Layout(pipeline)
    view = scan(store, layout)
    rows: list[Check] = []
    # Step 1: the lineage, newest first.
    chain: list[CheckpointId] = []
    cid: CheckpointId | None = CheckpointId(last)
    while cid is not None and cid.value >= first:
        record = view.records.get(cid)
        if record is None or record.status is not CheckpointStatus.COMPLETED:
            state = "absent" if record is None else record.status.value.lower()
            after = f" (checkpoint {chain[-1]} continued from it)" if chain else ""
            rows.append(
                Check(
                    f"chk-{cid.value}",
                    False,
                    f"{store.child_url(layout.metadata(cid))}: checkpoint {cid} is {state}, not "
                    f"completed{after}: the chain is broken here; verify a range of retained "
                    "checkpoints (microcheckpoint checkpoints lists them)",
                )
            )
            return list(reversed(chain)), rows
        chain.append(cid)
        base = view.metadata(cid).base
        cid = None if base is None else CheckpointId(base)
    chain.reverse()
    if chain[0].value != first:
        start = view.metadata(chain[0])
        why = "a restore" if start.base is None else f"checkpoint {start.base}"
        rows.append(
            Check(
                f"chk-{first}",
                False,
                f"checkpoint {first} is not in the lineage of checkpoint {last}: the chain "
                f"reaches back to checkpoint {chain[0]}, which continued from {why}",
            )
        )
    seen: set[tuple[Any, ...]] = set()
    for n, cid in enumerate(chain):
        meta = view.metadata(cid)
        # Step 2: one writer.
        outcome = read(store, layout.outcome(cid), OutcomeRecord)
        attempts = sorted({a.attempt for a in meta.acks.values()} - {meta.attempt})
        where = store.child_url(layout.metadata(cid))
        old = meta.previous_sha256 is None  # written before the lineage: see below
        if outcome is not None and outcome.writer and outcome.writer != meta.writer and old:
            # Before the lineage, a completion finished for a crashed claimer carried the
            # finisher's token: not a sign of a second writer by itself.
            rows.append(
                Check(
                    f"chk-{cid.value}",
                    True,
                    f"written before the lineage: writer {meta.writer[:8]}, claimed by "
                    f"{outcome.writer[:8]} (a finished claim, or another writer: not told apart)",
                    warning=True,
                )
            )
        elif outcome is not None and outcome.writer and outcome.writer != meta.writer:
            rows.append(
                Check(
                    f"chk-{cid.value}",
                    False,
                    f"{where} was written by writer {meta.writer[:8]}, but the COMPLETED claim "
                    f"by {outcome.writer[:8]}: another writer's _metadata (a zombie's write "
                    "replayed?); restore an older checkpoint or savepoint",
                )
            )
        elif attempts:
            rows.append(
                Check(
                    f"chk-{cid.value}",
                    False,
                    f"{where} mixes acks of attempts {attempts} into attempt {meta.attempt}",
                )
            )
        else:
            run = f", Airflow run {meta.run}" if meta.run else ""
            rows.append(
                Check(
                    f"chk-{cid.value}",
                    True,
                    f"one writer ({meta.writer[:8]}, attempt {run_attempt(meta.attempt)}{run}), "
                    f"{meta.barrier.record_count} records",
                )
            )
        # Step 3: the link to the checkpoint before it in the range.
        if n:
            rows.append(_link(view, chain[n - 1], cid, store, layout))
        # Step 4: its files, each once across the range (a file two checkpoints reference
        # is checked again if they disagree on its size or hash).
        point = RestorePoint(where, meta, store, layout.chk(cid))
        sizes = {store.child_url(h.key): (h.size, h.sha256) for h in meta.handles}
        for check in verify_point(point)[1:]:
            seen_as = (check.check, *sizes.get(check.check, (None, None)))
            if seen_as not in seen:
                seen.add(seen_as)
                rows.append(check)
    return chain, rows


def _link(
    view: Any, before: CheckpointId, cid: CheckpointId, store: ObjectStore, layout: Any
) -> Check:
    """Step 3 of ``verify_chain`` for checkpoint ``cid`` continuing from ``before``."""
    meta, base = view.metadata(cid), view.metadata(before)
    name = f"chk-{before.value} -> chk-{cid.value}"
    found = view.metadata_sha256(before)
    if meta.previous_sha256 and meta.previous_sha256 != found:
        return Check(
            name,
            False,
            f"{store.child_url(layout.metadata(before))} has sha256 {found[:16]}…, checkpoint "
            f"{cid} continued from one of sha256 {meta.previous_sha256[:16]}…: it was replaced "
            f"after checkpoint {cid} completed (a zombie's write?)",
        )
    problems = [
        f"partition {tp}: checkpoint {before} read it up to {end}, checkpoint {cid} has no "
        "range for it (dropped from the chain)"
        for tp, end in sorted(base.barrier.ends.items(), key=lambda i: str(i[0]))
        if tp not in meta.barrier.ranges
    ]
    for tp, rng in sorted(meta.barrier.ranges.items(), key=lambda i: str(i[0])):
        end = base.barrier.ends.get(tp)
        if end is None or rng.start == end:
            continue
        kind = "a gap: offsets in no checkpoint" if rng.start > end else "an overlap: read twice"
        problems.append(
            f"partition {tp}: checkpoint {before} ended at {end}, checkpoint {cid} starts at "
            f"{rng.start} ({kind})"
        )
    if problems:
        return Check(name, False, "; ".join(problems))
    hashed = (
        "sha256 of its _metadata matches"
        if meta.previous_sha256
        else "no hash of its _metadata recorded (written before the lineage, or its base "
        "was not yet completed then)"
    )
    return Check(
        name,
        True,
        f"{hashed}; offsets continue on {len(meta.barrier.ranges)} partitions",
        warning=not meta.previous_sha256,
    )
