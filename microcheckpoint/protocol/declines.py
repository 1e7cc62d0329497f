"""A task declines a checkpoint: which task of an attempt failed first, and why.

Flink's task sends ``DeclineCheckpoint`` with its id and the cause, and the coordinator
aborts the checkpoint naming both. Here the task that fails (a keyed, sink or partition
subtask in its Spark executor, or the epoch's driver for a failure outside them) writes
``_declined-<k>`` for its attempt before its error propagates; the first one wins
(put-if-absent), as the first failure is the cause and the others are its consequences.
``recovery.abort_failed_run`` puts it into the abort (``task word-counts#1: ValueError:
bad row 3``), and the history shows it on a checkpoint still pending (the next run re-runs
it) as on an aborted one. Pure: no Spark, no Airflow.
"""

from __future__ import annotations

import time
import uuid

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import DeclineRecord, encode, read
from microcheckpoint.protocol.view import PipelineView
from microcheckpoint.storage.port import ObjectStore, write_once

__all__ = ["DRIVER", "decline", "read_decline", "stored_decline"]

# The task named when the epoch failed outside every subtask.
DRIVER = "driver"


def decline(
    store: ObjectStore, layout: Layout, cid: CheckpointId, attempt: int, task: str, cause: str
) -> DeclineRecord | None:
    """Record that ``task`` declined attempt ``attempt`` of ``cid`` because of ``cause``.

    Returns the decline stored for the attempt: this one, or the one an earlier task wrote
    (None only when it cannot be read back).
    """
    record = DeclineRecord(task, attempt, cause, int(time.time() * 1000), uuid.uuid4().hex)
    key = layout.declined(cid, attempt)
    write_once(store, key, encode(record))
    return read(store, key, DeclineRecord)


def read_decline(
    store: ObjectStore, layout: Layout, cid: CheckpointId, attempt: int
) -> DeclineRecord | None:
    """The decline of attempt ``attempt`` of ``cid``, if a task declined it."""
    return read(store, layout.declined(cid, attempt), DeclineRecord)


def stored_decline(view: PipelineView, cid: CheckpointId) -> DeclineRecord | None:
    """The decline of ``cid``'s current attempt, read only when the view's listing has it."""
    record = view.records.get(cid)
    if record is None:
        return None
    key = view.layout.declined(cid, record.attempt)
    if key not in record.keys:
        return None
    return read_decline(view.store, view.layout, cid, record.attempt)
