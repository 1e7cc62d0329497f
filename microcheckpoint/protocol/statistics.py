"""A completed checkpoint's statistics, with the names of Flink's Checkpoints tab.

Computed when ``_metadata`` is written, from the checkpoint's acks and the labels its
trigger recorded, and stored in ``_metadata`` (``statistics``) and the history:

- ``end_to_end_duration_ms``: trigger to the global ack;
- ``checkpointed_size``: bytes of the state files this checkpoint wrote (its incremental
  part); ``full_size``: bytes of every file it references;
- ``alignment``: a stage input's alignment (``adapters.stage_offsets``), else None;
- ``subtasks``: per task (``uid#subtask``): ``ack_duration_ms`` (its snapshot and ack),
  ``checkpointed_size``, ``full_size``, and for a stage, the stage's ``alignment_duration_ms``,
  ``start_delay_ms``, ``unaligned`` and ``persisted_inflight_bytes`` (every subtask starts at
  the one cut its stage aligned on before the trigger). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.records.checkpoint import Ack

__all__ = ["checkpoint_statistics"]

_STAGE_FIELDS = ("alignment_duration_ms", "start_delay_ms", "unaligned", "persisted_inflight_bytes")


def _written(ack: Ack, layout_prefix: str) -> int:
    """Bytes of the files of ``ack`` written by this checkpoint (under its own folder)."""
    return sum(h.size for h in ack.handles if h.key.startswith(layout_prefix))


def checkpoint_statistics(
    cid: CheckpointId,
    acks: Mapping[TaskId, Ack],
    labels: Mapping[str, Any],
    trigger_time_ms: int,
    completed_time_ms: int,
    checkpoint_prefix: str,
) -> dict[str, Any]:
    """The statistics of checkpoint ``cid`` (``checkpoint_prefix``: the key prefix of its
    own folder, to tell the files it wrote from the ones it references)."""
    alignment = labels.get("alignment")
    stage = {}
    if isinstance(alignment, Mapping):
        stage = {name: alignment[name] for name in _STAGE_FIELDS if name in alignment}
    subtasks = {
        str(task): {
            "ack_duration_ms": ack.duration_ms,
            "checkpointed_size": _written(ack, checkpoint_prefix),
            "full_size": ack.size,
            **stage,
        }
        for task, ack in sorted(acks.items(), key=lambda item: str(item[0]))
    }
    return {
        "checkpoint_id": cid.value,
        "end_to_end_duration_ms": completed_time_ms - trigger_time_ms,
        "checkpointed_size": sum(s["checkpointed_size"] for s in subtasks.values()),
        "full_size": sum(s["full_size"] for s in subtasks.values()),
        "alignment": dict(alignment) if isinstance(alignment, Mapping) else None,
        "subtasks": subtasks,
    }
