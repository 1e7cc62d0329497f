"""The offsets of an internal topic, where a range ends at the upstream stage's next marker.

``StageOffsets`` is the source port (``protocol.source``) of a ``StageSource``: Kafka's
offsets, with ``limit_ends`` cutting every partition's range at the first barrier marker of
the upstream stage after the range's start (the marker included, so the next epoch starts
after it; the reader drops markers). A partition whose next marker has not arrived is held
back (its range stays empty): the epoch is aligned, every channel up to marker ``n``.
``markers`` tells which channels have it; ``align`` waits until every channel has it (the
barrier alignment) and gives the cut ranges with the alignment's statistics.

Finding a marker reads the partition from the range's start, in the driver, once per
trigger: the cost of one more read of the epoch's records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.adapters.kafka_reader import Split, read_split
from microcheckpoint.errors import NotAligned
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.markers import marker_of

__all__ = ["ChannelMarker", "StageOffsets"]


@dataclass(frozen=True)
class ChannelMarker:
    """The upstream's next marker in one channel: its offset, epoch and record time."""

    offset: int
    epoch: int
    timestamp_ms: int


@dataclass
class StageOffsets:
    """Kafka's offsets for an internal topic written by stage ``upstream`` (its pipeline
    name) through its stage sink ``upstream_uid``."""

    kafka: Any  # KafkaOffsets
    upstream: str
    upstream_uid: str
    timeout_s: float = 60

    def partitions(self, topic: str) -> list[TopicPartition]:
        return self.kafka.partitions(topic)

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.kafka.beginning_offsets(tps)

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.kafka.end_offsets(tps)

    def offsets_for_times(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict:
        return self.kafka.offsets_for_times(tps, timestamp_ms)

    def committed_group_offsets(self, group: str, tps: Iterable[TopicPartition]) -> dict:
        return self.kafka.committed_group_offsets(group, tps)

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self.kafka.commit_group_offsets(group, offsets)

    def markers(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, ChannelMarker | None]:
        """Per channel, the upstream's first marker in ``[start, end)``, or None."""
        tps = list(ends)
        beginning = self.kafka.beginning_offsets([tp for tp in tps if tp not in starts])
        found: dict[TopicPartition, ChannelMarker | None] = {}
        for tp in tps:
            start = starts.get(tp, beginning.get(tp, 0))
            found[tp] = self._first_marker(Split(tp, start, max(start, ends[tp])))
        return found

    def limit_ends(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each range cut just after the upstream's next marker; held at its start (empty)
        where that marker has not arrived."""
        beginning = self.kafka.beginning_offsets([tp for tp in ends if tp not in starts])
        limited = {}
        for tp, marker in self.markers(ends, starts).items():
            start = starts.get(tp, beginning.get(tp, 0))
            limited[tp] = start if marker is None else marker.offset + 1
        return limited

    def align(
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        timeout_s: float,
        poll_s: float = 0.25,
    ) -> tuple[dict[TopicPartition, int], dict[str, Any]]:
        """Wait until every channel has the upstream's next marker, then give each range cut
        just after it, and the alignment's statistics (Flink's names, in milliseconds):

        - ``alignment_duration_ms``: from the first channel's marker to the last one's
          (the markers' record times);
        - ``start_delay_ms``: from the first marker to now, when this stage's checkpoint
          starts;
        - ``waited_ms``: how long this call waited for markers;
        - ``epoch``: the upstream's checkpoint the markers end; ``channels``; ``unaligned``
          (False: every channel was read up to its marker).

        Raises:
            NotAligned: after ``timeout_s`` some channels still have no marker (the message
                names them and the upstream), or the channels' markers end different epochs.
        """
        started = time.monotonic()
        tps = list(ends)
        while True:
            markers = self.markers(ends, starts)
            missing = sorted(str(tp) for tp, marker in markers.items() if marker is None)
            if not missing:
                break
            if time.monotonic() - started > timeout_s:
                raise NotAligned(
                    f"stage input {', '.join(sorted(str(tp) for tp in tps))}: channels "
                    f"{', '.join(missing)} have no barrier marker of stage {self.upstream!r} "
                    f"(sink {self.upstream_uid!r}) after {timeout_s:g} s; the upstream stage "
                    "has not completed its next checkpoint. Run the upstream stage, or raise "
                    "the checkpoint timeout"
                )
            time.sleep(poll_s)
            ends = self.kafka.end_offsets(tps)
        found = {tp: marker for tp, marker in markers.items() if marker is not None}
        epochs = sorted({marker.epoch for marker in found.values()})
        if len(epochs) > 1:
            raise NotAligned(
                f"stage input of {self.upstream!r}: the channels' next markers end different "
                f"epochs {epochs} ({', '.join(f'{tp}: {m.epoch}' for tp, m in sorted(found.items()))}); "
                "the internal topic was written by two runs of the upstream stage. Restore both "
                "stages from one global savepoint"
            )
        times = [marker.timestamp_ms for marker in found.values()]
        now_ms = int(time.time() * 1000)
        stats = {
            "upstream": self.upstream,
            "epoch": epochs[0] if epochs else None,
            "channels": len(found),
            "alignment_duration_ms": max(times) - min(times) if times else 0,
            "start_delay_ms": max(0, now_ms - min(times)) if times else 0,
            "waited_ms": int((time.monotonic() - started) * 1000),
            "unaligned": False,
        }
        return {tp: marker.offset + 1 for tp, marker in found.items()}, stats

    def _first_marker(self, split: Split) -> ChannelMarker | None:
        bootstrap = self.kafka.bootstrap_servers
        for record in read_split(bootstrap, split, timeout_s=self.timeout_s):
            marker = marker_of(record.headers)
            if marker and marker.stage == self.upstream and marker.uid == self.upstream_uid:
                return ChannelMarker(record.offset, marker.epoch, record.timestamp_ms)
        return None
