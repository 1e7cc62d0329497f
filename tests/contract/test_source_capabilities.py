"""The offsets ports' optional capabilities, run on every implementation.

Recovery finds a capability with ``isinstance`` against the runtime-checkable Protocols of
``protocol.source`` (``AlignsOnMarkers``, ``ProbesAlignment``, ``LimitsEnds``,
``NamesFiles``). So each implementation states what it claims, and this suite checks that
it has exactly those (a renamed ``align`` fails here rather than silently turning alignment
off) and that each claimed one behaves. Kafka is the session's broker; the internal topic
is written by hand as stage ``up``'s sink ``to-down`` writes it: three rows per partition,
then epoch 7's marker, then one row of epoch 8.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.file_offsets import FileOffsets, HybridOffsets
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stage_offsets import StageOffsets
from microcheckpoint.adapters.union_offsets import UnionOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    FanInAlignment,
    InputAlignment,
)
from microcheckpoint.protocol.source import (
    AlignsOnMarkers,
    LimitsEnds,
    NamesFiles,
    ProbesAlignment,
    SourceOffsets,
)
from microcheckpoint.storage import FileStore

CAPABILITIES = (AlignsOnMarkers, ProbesAlignment, LimitsEnds, NamesFiles)
FILES = ("day-01.jsonl", "day-02.jsonl", "day-03.jsonl")
CONFIG = CheckpointConfig.from_mapping({"pipeline": "down", "storage": "file:///x", "timeout": 10})


@dataclass
class World:
    """What the ports read: a marked internal topic, a plain topic and a folder of files."""

    kafka: KafkaOffsets
    internal: list[TopicPartition]  # rows 0-2, epoch 7's marker at 3, a row of epoch 8 at 4
    plain: list[TopicPartition]  # two records in one partition
    folder: FileStore

    @property
    def file_tp(self) -> TopicPartition:
        return TopicPartition("files.src", 0)


def _headers(epoch: int, marker: bool) -> list[tuple[str, bytes]]:
    headers = [("mcp-pipeline", b"up"), ("mcp-uid", b"to-down"), ("mcp-epoch", b"%d" % epoch)]
    return [*headers, ("mcp-marker", b"%d" % epoch)] if marker else headers


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    internal, plain = f"caps-mid-{uuid.uuid4().hex[:6]}", f"caps-plain-{uuid.uuid4().hex[:6]}"
    folder = FileStore(tmp_path_factory.mktemp("files").as_uri())
    for name in FILES:
        folder.put(name, b'{"v": 1}\n')
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(internal, 2)
        kafka.create_topic(plain, 1)
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
        for partition in (0, 1):
            for i in range(3):
                value = json.dumps({"i": i}).encode()
                producer.send(internal, value, partition=partition, headers=_headers(7, False))
            producer.send(internal, b"", partition=partition, headers=_headers(7, True))
            producer.send(internal, b'{"i": 9}', partition=partition, headers=_headers(8, False))
        for i in range(2):
            producer.send(plain, b"%d" % i, partition=0)
        producer.flush()
        producer.close()
        yield World(
            kafka,
            [TopicPartition(internal, 0), TopicPartition(internal, 1)],
            [TopicPartition(plain, 0)],
            folder,
        )


class SourceCapabilityContract(abc.ABC):
    """Every offsets port: it is a ``SourceOffsets`` and has exactly ``claims``."""

    claims: ClassVar[frozenset[type]]

    @abc.abstractmethod
    def make(self, world: World) -> Any:
        """The port under test, reading ``world``."""

    @abc.abstractmethod
    def topics(self, world: World) -> list[str]:
        """The topics the port answers for."""

    def test_it_is_a_source_port(self, world: World) -> None:
        port = self.make(world)
        assert isinstance(port, SourceOffsets)
        tps = [tp for topic in self.topics(world) for tp in port.partitions(topic)]
        assert set(port.beginning_offsets(tps).values()) == {0}

    def test_it_has_exactly_the_capabilities_it_claims(self, world: World) -> None:
        port = self.make(world)
        has = {capability for capability in CAPABILITIES if isinstance(port, capability)}
        assert {c.__name__ for c in has} == {c.__name__ for c in self.claims}

    def test_each_claimed_capability_behaves(self, world: World) -> None:
        port = self.make(world)
        checks = {
            AlignsOnMarkers: self.check_align,
            ProbesAlignment: self.check_probe,
            LimitsEnds: self.check_limit_ends,
            NamesFiles: self.check_files_of,
        }
        for capability in sorted(self.claims, key=lambda c: c.__name__):
            checks[capability](port, world)

    def check_align(self, port: Any, world: World) -> None:
        raise AssertionError(f"{type(self).__name__} claims align but checks nothing")

    def check_probe(self, port: Any, world: World) -> None:
        raise AssertionError(f"{type(self).__name__} claims probe but checks nothing")

    def check_limit_ends(self, port: Any, world: World) -> None:
        raise AssertionError(f"{type(self).__name__} claims limit_ends but checks nothing")

    def check_files_of(self, port: Any, world: World) -> None:
        raise AssertionError(f"{type(self).__name__} claims files_of but checks nothing")


class TestKafkaOffsets(SourceCapabilityContract):
    claims = frozenset()

    def make(self, world: World) -> Any:
        return world.kafka

    def topics(self, world: World) -> list[str]:
        return [world.internal[0].topic, world.plain[0].topic]


class TestFileOffsets(SourceCapabilityContract):
    claims = frozenset({LimitsEnds, NamesFiles})

    def make(self, world: World) -> Any:
        return FileOffsets(world.folder, "files.src", max_files=2)

    def topics(self, world: World) -> list[str]:
        return ["files.src"]

    def check_limit_ends(self, port: Any, world: World) -> None:
        tp = world.file_tp
        assert port.end_offsets([tp]) == {tp: 3}
        assert port.limit_ends({tp: 3}, {tp: 0}) == {tp: 2}  # max_files
        assert port.limit_ends({tp: 3}, {tp: 2}) == {tp: 3}

    def check_files_of(self, port: Any, world: World) -> None:
        assert port.files_of(world.file_tp, 0, 2, None) == list(FILES[:2])
        assert port.files_of(world.file_tp, 2, 3, FILES[1]) == [FILES[2]]
        assert port.files_of(world.plain[0], 0, 2, None) is None  # not a folder


class TestHybridOffsets(TestFileOffsets):
    def make(self, world: World) -> Any:
        return HybridOffsets(FileOffsets(world.folder, "files.src", max_files=2), world.kafka)

    def topics(self, world: World) -> list[str]:
        return ["files.src", world.plain[0].topic]

    def check_limit_ends(self, port: Any, world: World) -> None:
        tp, kafka = world.file_tp, world.plain[0]
        ends = port.end_offsets([tp, kafka])
        assert ends == {tp: 3, kafka: 2}
        assert port.limit_ends(ends, {tp: 0}) == {tp: 2}  # files remain: Kafka waits
        assert port.limit_ends(ends, {tp: 3}) == {tp: 3, kafka: 2}


class TestStageOffsets(SourceCapabilityContract):
    claims = frozenset({AlignsOnMarkers, ProbesAlignment, LimitsEnds})

    def make(self, world: World) -> Any:
        return StageOffsets(world.kafka, "up", "to-down", read_timeout_s=10)

    def topics(self, world: World) -> list[str]:
        return [world.internal[0].topic]

    def check_align(self, port: Any, world: World) -> None:
        ends = port.end_offsets(world.internal)
        assert ends == dict.fromkeys(world.internal, 5)
        cut, alignment = port.align(ends, {}, CONFIG)
        assert cut == dict.fromkeys(world.internal, 4)  # just after epoch 7's markers
        assert isinstance(alignment, InputAlignment)
        assert (alignment.mode, alignment.epoch, alignment.upstream, alignment.channels) == (
            AlignmentMode.ALIGNED,
            7,
            "up",
            2,
        )
        assert alignment.topics == (world.internal[0].topic,) and alignment.inflight == ()

    def check_probe(self, port: Any, world: World) -> None:
        ends = port.end_offsets(world.internal)
        assert port.probe(ends, {}, CONFIG, 0) is None  # every channel has its marker
        after = dict.fromkeys(world.internal, 4)
        waiting = port.probe(ends, after, CONFIG, 0)  # epoch 8 has no marker yet
        assert waiting == (
            f"no channel of {world.internal[0].topic} has the next barrier marker of stage 'up' yet"
        )

    def check_limit_ends(self, port: Any, world: World) -> None:
        ends = port.end_offsets(world.internal)
        assert port.limit_ends(ends, {}) == dict.fromkeys(world.internal, 4)
        assert port.limit_ends(ends, dict.fromkeys(world.internal, 4)) == dict.fromkeys(
            world.internal, 4
        )  # held at its start until epoch 8's marker comes


class TestUnionOffsets(SourceCapabilityContract):
    claims = frozenset({AlignsOnMarkers, ProbesAlignment})

    def make(self, world: World) -> Any:
        stage = StageOffsets(world.kafka, "up", "to-down", read_timeout_s=10)
        return UnionOffsets(
            {
                "mid": ((world.internal[0].topic,), stage),
                "plain": ((world.plain[0].topic,), world.kafka),
            }
        )

    def topics(self, world: World) -> list[str]:
        return [world.internal[0].topic, world.plain[0].topic]

    def check_align(self, port: Any, world: World) -> None:
        ends = port.end_offsets([*world.internal, *world.plain])
        cut, alignment = port.align(ends, {}, CONFIG)
        # The stage input is cut at its markers; the plain input is read to its end.
        assert cut == {**dict.fromkeys(world.internal, 4), world.plain[0]: 2}
        assert isinstance(alignment, FanInAlignment) and list(alignment.inputs) == ["mid"]
        assert alignment.inputs["mid"].epoch == 7 and alignment.unaligned is False

    def check_probe(self, port: Any, world: World) -> None:
        ends = port.end_offsets([*world.internal, *world.plain])
        assert port.probe(ends, {}, CONFIG, 0) is None
        waiting = port.probe(ends, dict.fromkeys(world.internal, 4), CONFIG, 0)
        assert waiting is not None and "has the next barrier marker of stage 'up'" in waiting
