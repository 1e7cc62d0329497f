"""Start offsets for partitions a pipeline has no checkpointed offset for (``startup_mode``)."""

from __future__ import annotations

from collections.abc import Iterable

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig, StartupMode
from microcheckpoint.ids import TopicPartition

__all__ = ["startup_offsets"]


def startup_offsets(
    kafka: KafkaOffsets, config: CheckpointConfig, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, int]:
    """Where a new pipeline (or a new partition) starts, per ``config.startup_mode``.

    - ``group_offsets``: the group's committed offset, else the beginning offset;
    - ``earliest`` / ``latest``: the beginning / end offset;
    - ``timestamp``: the first offset whose record timestamp is at or after
      ``startup_timestamp_ms`` (the end offset if there is none).

    Committed offsets below the log start (deleted by retention) start at the log start.
    """
    tps = list(tps)
    if not tps:
        return {}
    mode = config.startup_mode
    if mode is StartupMode.LATEST:
        return kafka.end_offsets(tps)
    if mode is StartupMode.TIMESTAMP:
        return kafka.offsets_for_times(tps, int(config.startup_timestamp_ms or 0))
    beginning = kafka.beginning_offsets(tps)
    if mode is StartupMode.EARLIEST:
        return beginning
    committed = kafka.committed_group_offsets(config.effective_group_id, tps)
    return {
        tp: beginning[tp] if committed[tp] is None else max(committed[tp], beginning[tp])
        for tp in tps
    }
