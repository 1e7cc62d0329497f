"""What the protocol asks of a source's offsets: its partitions, where it ends, where it starts.

``SourceOffsets`` is the port; ``microcheckpoint.adapters.kafka_offsets.KafkaOffsets``
implements it for Kafka (and Tansu), ``adapters.file_offsets.FileOffsets`` for a folder of
files (and ``HybridOffsets`` for files, then Kafka). A port may also have
``limit_ends(ends, starts)`` (cap or hold back ranges), ``files_of(tp, start, end, after)``
(name the files of a range) and ``align(ends, starts, config)`` (wait for an upstream
stage's barrier markers, cut the ranges there, give the alignment statistics); the recovery
path uses them when present. Pure: no client here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from microcheckpoint.config import CheckpointConfig, StartupMode
from microcheckpoint.ids import TopicPartition

__all__ = ["SourceOffsets", "group_committer", "source_partitions", "startup_offsets"]


class SourceOffsets(Protocol):
    """Offset queries and group commits against one source cluster.

    Every end offset is exclusive: one past the partition's last record.
    """

    def partitions(self, topic: str) -> list[TopicPartition]: ...

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]: ...

    def offsets_for_times(
        self, tps: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int]: ...

    def committed_group_offsets(
        self, group: str, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]: ...

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None: ...


def source_partitions(offsets: SourceOffsets, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics``, in topic order, then by number."""
    tps: list[TopicPartition] = []
    for topic in topics:
        tps.extend(offsets.partitions(topic))
    return tps


def group_committer(offsets: SourceOffsets, config: CheckpointConfig):
    """The ``commit_offsets`` callback of notify: the pipeline's consumer group moves."""
    return lambda ends: offsets.commit_group_offsets(config.effective_group_id, dict(ends))


def startup_offsets(
    offsets: SourceOffsets, config: CheckpointConfig, tps: Iterable[TopicPartition]
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
        return offsets.end_offsets(tps)
    if mode is StartupMode.TIMESTAMP:
        return offsets.offsets_for_times(tps, int(config.startup_timestamp_ms or 0))
    beginning = offsets.beginning_offsets(tps)
    if mode is StartupMode.EARLIEST:
        return beginning
    committed = offsets.committed_group_offsets(config.effective_group_id, tps)
    return {
        tp: beginning[tp] if committed[tp] is None else max(committed[tp], beginning[tp])  # type: ignore[type-var]
        for tp in tps
    }
