"""The offsets of an internal topic, where a range ends at the upstream stage's marker.

``StageOffsets`` is the source port (``protocol.source``) of a ``StageSource``: Kafka's
offsets, plus ``align``, which decides where each input channel (partition) of a stage's
checkpoint ends, by the checkpointing mode (Flink's three):

- **aligned** (EXACTLY_ONCE, the default): wait until every channel has the upstream's
  marker of the target epoch, then cut every range just after it (the marker included, so
  the next epoch starts after it; the reader drops markers);
- **unaligned** (``unaligned=true``, or when the wait passes ``aligned_timeout``): as soon
  as one channel has the marker, cut the channels that have it there and read the others as
  far as they are; what those still owe up to their marker is the checkpoint's in-flight
  channel state, kept as offset ranges (the records stay in Kafka), and the next epoch
  reads it first, since it starts where this one ended;
- **at-least-once** (AT_LEAST_ONCE): no alignment, every channel read to its end.

The target epoch is the highest of the channels' first markers; a channel whose first
markers are older (it was read past its data, unaligned) skips them. Finding a marker reads
the partition from the range's start, in the driver, once per trigger: the cost of one more
read of the epoch's records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.adapters.kafka_reader import Split, read_split
from microcheckpoint.config import CheckpointConfig, CheckpointingMode
from microcheckpoint.errors import NotAligned
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.markers import marker_of
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    InflightChannel,
    InputAlignment,
)

__all__ = ["ChannelMarker", "StageOffsets"]


@dataclass(frozen=True)
class ChannelMarker:
    """The upstream's marker in one channel: its offset, epoch and record time."""

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
    read_timeout_s: float = 60
    poll_s: float = 0.25
    _scans: dict[TopicPartition, _Scan] = field(default_factory=dict, repr=False)

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
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        epoch: int | None = None,
    ) -> dict[TopicPartition, ChannelMarker | None]:
        """Per channel, the upstream's first marker in ``[start, end)`` (of ``epoch`` or a
        later one, when given; older ones are skipped), or None."""
        scans = {tp: self._scan(tp, start) for tp, start in self._starts(ends, starts).items()}
        return {tp: self._marker(tp, scan, ends[tp], epoch or 0) for tp, scan in scans.items()}

    def limit_ends(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each range cut just after the upstream's next marker; held at its start (empty)
        where that marker has not arrived (what ``align`` does, without waiting)."""
        first = self.markers(ends, starts)
        return {
            tp: start if first[tp] is None else first[tp].offset + 1
            for tp, start in self._starts(ends, starts).items()
        }

    def align(
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        config: CheckpointConfig,
        waited_s: float = 0,
    ) -> tuple[dict[TopicPartition, int], InputAlignment]:
        """The ranges' ends for this stage's next checkpoint, and its alignment statistics
        (an ``InputAlignment``; Flink's names; milliseconds):

        - ``mode``: ``aligned``, ``unaligned`` or ``at_least_once``; ``unaligned`` (bool),
          and ``switched`` when ``aligned_timeout`` made an aligned checkpoint unaligned;
        - ``epoch``: the upstream checkpoint the markers end; ``channels``;
        - ``alignment_duration_ms``: from the first channel's marker to the last one's (the
          markers' record times), over the channels that had it;
        - ``start_delay_ms``: from the first marker to now, when this checkpoint starts;
        - ``waited_ms``: how long this call waited for markers;
        - ``inflight``: per channel read past (unaligned), the range it still owes up to its
          marker: ``{"channel", "from", "until_marker"}``; ``persisted_inflight_bytes`` is 0,
          since that channel state stays in Kafka as offsets.

        Waits (polling) at most ``config.timeout``; in aligned mode, at most
        ``aligned_timeout`` before switching (when it is > 0). ``waited_s``: how long the
        alignment has been waited for already (by the Airflow sensor before the trigger).

        Raises:
            NotAligned: aligned, and after the timeout some channels still have no marker
                (the message names them and the upstream); or no channel has any marker
                (unaligned: a checkpoint starts at the first marker); or the channels'
                markers end different epochs (two runs of the upstream wrote the topic).
        """
        started = time.monotonic() - waited_s
        tps = list(ends)
        if config.mode is CheckpointingMode.AT_LEAST_ONCE:
            return dict(ends), InputAlignment(AlignmentMode.AT_LEAST_ONCE)
        unaligned = config.unaligned
        while True:
            waited = time.monotonic() - started
            target, markers, missing = self._look(ends, starts)
            if target is not None and (not missing or unaligned):
                break
            if target is not None and self._switches(config, waited):
                unaligned = True
                break
            if waited > config.timeout:
                raise self._not_aligned(tps, missing, config)
            time.sleep(self.poll_s)
            ends = self.kafka.end_offsets(tps)
        found = {tp: m for tp, m in markers.items() if m is not None}
        epochs = sorted({m.epoch for m in found.values()})
        if len(epochs) > 1:
            by_channel = ", ".join(f"{tp}: {m.epoch}" for tp, m in sorted(found.items()))
            raise NotAligned(
                f"stage input of {self.upstream!r}: the channels' markers end different "
                f"epochs {epochs} ({by_channel}); the internal topic was written by two runs "
                "of the upstream stage. Restore both stages from one global savepoint"
            )
        times = [m.timestamp_ms for m in found.values()]
        cut = {tp: found[tp].offset + 1 if tp in found else ends[tp] for tp in tps}
        stats = InputAlignment(
            mode=AlignmentMode.UNALIGNED if unaligned else AlignmentMode.ALIGNED,
            epoch=epochs[0],
            upstream=self.upstream,
            topics=tuple(sorted({tp.topic for tp in tps})),
            channels=len(tps),
            alignment_duration_ms=max(times) - min(times),
            start_delay_ms=max(0, int(time.time() * 1000) - min(times)),
            waited_ms=int((time.monotonic() - started) * 1000),
            inflight=tuple(
                InflightChannel(str(tp), ends[tp], epochs[0])
                for tp in sorted(tps)
                if tp not in found
            ),
            persisted_inflight_bytes=0,
            switched=f"aligned_timeout {config.aligned_timeout:g} s"
            if unaligned and not config.unaligned
            else None,
        )
        return cut, stats

    def probe(
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        config: CheckpointConfig,
        waited_s: float,
    ) -> str | None:
        """None when ``align`` would cut now without waiting, else what it waits for; one
        look, no wait (the deferrable Airflow sensor polls it). Channels are read on from
        where this object's previous looks stopped.

        Raises:
            NotAligned: as ``align``, once ``waited_s`` passes the checkpoint timeout.
        """
        if config.mode is CheckpointingMode.AT_LEAST_ONCE:
            return None
        target, _, missing = self._look(ends, starts)
        if target is not None and (not missing or config.unaligned):
            return None
        if target is not None and self._switches(config, waited_s):
            return None
        if waited_s > config.timeout:
            raise self._not_aligned(list(ends), missing, config)
        if target is None:
            return (
                f"no channel of {', '.join(sorted({tp.topic for tp in ends}))} has the next "
                f"barrier marker of stage {self.upstream!r} yet"
            )
        return (
            f"epoch {target} of stage {self.upstream!r}: waiting for its barrier marker in "
            f"channel(s) {', '.join(missing)}"
        )

    def _look(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> tuple[int | None, dict[TopicPartition, ChannelMarker | None], list[str]]:
        """The target epoch (the highest of the channels' next markers), each channel's
        marker of it (None where it has not arrived) and the channels without it."""
        scans = {tp: self._scan(tp, start) for tp, start in self._starts(ends, starts).items()}
        markers = {tp: self._marker(tp, scans[tp], ends[tp], 0) for tp in ends}
        target = max((m.epoch for m in markers.values() if m is not None), default=None)
        for tp, marker in markers.items():
            if marker is not None and marker.epoch < target:
                # Read past its data before (unaligned): skip its older markers.
                markers[tp] = self._marker(tp, scans[tp], ends[tp], target)
        return target, markers, sorted(str(tp) for tp, m in markers.items() if m is None)

    @staticmethod
    def _switches(config: CheckpointConfig, waited_s: float) -> bool:
        """Whether an aligned checkpoint that waited ``waited_s`` turns unaligned."""
        return 0 < config.aligned_timeout <= waited_s

    def _not_aligned(
        self, tps: list[TopicPartition], missing: list[str], config: CheckpointConfig
    ) -> NotAligned:
        return NotAligned(
            f"stage input {', '.join(sorted(str(tp) for tp in tps))}: channels "
            f"{', '.join(missing)} have no barrier marker of stage {self.upstream!r} "
            f"(sink {self.upstream_uid!r}) after {config.timeout:g} s; the upstream "
            "stage has not completed its next checkpoint. Run the upstream stage, or "
            "raise the checkpoint timeout"
        )

    def _scan(self, tp: TopicPartition, start: int) -> _Scan:
        """The channel's scan from ``start``: kept, so records are never read twice."""
        scan = self._scans.get(tp)
        if scan is None or scan.start != start:
            scan = self._scans[tp] = _Scan(start, start)
        return scan

    def _starts(
        self, ends: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        new = [tp for tp in ends if tp not in starts]
        beginning = self.kafka.beginning_offsets(new) if new else {}
        return {tp: starts[tp] if tp in starts else beginning[tp] for tp in ends}

    def _marker(
        self, tp: TopicPartition, scan: _Scan, end: int, min_epoch: int
    ) -> ChannelMarker | None:
        """The channel's first marker of the upstream with epoch >= ``min_epoch`` below
        ``end``: from the markers ``scan`` found already, else read on from where it stopped."""
        for marker in scan.markers:
            if marker.epoch >= min_epoch:
                return marker
        split = Split(tp, scan.position, max(scan.position, end))
        for record in read_split(
            self.kafka.bootstrap_servers, split, timeout_s=self.read_timeout_s
        ):
            scan.position = record.offset + 1
            marker = marker_of(record.headers)
            if marker and marker.stage == self.upstream and marker.uid == self.upstream_uid:
                found = ChannelMarker(record.offset, marker.epoch, record.timestamp_ms)
                scan.markers.append(found)
                if found.epoch >= min_epoch:
                    return found
        scan.position = max(scan.position, end)
        return None


@dataclass
class _Scan:
    """How far a channel has been read from ``start``, and the upstream's markers found."""

    start: int
    position: int
    markers: list[ChannelMarker] = field(default_factory=list)
