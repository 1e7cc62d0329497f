"""A completed checkpoint's statistics, with the names of Flink's Checkpoints tab.

Computed when ``_metadata`` is written, from the checkpoint's acks and the alignment its
trigger recorded, and stored in ``_metadata`` (``statistics``, a
``records.statistics.CheckpointStatistics``) and the history:

- ``end_to_end_duration_ms``: trigger to the global ack;
- ``checkpointed_size``: bytes of the state files this checkpoint wrote (its incremental
  part); ``full_size``: bytes of every file it references;
- ``alignment``: a stage input's alignment (``adapters.stage_offsets``), else None;
- ``subtasks``: per task (``uid#subtask``): ``ack_duration_ms`` (its snapshot and ack),
  ``checkpointed_size``, ``full_size``, and for a stage, the stage's ``alignment_duration_ms``,
  ``start_delay_ms``, ``unaligned`` and ``persisted_inflight_bytes`` (every subtask starts at
  the one cut its stage aligned on before the trigger; a fan-in gives only ``unaligned``).
  Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.records.alignment import Alignment
from microcheckpoint.protocol.records.checkpoint import Ack
from microcheckpoint.protocol.records.statistics import CheckpointStatistics, SubtaskStatistics

__all__ = ["checkpoint_statistics"]


def _written(ack: Ack, layout_prefix: str) -> int:
    """Bytes of the files of ``ack`` written by this checkpoint (under its own folder)."""
    return sum(h.size for h in ack.handles if h.key.startswith(layout_prefix))


def checkpoint_statistics(
    cid: CheckpointId,
    acks: Mapping[TaskId, Ack],
    alignment: Alignment | None,
    trigger_time_ms: int,
    completed_time_ms: int,
    checkpoint_prefix: str,
) -> CheckpointStatistics:
    """The statistics of checkpoint ``cid`` (``checkpoint_prefix``: the key prefix of its
    own folder, to tell the files it wrote from the ones it references; ``alignment``: the
    one its trigger recorded, None for a checkpoint without stage inputs)."""
    stage = {} if alignment is None else alignment.subtask_fields()
    subtasks = {
        str(task): SubtaskStatistics(
            ack_duration_ms=ack.duration_ms,
            checkpointed_size=_written(ack, checkpoint_prefix),
            full_size=ack.size,
            **stage,
        )
        for task, ack in sorted(acks.items(), key=lambda item: str(item[0]))
    }
    return CheckpointStatistics(
        checkpoint_id=cid.value,
        end_to_end_duration_ms=completed_time_ms - trigger_time_ms,
        checkpointed_size=sum(s.checkpointed_size for s in subtasks.values()),
        full_size=sum(s.full_size for s in subtasks.values()),
        alignment=alignment,
        subtasks=subtasks,
    )
