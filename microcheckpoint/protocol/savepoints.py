"""Savepoints and choosing what to restore.

A savepoint is a self-contained copy of a completed checkpoint: every state file is
copied next to its ``_metadata`` and referenced by a relative key, so the folder can be
moved, and it is never subsumed or deleted by retention. Restoring writes the pipeline's
``_restore`` marker; the next trigger starts from the restored offsets (docs/protocol.md).

Claim modes (as in Flink): ``NO_CLAIM`` (default) leaves the restored files alone and
makes the first checkpoint after the restore a full snapshot; ``CLAIM`` lets the pipeline
reference them from incremental checkpoints and take ownership: retention deletes a claimed
savepoint under the pipeline's folder once nothing needs it (``retention.claimed_folder``).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from microcheckpoint.errors import (
    CheckpointNotFound,
    ConfigError,
    IncompatibleCheckpoint,
    MetadataFormatError,
    RestoreError,
)
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import (
    CancelRecord,
    CheckpointMetadata,
    ClaimMode,
    RestoreMarker,
    encode,
    encode_metadata,
    read_point_metadata,
)
from microcheckpoint.protocol.restores import record_restore, subtasks
from microcheckpoint.protocol.view import PipelineView, scan
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = [
    "check_restorable",
    "ClaimMode",
    "RestorePoint",
    "choose_restore",
    "create_savepoint",
    "list_savepoints",
    "read_savepoint",
    "resolve_point",
    "restore",
    "savepoint_folder",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestorePoint:
    """What a restore starts from; ``note`` says loudly when it fell back to an older checkpoint."""

    location: str
    metadata: CheckpointMetadata
    store: ObjectStore
    prefix: str  # folder of the _metadata inside ``store``
    note: str = ""

    def handle_keys(self) -> list[str]:
        """Store keys of every state file (relative handles resolved against ``prefix``)."""
        if self.metadata.relative:
            return [self.prefix + h.key for h in self.metadata.handles]
        return [h.key for h in self.metadata.handles]


def savepoint_folder(layout: Layout, target_prefix: str | None, name: str) -> str:
    """The key prefix of savepoint ``name``: under ``target_prefix`` (``""``: the target
    store's root itself), or ``<pipeline>/savepoints/`` when None."""
    parent = layout.savepoints if target_prefix is None else target_prefix.strip("/")
    return (parent.rstrip("/") + "/" if parent else "") + name + "/"


def _check_files(store: ObjectStore, keys: list[str]) -> str | None:
    for key in keys:
        if not store.exists(key):
            return f"state file {store.child_url(key)} is missing"
    return None


def create_savepoint(
    store: ObjectStore,
    pipeline: str,
    checkpoint: CheckpointId | None = None,
    target: ObjectStore | None = None,
    target_prefix: str | None = None,
    labels: Mapping[str, Any] | None = None,
) -> str:
    """Copy a completed checkpoint (default: the latest) into a self-contained savepoint.

    ``labels`` (e.g. the Airflow run that asked for it) are kept in its ``_metadata`` with
    the time it was taken (``created_ms``), for the history.

    Steps: 1. read the checkpoint's ``_metadata``; 2. copy every state file under the
    savepoint folder; 3. write the savepoint's ``_metadata`` last, put-if-absent, so a
    savepoint is either whole or absent. Returns the savepoint's URL.
    """
    layout = Layout(pipeline)
    view = scan(store, layout)
    cid = checkpoint or view.latest_completed
    if cid is None or cid not in view.completed:
        raise CheckpointNotFound(
            f"pipeline {pipeline!r} has no completed checkpoint{f' {cid}' if cid else ''} to take a savepoint "
            f"from (completed: {[c.value for c in view.completed]}); run a checkpoint first"
        )
    # Step 1: the source.
    meta = view.metadata(cid)
    target = target or store
    name = f"savepoint-{cid.value:010d}-{uuid.uuid4().hex[:6]}"
    prefix = savepoint_folder(layout, target_prefix, name)
    # Step 2: copy state files; handles become relative to the savepoint folder.
    acks = {}
    for task, ack in meta.acks.items():
        handles = []
        for handle in ack.handles:
            obj = store.get(handle.key)
            if obj is None:
                raise RestoreError(f"checkpoint {cid}: {store.child_url(handle.key)} is missing")
            relative = "files/" + handle.key.split("/", 1)[1]
            # A savepoint copies only intact files (a corrupt one would outlive its source).
            target.put(prefix + relative, handle.check(obj.data, store.child_url(handle.key)))
            handles.append(replace(handle, key=relative))
        acks[task] = replace(ack, handles=tuple(handles))
    # Step 3: the savepoint's commit point.
    facts = {**(labels or {}), "created_ms": int(time.time() * 1000)}
    saved = replace(meta, acks=acks, kind="savepoint", relative=True, labels=facts)
    if write_once(target, prefix + "_metadata", encode_metadata(saved)) is not WriteOutcome.OK:
        raise RestoreError(f"savepoint {target.child_url(prefix)} already exists")
    return target.child_url(prefix + "_metadata").rsplit("/", 1)[0]


def read_savepoint(store: ObjectStore, prefix: str) -> RestorePoint:
    """Read the savepoint (or checkpoint) folder ``prefix`` in ``store``."""
    prefix = prefix.rstrip("/") + "/"
    meta = read_point_metadata(store, prefix)
    return RestorePoint(store.child_url(prefix.rstrip("/")), meta, store, prefix)


def list_savepoints(store: ObjectStore, pipeline: str) -> list[str]:
    """Savepoint folders (keys) under the pipeline's ``savepoints/``, oldest first."""
    base = Layout(pipeline).savepoints
    return sorted(k[: -len("_metadata")] for k in store.list(base) if k.endswith("/_metadata"))


def choose_restore(
    store: ObjectStore,
    pipeline: str,
    checkpoint: CheckpointId | None = None,
    savepoint: tuple[ObjectStore, str] | str | None = None,
) -> RestorePoint | None:
    """Pick what to restore: a given savepoint, a given checkpoint, or the latest completed.

    ``savepoint`` is the folder's URL (what ``create_savepoint`` returns) when it lies in
    ``store``, or ``(store, key prefix)`` for a folder in another store.

    The latest completed checkpoint is verified (``_metadata`` readable, every state
    file present); if it is not usable, the previous retained one is used and
    ``note`` says why. Returns None for a pipeline with no completed checkpoint.

    Raises:
        IncompatibleCheckpoint: the savepoint or checkpoint belongs to another pipeline.
        CheckpointNotFound: the requested checkpoint is not completed or does not exist.
    """
    if isinstance(savepoint, str):
        savepoint = (store, _prefix_in(store, savepoint))
    if savepoint is not None:
        point = read_savepoint(*savepoint)
        _check_pipeline(point, pipeline)
        return point
    layout = Layout(pipeline)
    view = scan(store, layout)
    if checkpoint is not None:
        if checkpoint not in view.completed:
            raise CheckpointNotFound(
                f"checkpoint {checkpoint} of {pipeline!r} is not a completed checkpoint "
                f"(completed: {[c.value for c in view.completed]})"
            )
        point = _checkpoint_point(view, checkpoint)
        _check_pipeline(point, pipeline)
        return point
    problems = []
    for cid in reversed(view.completed):
        try:
            point = _checkpoint_point(view, cid)
        except MetadataFormatError as exc:
            problems.append(f"checkpoint {cid}: {exc}")
            continue
        missing = _check_files(store, point.handle_keys())
        if missing:
            problems.append(f"checkpoint {cid}: {missing}")
            continue
        if problems:
            note = "FELL BACK to checkpoint {} because {}".format(cid, "; ".join(problems))
            log.error("pipeline %s: %s", pipeline, note)
            return replace(point, note=note)
        return point
    if problems:
        raise RestoreError(
            f"no completed checkpoint of {pipeline!r} is usable: {'; '.join(problems)}"
        )
    return None


def _prefix_in(store: ObjectStore, url: str) -> str:
    """The key prefix of folder ``url`` inside ``store``.

    Raises:
        ConfigError: ``url`` is not inside ``store``.
    """
    url = url.strip().rstrip("/").removesuffix("/_metadata")
    if not url.startswith(store.url.rstrip("/") + "/"):
        raise ConfigError(
            "savepoint",
            url,
            f"a folder URL inside {store.url}; for another location pass (store, prefix)",
        )
    return url[len(store.url.rstrip("/")) + 1 :]


def resolve_point(
    text: str,
    pipeline: str,
    store: ObjectStore,
    locate: Callable[[str], tuple[ObjectStore, str]],
) -> RestorePoint:
    """The restore point ``text`` names, as a person writes it (a form, a command line):
    ``latest`` or empty (the latest usable completed checkpoint), a checkpoint id (``7`` or
    ``chk-7``), or the URL of a savepoint or checkpoint folder (its ``/_metadata`` may be
    named too). ``locate(url)`` gives the folder's store and key prefix; it decides which
    URLs are allowed.

    Raises:
        ConfigError: a malformed value (or one ``locate`` refuses).
        CheckpointNotFound: nothing restorable there.
        IncompatibleCheckpoint: the point belongs to another pipeline.
    """
    text = text.strip()
    if text in ("", "latest"):
        point = choose_restore(store, pipeline)
        if point is None:
            raise CheckpointNotFound(
                f"pipeline {pipeline!r} has no completed checkpoint to restore; give a savepoint URL"
            )
        return point
    match = re.fullmatch(r"(?:chk-)?0*([1-9]\d*)", text)
    # Asked for by id or URL, choose_restore raises rather than return None.
    if match:
        cid = CheckpointId(int(match.group(1)))
        return cast(RestorePoint, choose_restore(store, pipeline, checkpoint=cid))
    if "://" not in text:
        raise ConfigError(
            "point", text, "latest, a checkpoint id (7 or chk-7), or a savepoint folder URL"
        )
    folder_store, prefix = locate(text.rstrip("/").removesuffix("/_metadata"))
    return cast(RestorePoint, choose_restore(store, pipeline, savepoint=(folder_store, prefix)))


def _checkpoint_point(view: PipelineView, cid: CheckpointId) -> RestorePoint:
    prefix = view.layout.chk(cid)
    return RestorePoint(
        view.store.child_url(prefix.rstrip("/")), view.metadata(cid), view.store, prefix
    )


def _check_pipeline(point: RestorePoint, pipeline: str) -> None:
    if point.metadata.pipeline != pipeline:
        raise IncompatibleCheckpoint(
            f"{point.location} belongs to pipeline {point.metadata.pipeline!r}, not {pipeline!r}; "
            "restore a savepoint taken from this pipeline"
        )


def check_restorable(
    point: RestorePoint, known_uids: Iterable[str], allow_non_restored_state: bool = False
) -> list[str]:
    """Operator uids whose state in ``point`` the pipeline has no operator for.

    As in Flink, such state is refused unless ``allow_non_restored_state`` (then it is
    dropped, and the uids are returned so the caller can say so).

    Raises:
        IncompatibleCheckpoint: state of unknown uids and ``allow_non_restored_state`` is off.
    """
    known = set(known_uids)
    stored = sorted({str(t.uid) for t in point.metadata.acks if point.metadata.acks[t].handles})
    unknown = [uid for uid in stored if uid not in known]
    if unknown and not allow_non_restored_state:
        raise IncompatibleCheckpoint(
            f"{point.location} holds state of operator(s) {', '.join(unknown)} that pipeline "
            f"{point.metadata.pipeline!r} no longer has (its uids: {', '.join(sorted(known))}); "
            "restore with allow_non_restored_state to drop that state, or restore the operators"
        )
    return unknown


def restore(
    store: ObjectStore,
    pipeline: str,
    point: RestorePoint,
    claim_mode: ClaimMode,
    parallelism: int | None = None,
    offsets: Mapping[TopicPartition, int] | None = None,
    note: str = "",
    labels: Mapping[str, Any] | None = None,
) -> RestoreMarker:
    """Re-base ``pipeline`` on ``point``: the next checkpoint starts from its offsets and state.

    ``offsets`` replaces the point's offsets of those partitions (a global restore moves a
    stage's internal topics past the abandoned epochs of its restored upstream); ``note``
    is added to the marker's note; ``labels`` (e.g. the Airflow run) and the time go into
    the marker for the history.

    Steps: 1. a point in another storage location (another bucket or folder) is first
    copied into this pipeline's ``savepoints/`` as a self-contained savepoint, so its state
    can be restored and stays while referenced; 2. write ``<pipeline>/_restore``; 3. append
    the restore's event to the pipeline's restores (``protocol.restores``).
    Checkpoints already stored stay untouched.
    """
    _check_pipeline(point, pipeline)
    layout = Layout(pipeline)
    # Step 1: bring a foreign point into this store (a folder that already lies in it, named
    # through another root of the same bucket, is used where it is).
    if point.store.url != store.url:
        if point.location.startswith(store.url.rstrip("/") + "/"):
            point = replace(point, store=store, prefix=_prefix_in(store, point.location) + "/")
        else:
            point = _import_point(store, layout, point)
    view = scan(store, layout)
    own = point.prefix.startswith(layout.root + "chk-")
    marker = RestoreMarker(
        source=point.location,
        prefix=point.prefix,
        point_kind=point.metadata.kind,
        checkpoint_id=point.metadata.checkpoint_id.value,
        pipeline_checkpoint=point.metadata.checkpoint_id if own else None,
        claim_mode=ClaimMode(claim_mode),
        after_id=view.max_id.value if view.max_id else 0,
        offsets={**point.metadata.offsets, **(offsets or {})},
        handle_keys=tuple(point.handle_keys()),
        note="; ".join(n for n in (point.note, note) if n),
        parallelism=parallelism,
        at_ms=int(time.time() * 1000),
        labels=dict(labels or {}),
    )
    # Step 2: the marker.
    store.put(layout.restore, encode(marker))
    # Step 3: the durable row of the restores history (the marker is overwritten by the next).
    cancelled = view.marker(layout.cancelled, CancelRecord)
    floor = max(marker.after_id, cancelled.after_id if cancelled is not None else 0)
    record_restore(store, layout, view, marker, subtasks(point.metadata), floor)
    return marker


def _import_point(store: ObjectStore, layout: Layout, point: RestorePoint) -> RestorePoint:
    prefix = f"{layout.savepoints}imported-{point.metadata.checkpoint_id.value:010d}-{uuid.uuid4().hex[:6]}/"
    acks = {}
    for task, ack in point.metadata.acks.items():
        handles = []
        for handle in ack.handles:
            source_key = (point.prefix if point.metadata.relative else "") + handle.key
            obj = point.store.get(source_key)
            if obj is None:
                raise RestoreError(
                    f"{point.location}: {point.store.child_url(source_key)} is missing"
                )
            relative = "files/" + source_key.split("/", 1)[-1]
            data = handle.check(obj.data, point.store.child_url(source_key))
            store.put(prefix + relative, data)
            handles.append(replace(handle, key=relative))
        acks[task] = replace(ack, handles=tuple(handles))
    meta = replace(point.metadata, acks=acks, kind="savepoint", relative=True)
    store.put(prefix + "_metadata", encode_metadata(meta))
    log.warning("restore: copied %s into %s", point.location, store.child_url(prefix))
    return RestorePoint(store.child_url(prefix.rstrip("/")), meta, store, prefix, point.note)
