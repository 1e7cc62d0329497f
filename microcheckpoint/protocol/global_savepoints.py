"""Global savepoints: every stage of a multi-stage pipeline at one consistent cut.

A stage's checkpoint that was **aligned** on its upstream's barrier markers of epoch ``e``
holds exactly the upstream's output up to its checkpoint ``e``, and nothing in flight. So
(stage 2 at that checkpoint, stage 1 at its checkpoint ``e``) is a consistent cut, and so on
up a longer chain or a fan-in. A global savepoint is one savepoint per stage, copied from
retained checkpoints forming such a cut: for the last stage, its newest completed checkpoint
whose cut is aligned on every stage input and whose upstream checkpoints are all retained
(and aligned in turn). Like Flink's savepoints, it is always aligned: an unaligned checkpoint
(in-flight channel state) is passed over for an older aligned one.

Layout: ``<folder>/_global`` (JSON, written last and put-if-absent: whole or absent) names
each stage's savepoint folder, relative to ``<folder>``, its checkpoint id and, per stage
input, the upstream epoch and internal topics.

A global restore re-bases every stage on its savepoint, with an optional new parallelism
each. The upstream stages then run their epochs after ``e`` again and write their rows to
the internal topics again; what they wrote after ``e`` before the restore belongs to
abandoned epochs. So each restored stage starts its internal topics at their current end,
taken after every stage is quiet and the upstream's completed checkpoints are all notified:
everything before that end and after the stage's cut is abandoned output. Stages must be
stopped (suspended, nothing in flight) until every marker is written.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import MetadataFormatError, RestoreError
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import ClaimMode, RestoreMarker, decode, encode
from microcheckpoint.protocol.records.alignment import AlignmentMode
from microcheckpoint.protocol.records.global_savepoint import GlobalManifest, StageInput, StagePoint
from microcheckpoint.protocol.recovery import notify_left_behind
from microcheckpoint.protocol.savepoints import create_savepoint, read_savepoint, restore
from microcheckpoint.protocol.source import SourceOffsets, source_partitions
from microcheckpoint.protocol.view import PipelineView, scan
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = [
    "GlobalSavepoint",
    "StageInput",
    "StagePoint",
    "StageRuntime",
    "choose_cut",
    "create_global_savepoint",
    "read_global_savepoint",
    "restore_global",
]

log = logging.getLogger(__name__)

MANIFEST = "_global"
VERSION = 1


@dataclass(frozen=True)
class GlobalSavepoint:
    location: str
    store: ObjectStore
    prefix: str  # the folder holding ``_global``
    stages: tuple[StagePoint, ...]

    def stage(self, pipeline: str) -> StagePoint:
        for point in self.stages:
            if point.pipeline == pipeline:
                return point
        raise RestoreError(
            f"global savepoint {self.location} has no stage {pipeline!r} "
            f"(its stages: {', '.join(p.pipeline for p in self.stages)})"
        )


def _inputs(view: PipelineView, cid: CheckpointId) -> tuple[StageInput, ...] | str:
    """The stage inputs of checkpoint ``cid``, or why its cut is not aligned.

    Read from its statistics' alignment, else from its ``_pending`` (both typed records);
    a checkpoint without an alignment, or a fan-in of plain Kafka inputs only, has none.
    """
    statistics = view.metadata(cid).statistics
    alignment = None if statistics is None else statistics.alignment
    if alignment is None and cid in view.records:
        alignment = view.pending_record(cid).alignment
    if alignment is None:
        return ()  # no stage input: a first stage
    inputs = []
    for part in alignment.parts:
        if part.mode is AlignmentMode.AT_LEAST_ONCE:
            return "at-least-once (no alignment)"
        if part.inflight:
            return "unaligned, with in-flight channel state"
        if part.upstream is None or part.epoch is None or not part.topics:
            return "taken before stage inputs recorded their upstream and topics"
        inputs.append(StageInput(part.upstream, part.epoch, part.topics))
    return tuple(inputs)


def choose_cut(stages: Mapping[str, ObjectStore]) -> dict[str, tuple[int, tuple[StageInput, ...]]]:
    """Per stage (pipeline name → its checkpoint store), the checkpoint of the newest
    consistent aligned cut, and that checkpoint's stage inputs.

    Raises:
        RestoreError: a stage reads an upstream that is not among ``stages``; or no retained
            checkpoints form an aligned cut (the message says what each candidate lacked).
    """
    views = {name: scan(store, Layout(name)) for name, store in stages.items()}
    upstreams: set[str] = set()
    for view in views.values():
        for cid in view.completed:
            inputs = _inputs(view, cid)
            if isinstance(inputs, tuple):
                upstreams.update(i.upstream for i in inputs)
    unknown = sorted(upstreams - set(stages))
    if unknown:
        raise RestoreError(
            f"the stages read upstream stage(s) {', '.join(unknown)} that are not in the "
            f"global savepoint ({', '.join(sorted(stages))}); name every stage"
        )
    finals = [name for name in stages if name not in upstreams]
    cut: dict[str, tuple[int, tuple[StageInput, ...]]] = {}
    for final in finals:
        reasons = []
        for cid in reversed(views[final].completed):
            found: dict[str, tuple[int, tuple[StageInput, ...]]] = {}
            why = _walk(views, final, cid.value, found)
            if why is None and all(cut.get(n, v)[0] == v[0] for n, v in found.items()):
                cut.update(found)
                break
            reasons.append(f"{cid}: {why or 'another final stage needs other checkpoints'}")
        else:
            raise RestoreError(
                f"no retained checkpoints of {final!r} and its upstream stages form an aligned "
                f"cut ({'; '.join(reasons) or 'no completed checkpoint'}); let the stages "
                "complete an aligned checkpoint, or raise the upstream stages' `retained`"
            )
    return cut


def _walk(
    views: Mapping[str, PipelineView],
    name: str,
    cid: int,
    found: dict[str, tuple[int, tuple[StageInput, ...]]],
) -> str | None:
    """Add stage ``name`` at checkpoint ``cid`` and its upstreams to ``found``; why not."""
    view = views[name]
    if CheckpointId(cid) not in view.completed:
        return f"{name!r} no longer retains its checkpoint {cid}"
    if name in found:
        return None if found[name][0] == cid else f"{name!r} is needed at two checkpoints"
    inputs = _inputs(view, CheckpointId(cid))
    if isinstance(inputs, str):
        return f"{name!r} checkpoint {cid} is {inputs}"
    found[name] = (cid, inputs)
    for stage_input in inputs:
        why = _walk(views, stage_input.upstream, stage_input.epoch, found)
        if why is not None:
            return why
    return None


def create_global_savepoint(
    stages: Mapping[str, ObjectStore], target: ObjectStore, target_prefix: str
) -> GlobalSavepoint:
    """Copy the newest aligned cut (``choose_cut``) into savepoints under one folder of
    ``target``, then write its ``_global`` manifest last."""
    cut = choose_cut(stages)
    ids = "-".join(f"{cut[name][0]}" for name in stages)
    prefix = f"{target_prefix.rstrip('/')}/global-{ids}-{uuid.uuid4().hex[:6]}/"
    points = []
    for name, store in stages.items():
        cid, inputs = cut[name]
        url = create_savepoint(
            store, name, CheckpointId(cid), target=target, target_prefix=prefix + name
        )
        folder = url.rstrip("/").rsplit("/", 2)
        points.append(StagePoint(name, cid, f"{folder[-2]}/{folder[-1]}", inputs))
    data = encode(GlobalManifest(tuple(points)))
    if write_once(target, prefix + MANIFEST, data) is not WriteOutcome.OK:
        raise RestoreError(f"global savepoint {target.child_url(prefix)} already exists")
    location = target.child_url(prefix.rstrip("/"))
    log.info("global savepoint %s: %s", location, {n: c for n, (c, _) in cut.items()})
    return GlobalSavepoint(location, target, prefix, tuple(points))


def read_global_savepoint(store: ObjectStore, prefix: str) -> GlobalSavepoint:
    """Read the global savepoint in folder ``prefix`` of ``store``.

    Raises:
        RestoreError: no ``_global`` there, or not one this version reads.
    """
    prefix = prefix.rstrip("/") + "/"
    location = store.child_url(prefix.rstrip("/"))
    obj = store.get(prefix + MANIFEST)
    if obj is None:
        raise RestoreError(
            f"{location} is not a global savepoint (no {MANIFEST}); give the folder that "
            "create_global_savepoint wrote"
        )
    try:
        manifest = decode(GlobalManifest, obj.data, store.child_url(prefix + MANIFEST))
    except MetadataFormatError as exc:
        raise RestoreError(
            f"{location}/{MANIFEST} is not a global savepoint manifest of version {VERSION} "
            f"({exc}); it may be corrupt"
        ) from exc
    return GlobalSavepoint(location, store, prefix, manifest.stages)


@dataclass(frozen=True)
class StageRuntime:
    """What a global restore needs of one stage: its coordinator, its source port (to read
    its internal topics' ends), and its sinks' publish callback (to notify what it left)."""

    coordinator: CheckpointCoordinator
    offsets: SourceOffsets
    publish: Callable[..., Any] | None


def restore_global(
    point: GlobalSavepoint,
    stages: Mapping[str, StageRuntime],
    claim_mode: ClaimMode = ClaimMode.NO_CLAIM,
    parallelism: Mapping[str, int] | None = None,
) -> dict[str, RestoreMarker]:
    """Re-base every stage on its savepoint in ``point``, each with its new parallelism, if
    given (key groups rescale). Stored checkpoints stay untouched.

    Steps: 1. check every stage is named and has nothing in flight; 2. notify every
    completed checkpoint not yet notified (so all the rows the upstream stages will
    abandon are in the internal topics); 3. per stage, its internal topics' end offsets;
    4. write each stage's ``_restore``, its internal topics starting at those ends. Running
    it again before any stage triggers gives the same markers.

    Raises:
        RestoreError: a stage missing on either side, or a stage with checkpoints in flight.
    """
    names = {p.pipeline for p in point.stages}
    if names != set(stages):
        raise RestoreError(
            f"global savepoint {point.location} holds stages {sorted(names)}; restore exactly "
            f"those (given: {sorted(stages)})"
        )
    # Step 1.
    for name, stage in stages.items():
        busy = stage.coordinator.view().in_flight
        if busy:
            raise RestoreError(
                f"stage {name!r} has checkpoint(s) {[c.value for c in busy]} in flight; stop "
                "triggering every stage and wait for them before a global restore"
            )
    # Step 2.
    for stage in stages.values():
        notify_left_behind(stage.coordinator, stage.offsets, stage.publish)
    # Steps 3 and 4.
    markers = {}
    for stage_point in point.stages:
        name = stage_point.pipeline
        stage = stages[name]
        topics = sorted({t for i in stage_point.inputs for t in i.topics})
        ends: dict[TopicPartition, int] = {}
        if topics:
            ends = stage.offsets.end_offsets(source_partitions(stage.offsets, topics))
        saved = read_savepoint(point.store, point.prefix + stage_point.folder)
        note = (
            f"global restore from {point.location}: internal topic(s) {', '.join(topics)} "
            "start at their end (the upstream's abandoned epochs are skipped)"
            if topics
            else f"global restore from {point.location}"
        )
        markers[name] = restore(
            stage.coordinator.store,
            name,
            saved,
            claim_mode,
            parallelism=(parallelism or {}).get(name),
            offsets=ends,
            note=note,
        )
    return markers
