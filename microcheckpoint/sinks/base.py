"""The sink contract: pre-commit, commit, abort — a two-phase commit driven by checkpoints.

How the engine drives a sink (EXACTLY_ONCE, the default):

1. **pre-commit** (during processing, in the executors): the engine stages subtask ``i``'s
   rows of epoch ``n`` as a file in checkpoint storage (``chk-<n>/sink/<uid>/…``) and acks
   with its handle, so the staged output is part of the checkpoint.
2. **commit** (notify, after ``_metadata``, on the driver): ``Sink.commit(epoch, parts)``
   publishes every part. It must be idempotent per ``(pipeline, uid, epoch)``: called again
   after a crash anywhere inside it, or by a second (zombie) notifier, it publishes nothing
   twice. After a crash, completed-but-uncommitted epochs are committed, in order, before
   anything new runs.
3. **abort**: staged output of an aborted epoch is never published; it is deleted with the
   checkpoint's other files.

In AT_LEAST_ONCE mode the engine calls ``write_at_least_once`` from the executors during
processing instead; a replayed epoch may publish again (duplicates), never lose output.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ConfigError
from microcheckpoint.ids import OperatorUid

__all__ = ["EpochInfo", "Sink"]

Row = dict[str, Any]


@dataclass(frozen=True)
class EpochInfo:
    """Which epoch a sink publishes: the idempotency key is ``(pipeline, uid, checkpoint_id)``.

    ``event_time`` and ``watermark``: whether the pipeline's source has event time, and its
    watermark after the epoch (None: none yet). Notify sets them for a stage sink, whose
    markers carry them downstream (``sinks.stage``); other sinks ignore them.
    ``restorable``: for a sink that ``waits_for_restorable``, what ``wait_restorable`` waits
    for (None: the checkpoint's ``_metadata`` was written before ``commit`` was called).
    """

    pipeline: str
    uid: str
    checkpoint_id: int
    event_time: bool = False
    watermark: int | None = None
    restorable: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    def wait_restorable(self) -> None:
        """Return once the checkpoint's ``_metadata`` is written; raises when it could not
        be (then nothing may become visible)."""
        if self.restorable is not None:
            self.restorable()


class Sink(abc.ABC):
    """A transactional sink. Subclasses set ``uid`` (via ``__init__``) and implement ``commit``."""

    # Whether notify commits an epoch that staged nothing (a stage sink still writes its
    # barrier markers then); other sinks skip such epochs.
    commit_empty_epochs = False
    # Whether ``commit`` calls ``epoch.wait_restorable()`` itself before it makes anything
    # visible, and may write what no reader sees before it (the file sink's data files,
    # which only its manifest makes visible). Otherwise the first use of ``parts`` waits.
    waits_for_restorable = False

    def __init__(self, uid: str) -> None:
        if not uid:
            raise ConfigError("uid", uid, "every sink needs a stable, unique uid")
        try:
            self.uid = OperatorUid(str(uid)).value
        except ValueError as exc:
            raise ConfigError("uid", uid, str(exc)) from exc

    def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare the destination (create a table or topic); idempotent; on the driver."""

    def prepare(self, epoch: EpochInfo) -> None:  # noqa: B027 - optional hook
        """Begin the reads ``commit(epoch, …)`` will need first (the file sink's look for its
        manifest), so they go while the checkpoint is being decided; writes nothing. On the
        driver, once the epoch's tasks are done; ``commit`` may follow, or not (aborted)."""

    def use_storage(self, s3_options: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take the run's S3 settings (endpoint, region, credentials) for an ``s3://``
        destination that was built without its own; idempotent. Called by the engine and the
        pipeline loader, so one endpoint setting reaches every S3 client of a run."""

    @abc.abstractmethod
    def commit(self, epoch: EpochInfo, parts: Sequence[Sequence[Row]]) -> None:
        """Publish epoch ``epoch``: ``parts[i]`` are subtask ``i``'s rows, in a fixed order.

        Idempotent per ``(pipeline, uid, epoch)``: a repeated call publishes nothing twice.
        The first use of ``parts`` may wait until the checkpoint's ``_metadata`` is written
        (a run that notifies right after it completes writes it meanwhile) and raises when
        it could not be: read the rows before publishing anything a reader can see, or set
        ``waits_for_restorable`` and call ``epoch.wait_restorable()`` before it.
        """

    def write_at_least_once(self, epoch: EpochInfo, part: int, rows: Sequence[Row]) -> None:
        """AT_LEAST_ONCE: publish subtask ``part``'s rows of ``epoch`` now (from an executor).

        Parts arrive one by one and may arrive again when an epoch is replayed.
        """
        raise ConfigError(
            "mode", "AT_LEAST_ONCE", f"a sink that supports it; {type(self).__name__} does not"
        )
