"""Retention and cleanup: keep ``retained`` completed checkpoints, delete what nothing references.

Reference counting: a state file may be referenced by several completed checkpoints
(incremental snapshots reuse unchanged key groups). A file is deleted only when no
retained checkpoint, no in-flight checkpoint's ack and no active restore references it
(I5).

Savepoints are never touched here, with one exception, Flink's claim mode: a savepoint the
pipeline was restored from with ``CLAIM`` belongs to the pipeline from then on. It counts
as the oldest retained checkpoint: once ``retained`` checkpoints completed after the restore
and none of the retained or in-flight ones references any of its files, it is deleted
(``claimed_folder``). With ``NO_CLAIM`` the restored point is never touched.
"""

from __future__ import annotations

from collections import Counter

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol import layout as names
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack, ClaimMode
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView, RecordCache, scan
from microcheckpoint.storage.port import ObjectStore

__all__ = ["claimed_folder", "cleanup_checkpoint", "enforce_retention", "reference_counts"]


def _is_protocol(name: str) -> bool:
    return name in names.PROTOCOL_FILES or name.startswith(names.ATTEMPT_PREFIX)


def cleanup_checkpoint(
    store: ObjectStore, layout: Layout, cid: CheckpointId, keep: set[str]
) -> int:
    """Delete files in ``chk-<n>/`` other than protocol markers and ``keep``; returns the count."""
    prefix = layout.chk(cid)
    deleted = 0
    for key in list(store.list(prefix)):
        if _is_protocol(key[len(prefix) :]) or key in keep:
            continue
        store.delete(key)
        deleted += 1
    return deleted


def reference_counts(view: PipelineView, retained: int) -> tuple[set[CheckpointId], Counter[str]]:
    """The checkpoints retention keeps, and how many of them (or in-flight acks) reference each file.

    Kept: the newest ``retained`` completed checkpoints, the completed base of every
    checkpoint in flight, and, until a checkpoint after a restore completes, the restored
    checkpoint and every file of the restored point.
    """
    completed = view.completed
    kept = set(completed[-retained:])
    in_flight = view.in_flight
    for cid in in_flight:
        base = view.pending_record(cid).base
        base_record = view.records.get(base) if base is not None else None
        if base_record is not None and base_record.status is CheckpointStatus.COMPLETED:
            kept.add(base_record.checkpoint_id)
    marker = view.restore_marker
    if marker is not None and any(c.value > marker.after_id for c in completed):
        marker = None  # a checkpoint after the restore completed: the point is not needed
    if marker is not None:
        own = marker.pipeline_checkpoint
        if own is not None and own in view.records:
            kept.add(own)
    refs: Counter[str] = Counter()
    for cid in kept:
        refs.update(h.key for h in view.metadata(cid).handles)
    if marker is not None:
        refs.update(marker.handle_keys)
    for cid in in_flight:
        for attempt_acks in _all_acks(view, cid):
            refs.update(h.key for h in attempt_acks.handles)
    return kept, refs


def _all_acks(view: PipelineView, cid: CheckpointId) -> list[Ack]:
    """Every ack stored under ``chk-<n>/acks/`` (all attempts)."""
    found = []
    for key in view.records[cid].keys:
        if "/acks/" in key:
            ack = view.ack(key)
            if ack is not None:
                found.append(ack)
    return found


def claimed_folder(view: PipelineView, retained: int, refs: Counter[str]) -> str | None:
    """The folder of the savepoint restored with ``CLAIM`` that retention deletes now, if any.

    The point counts as the oldest retained checkpoint (Flink's CLAIM): it goes once
    ``retained`` checkpoints completed after the restore and ``refs`` (what the retained and
    in-flight checkpoints reference) counts none of its files. Only a savepoint folder inside
    the pipeline's own folder qualifies (``<pipeline>/savepoints/…``, an imported copy):
    a checkpoint of the pipeline is retention's in both modes anyway, and a folder elsewhere
    (a chosen target, a stage of a global savepoint) may be shared, so it is left alone.
    Returns None under ``NO_CLAIM``, while the restore is still needed, or while referenced.
    """
    marker = view.restore_marker
    if marker is None or marker.claim_mode is not ClaimMode.CLAIM:
        return None
    folder = marker.prefix.rstrip("/") + "/"
    own_folder = folder.startswith(view.layout.root) and marker.pipeline_checkpoint is None
    if not own_folder or folder.startswith(view.layout.root + "chk-"):
        return None
    after = [c for c in view.completed if c.value > marker.after_id]
    if len(after) < retained or any(refs[key] for key in marker.handle_keys):
        return None
    return folder


def enforce_retention(
    store: ObjectStore,
    layout: Layout,
    retained: int,
    cache: RecordCache | None = None,
    view: PipelineView | None = None,
) -> list[CheckpointId]:
    """Drop completed checkpoints beyond the newest ``retained`` and old aborted ones.

    Steps: 1. decide what is kept and count references; 2. for each dropped checkpoint,
    delete ``_pending`` and ``_metadata`` first (it stops being restorable), then every
    file nothing references; 3. in checkpoints that stay and are not in flight (kept completed ones,
    aborted ones kept as history), delete every file other than the protocol markers that
    nothing references (other attempts' state, acks folded into ``_metadata``, a zombie's
    late writes); 4. delete a savepoint restored with ``CLAIM`` once nothing needs it
    (``claimed_folder``): its ``_metadata`` first, then its files. Returns the ids dropped.

    ``view``: a listing to decide on (notify's, taken after its checkpoint completed); by
    default retention lists. Any listing is older than the deletes that follow it, so what
    makes an older one safe is the same: a checkpoint it does not show was triggered after
    it, from the newest completed checkpoint it shows or a newer one, which stay kept, and
    keeps its files in a folder it does not show either; one it shows as pending keeps its
    base and every file its acks name, whatever it became since.
    """
    view = view or scan(store, layout, cache)
    # Step 1: what stays and what it references.
    kept, refs = reference_counts(view, retained)
    oldest_kept = min(kept) if kept else None
    in_flight = (CheckpointStatus.PENDING, CheckpointStatus.COMPLETING)
    dropped = []
    # The deletes go in three rounds, each sent at once (``delete_all``: on S3 one
    # DeleteObjects request a round): every dropped folder's ``_pending``, then their
    # ``_metadata``, then every unreferenced file.
    pendings: list[str] = []
    commits: list[str] = []
    unreferenced: list[str] = []
    for cid, record in sorted(view.records.items()):
        status = record.status
        if status in in_flight:
            continue
        drop = (
            (status is CheckpointStatus.COMPLETED and cid not in kept)
            or (
                status is CheckpointStatus.ABORTED and oldest_kept is not None and cid < oldest_kept
            )
            or status is CheckpointStatus.DISCARDED
        )
        prefix = layout.chk(cid)
        if drop:
            # Step 2: ``_pending`` goes first (a half-dropped folder reads as DISCARDED,
            # never as in flight), then the commit point, then everything unreferenced. A
            # DISCARDED folder has no ``_pending`` left (that is what makes it one).
            markers = {layout.pending(cid), layout.metadata(cid)}
            if status is not CheckpointStatus.DISCARDED:
                pendings.append(layout.pending(cid))
            if status is CheckpointStatus.COMPLETED:
                commits.append(layout.metadata(cid))
            unreferenced += [k for k in record.keys if refs[k] == 0 and k not in markers]
            if status is not CheckpointStatus.DISCARDED:
                dropped.append(cid)
        else:
            # Step 3: a checkpoint that stays keeps its markers and referenced files.
            unreferenced += [
                k for k in record.keys if not _is_protocol(k[len(prefix) :]) and refs[k] == 0
            ]
    for keys in (pendings, commits, unreferenced):
        store.delete_all(keys)
    # Step 4: a claimed savepoint goes whole: first it stops being restorable.
    folder = claimed_folder(view, retained, refs)
    if folder is not None:
        store.delete(folder + names.METADATA)
        store.delete_all(list(store.list(folder)))
    return dropped
