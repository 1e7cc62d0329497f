"""A folder of files as a source partition: its offsets are file positions in name order.

``FileOffsets`` answers the protocol's source port (``protocol.source.SourceOffsets``) for a
``FileSource``: one partition (topic ``files.<uid>``), beginning at 0, ending at the number
of data files. ``files_of`` names the files of a barrier's range, and refuses a folder whose
past changed (a file deleted, renamed or inserted before the last one read), since positions
would then point at other files. ``HybridOffsets`` joins it with Kafka's: files first.

Pure: lists through the object-store port, so the same code serves ``file://`` and ``s3://``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ConfigError, KafkaSourceError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.storage.port import ObjectStore

__all__ = ["FileOffsets", "HybridOffsets", "data_files"]


def data_files(store: ObjectStore, prefix: str = "") -> list[str]:
    """The keys of the data files under ``prefix``, in name order (names starting with ``_``
    or ``.`` are not data: markers, temporary files)."""
    found = []
    for key in store.list(prefix):
        name = key.rsplit("/", 1)[-1]
        if name and not name.startswith(("_", ".")):
            found.append(key)
    return sorted(found)


@dataclass
class FileOffsets:
    """The source port for one folder; ``max_files`` caps each epoch's range."""

    store: ObjectStore
    topic: str
    max_files: int | None = None
    _listing: list[str] | None = field(default=None, repr=False)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, 0)

    def listing(self, refresh: bool = False) -> list[str]:
        if self._listing is None or refresh:
            self._listing = data_files(self.store)
        return self._listing

    def partitions(self, topic: str) -> list[TopicPartition]:
        return [self.tp] if topic == self.topic else []

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        count = len(self.listing(refresh=True))
        return dict.fromkeys(tps, count)

    def offsets_for_times(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict:
        raise ConfigError(
            "barrier_policy",
            "data_interval",
            f"policy latest for file source {self.topic!r}: files carry no record timestamps",
        )

    def committed_group_offsets(self, group: str, tps: Iterable[TopicPartition]) -> dict:
        return dict.fromkeys(tps)  # a folder has no consumer group: checkpoints hold its position

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        return None

    def limit_ends(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """``ends`` capped at ``max_files`` files past each start."""
        if self.max_files is None:
            return dict(ends)
        return {
            tp: min(end, starts.get(tp, 0) + self.max_files) if tp == self.tp else end
            for tp, end in ends.items()
        }

    def files_of(
        self, tp: TopicPartition, start: int, end: int, after: str | None
    ) -> list[str] | None:
        """The names of files ``[start, end)``; None for a partition that is not this folder.

        Raises:
            KafkaSourceError: the file at ``start - 1`` is not ``after`` (the last one read),
                so the folder's past changed and positions point at other files.
        """
        if tp != self.tp:
            return None
        names = self.listing()
        if after is not None and start > 0 and (start > len(names) or names[start - 1] != after):
            found = names[start - 1] if 0 < start <= len(names) else "nothing"
            raise KafkaSourceError(
                f"file source {self.store.child_url('')}: position {start - 1} holds {found!r}, "
                f"not {after!r}, the last file read; files were deleted, renamed or added "
                "before it. Only add files whose names sort after the last one, or restore "
                "from a savepoint and reset the source"
            )
        return names[start:end]


@dataclass
class HybridOffsets:
    """Files first, then Kafka: Kafka's partitions join the barrier once every file is read."""

    files: FileOffsets
    kafka: Any

    def partitions(self, topic: str) -> list[TopicPartition]:
        return self.files.partitions(topic) or self.kafka.partitions(topic)

    def _split(self, tps: Iterable[TopicPartition]) -> tuple[list, list]:
        tps = list(tps)
        return [tp for tp in tps if tp == self.files.tp], [tp for tp in tps if tp != self.files.tp]

    def _both(self, method: str, tps: Iterable[TopicPartition], *args: Any) -> dict:
        ours, theirs = self._split(tps)
        out = dict(getattr(self.files, method)(ours, *args)) if ours else {}
        if theirs:
            out.update(getattr(self.kafka, method)(theirs, *args))
        return out

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._both("beginning_offsets", tps)

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._both("end_offsets", tps)

    def offsets_for_times(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict:
        return self._both("offsets_for_times", tps, timestamp_ms)

    def committed_group_offsets(self, group: str, tps: Iterable[TopicPartition]) -> dict:
        ours, theirs = self._split(tps)
        out = self.files.committed_group_offsets(group, ours)
        out.update(self.kafka.committed_group_offsets(group, theirs) if theirs else {})
        return out

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        kafka = {tp: o for tp, o in offsets.items() if tp != self.files.tp}
        if kafka:
            self.kafka.commit_group_offsets(group, kafka)

    def limit_ends(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """While files remain unread, Kafka's partitions stay out of the barrier."""
        ends = self.files.limit_ends(ends, starts)
        tp = self.files.tp
        if starts.get(tp, 0) < len(self.files.listing()):
            return {t: e for t, e in ends.items() if t == tp}
        return ends

    def files_of(
        self, tp: TopicPartition, start: int, end: int, after: str | None
    ) -> list[str] | None:
        return self.files.files_of(tp, start, end, after)
