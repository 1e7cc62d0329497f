"""The offsets of a fan-in stage's inputs: each topic answered by its input's port.

``UnionOffsets`` is the source port (``protocol.source``) of a ``UnionSource``: every query
is split by topic and sent to the port of the input that reads it (Kafka's offsets, or a
stage input's). ``align`` aligns every stage input on its own upstream's markers and keeps
each input's statistics under ``inputs``; a plain Kafka input is read to its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.records.alignment import FanInAlignment, InputAlignment
from microcheckpoint.protocol.source import AlignsOnMarkers, ProbesAlignment

__all__ = ["UnionOffsets"]


@dataclass
class UnionOffsets:
    """``ports``: ``{input uid: (its topics, its offsets port)}``, in input order."""

    ports: dict[str, tuple[tuple[str, ...], Any]]

    def _port(self, topic: str) -> Any:
        for topics, port in self.ports.values():
            if topic in topics:
                return port
        raise KeyError(topic)

    def _by_port(self, tps: Iterable[TopicPartition]) -> list[tuple[Any, list[TopicPartition]]]:
        groups: dict[int, tuple[Any, list[TopicPartition]]] = {}
        for tp in tps:
            port = self._port(tp.topic)
            groups.setdefault(id(port), (port, []))[1].append(tp)
        return list(groups.values())

    def _each(self, method: str, tps: Iterable[TopicPartition], *args: Any) -> dict:
        out: dict = {}
        for port, group in self._by_port(tps):
            out.update(getattr(port, method)(group, *args))
        return out

    def partitions(self, topic: str) -> list[TopicPartition]:
        return self._port(topic).partitions(topic)

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._each("beginning_offsets", tps)

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._each("end_offsets", tps)

    def offsets_for_times(self, tps: Iterable[TopicPartition], timestamp_ms: int) -> dict:
        return self._each("offsets_for_times", tps, timestamp_ms)

    def committed_group_offsets(self, group: str, tps: Iterable[TopicPartition]) -> dict:
        out: dict = {}
        for port, part in self._by_port(tps):
            out.update(port.committed_group_offsets(group, part))
        return out

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        for port, part in self._by_port(offsets):
            port.commit_group_offsets(group, {tp: offsets[tp] for tp in part})

    def align(
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        config: CheckpointConfig,
        waited_s: float = 0,
    ) -> tuple[dict[TopicPartition, int], FanInAlignment]:
        """Every input's ends (stage inputs aligned on their upstream's markers, see
        ``StageOffsets.align``), and each stage input's alignment by its uid (a plain Kafka
        input is read to its end and has none)."""
        cut: dict[TopicPartition, int] = {}
        stats: dict[str, InputAlignment] = {}
        for uid, (topics, port) in self.ports.items():
            mine = {tp: end for tp, end in ends.items() if tp.topic in topics}
            if isinstance(port, AlignsOnMarkers):
                ends_of, alignment = port.align(mine, starts, config, waited_s)
                if not isinstance(alignment, InputAlignment):
                    raise TypeError(f"stage input {uid!r} is itself a fan-in; nest no unions")
                stats[uid] = alignment
                cut.update(ends_of)
            else:
                cut.update(mine)
        return cut, FanInAlignment(stats)

    def probe(
        self,
        ends: Mapping[TopicPartition, int],
        starts: Mapping[TopicPartition, int],
        config: CheckpointConfig,
        waited_s: float,
    ) -> str | None:
        """None when every stage input would cut now, else what the first one waits for
        (``StageOffsets.probe``)."""
        for topics, port in self.ports.values():
            if isinstance(port, ProbesAlignment):
                mine = {tp: end for tp, end in ends.items() if tp.topic in topics}
                waiting = port.probe(mine, starts, config, waited_s)
                if waiting is not None:
                    return waiting
        return None
