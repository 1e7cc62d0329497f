"""What the protocol asks of a source's offsets: its partitions, where it ends, where it starts.

``SourceOffsets`` is the port; ``microcheckpoint.adapters.kafka_offsets.KafkaOffsets``
implements it for Kafka (and Tansu), ``adapters.file_offsets.FileOffsets`` for a folder of
files (``HybridOffsets`` for files, then Kafka), ``adapters.stage_offsets.StageOffsets`` for
a stage input and ``adapters.union_offsets.UnionOffsets`` for a fan-in.

A port may also have optional capabilities, each a ``runtime_checkable`` Protocol that the
recovery path checks with ``isinstance`` (never by probing for a method name, so a renamed
method fails the contract test, ``tests/contract/test_source_capabilities.py``, instead of
silently switching a behaviour off):

| capability | method | who has it | what recovery does with it |
|---|---|---|---|
| ``AlignsOnMarkers`` | ``align(ends, starts, config, waited_s)`` | stage inputs, fan-ins | waits for the upstream's barrier markers, cuts there, records the ``Alignment`` |
| ``ProbesAlignment`` | ``probe(ends, starts, config, waited_s)`` | stage inputs, fan-ins | the alignment sensor's one look, no wait |
| ``LimitsEnds`` | ``limit_ends(ends, starts)`` | file sources, stage inputs | caps or holds back the ranges (when the port does not align) |
| ``NamesFiles`` | ``files_of(tp, start, end, after)`` | file sources | names a range's files in ``_pending`` |

``isinstance`` checks that the method exists, not its signature: the contract test calls
each one. Pure: no client here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

from microcheckpoint.config import CheckpointConfig, StartupMode
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.records.alignment import Alignment

__all__ = [
    "AlignsOnMarkers",
    "LimitsEnds",
    "NamesFiles",
    "ProbesAlignment",
    "SourceOffsets",
    "group_committer",
    "source_partitions",
    "startup_offsets",
]

Offsets = Mapping[TopicPartition, int]


@runtime_checkable
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


@runtime_checkable
class AlignsOnMarkers(Protocol):
    """A stage input: its ranges end at the upstream stage's barrier markers."""

    def align(
        self, ends: Offsets, starts: Offsets, config: CheckpointConfig, waited_s: float = 0
    ) -> tuple[dict[TopicPartition, int], Alignment]:
        """The ranges' ends (each cut just after its channel's marker) and the alignment.

        Waits (polling) for the markers, at most the checkpoint timeout; ``waited_s`` is
        how long a sensor waited already. Raises ``NotAligned`` when they do not come.
        """
        ...


@runtime_checkable
class ProbesAlignment(Protocol):
    """A stage input that can say, in one look, whether ``align`` would wait."""

    def probe(
        self, ends: Offsets, starts: Offsets, config: CheckpointConfig, waited_s: float
    ) -> str | None:
        """None when ``align`` would cut now, else what it waits for (no wait here)."""
        ...


@runtime_checkable
class LimitsEnds(Protocol):
    """A source that caps or holds back its ranges (a file source's ``max_files``)."""

    def limit_ends(self, ends: Offsets, starts: Offsets) -> dict[TopicPartition, int]:
        """``ends``, each at or below its given end and at or above its start."""
        ...


@runtime_checkable
class NamesFiles(Protocol):
    """A file source: positions are files in name order, named in ``_pending``."""

    def files_of(
        self, tp: TopicPartition, start: int, end: int, after: str | None
    ) -> list[str] | None:
        """The files ``[start, end)`` of ``tp``; None for a partition that is not a folder.

        ``after`` is the last file the previous range read (None for the first range); a
        folder whose past changed is refused (``KafkaSourceError``).
        """
        ...


def source_partitions(offsets: SourceOffsets, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics``, in topic order, then by number."""
    tps: list[TopicPartition] = []
    for topic in topics:
        tps.extend(offsets.partitions(topic))
    return tps


def group_committer(
    offsets: SourceOffsets, config: CheckpointConfig
) -> Callable[[Mapping[TopicPartition, int]], None]:
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
    starts: dict[TopicPartition, int] = {}
    for tp in tps:
        offset = committed[tp]
        starts[tp] = beginning[tp] if offset is None else max(offset, beginning[tp])
    return starts
