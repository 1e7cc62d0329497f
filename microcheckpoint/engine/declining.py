"""A failing task declines its checkpoint before its error propagates.

``declining`` wraps the work of one task of an epoch (a keyed, sink or partition subtask
in its Spark executor; the epoch's driver around the whole job): when the work raises, it
writes the attempt's ``_declined-<k>`` with the task and the cause in one line
(``failure_cause``: the worker's own exception, not Spark's wrapper), then re-raises. The
first decline of an attempt is kept (``protocol.declines``), so a subtask's decline,
written before Spark hands its error to the driver, wins over the driver's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from microcheckpoint.engine.errors import failure_cause
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.declines import decline
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.storage.port import ObjectStore

__all__ = ["declining"]

log = logging.getLogger(__name__)


@contextmanager
def declining(
    store: Callable[[], ObjectStore], pipeline: str, checkpoint_id: int, attempt: int, task: str
) -> Iterator[None]:
    """Decline attempt ``attempt`` of checkpoint ``checkpoint_id`` as ``task`` when the
    ``with`` block raises an ``Exception`` (re-raised unchanged). ``store`` opens the
    checkpoint storage, only then. A decline that cannot be written is logged: it must not
    hide the error it describes."""
    try:
        yield
    except Exception as exc:
        cid = CheckpointId(checkpoint_id)
        try:
            decline(store(), Layout(pipeline), cid, attempt, task, failure_cause(exc))
        except Exception as failed:
            log.warning("task %s could not decline checkpoint %s: %s", task, cid, failed)
        raise
