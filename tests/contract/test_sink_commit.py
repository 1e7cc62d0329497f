"""The sink contract, run on every sink: ``commit`` is idempotent per (pipeline, uid, epoch).

Notify may run again after a crash anywhere inside it, and a zombie notifier may commit an
epoch that was committed long ago: either way each epoch's rows are published exactly once.
The file sink writes under ``tmp_path``, the Iceberg sink into a SQLite catalog there, and
the Kafka sink into a new topic on the session's broker.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from microcheckpoint.sinks.base import EpochInfo, Sink
from microcheckpoint.sinks.files import FileSink, read_committed
from microcheckpoint.sinks.iceberg import IcebergSink
from microcheckpoint.sinks.kafka import KafkaSink, read_topic

PIPELINE = "contract"
UID = "out"


def epoch(n: int) -> EpochInfo:
    return EpochInfo(PIPELINE, UID, n)


def parts_of(n: int) -> list[list[dict[str, Any]]]:
    """Epoch ``n``: two subtasks' parts, rows unique across epochs and parts."""
    return [[{"k": f"p{p}-k{i}", "seq": n * 100 + p * 10 + i} for i in range(3)] for p in range(2)]


def rows(*epochs: int) -> Counter:
    return Counter((r["k"], r["seq"]) for n in epochs for part in parts_of(n) for r in part)


class SinkCommitContract(abc.ABC):
    """Every ``Sink`` implementation; ``published`` counts what a reader of the output sees."""

    @abc.abstractmethod
    def make(self) -> Sink:
        """A sink on this test's destination (a new object each call, the same destination)."""

    @abc.abstractmethod
    def published(self, sink: Sink) -> Counter: ...

    @pytest.fixture
    def sink(self) -> Sink:
        sink = self.make()
        sink.open()
        return sink

    def test_each_epoch_is_published_once(self, sink: Sink) -> None:
        for n in (1, 2, 3):
            sink.commit(epoch(n), parts_of(n))
        assert self.published(sink) == rows(1, 2, 3)

    def test_committing_the_same_epoch_again_publishes_nothing(self, sink: Sink) -> None:
        sink.commit(epoch(1), parts_of(1))
        sink.commit(epoch(1), parts_of(1))
        assert self.published(sink) == rows(1)

    def test_a_zombie_commit_of_an_older_epoch_publishes_nothing(self, sink: Sink) -> None:
        sink.commit(epoch(1), parts_of(1))
        sink.commit(epoch(2), parts_of(2))
        sink.commit(epoch(1), parts_of(1))
        assert self.published(sink) == rows(1, 2)

    def test_a_new_sink_object_on_the_same_destination_dedups_too(self, sink: Sink) -> None:
        sink.commit(epoch(1), parts_of(1))
        again = self.make()
        again.open()
        again.commit(epoch(1), parts_of(1))
        again.commit(epoch(2), parts_of(2))
        assert self.published(again) == rows(1, 2)

    def test_an_empty_epoch_publishes_nothing_and_the_next_one_lands(self, sink: Sink) -> None:
        sink.commit(epoch(1), [[], []])
        sink.commit(epoch(2), parts_of(2))
        assert self.published(sink) == rows(2)


class TestFileSink(SinkCommitContract):
    @pytest.fixture(autouse=True)
    def _target(self, tmp_path: Path) -> None:
        self.target = (tmp_path / "out").as_uri()

    def make(self) -> Sink:
        return FileSink(UID, self.target)

    def published(self, sink: Sink) -> Counter:
        return Counter((r["k"], r["seq"]) for r in read_committed(self.target, PIPELINE, UID))


class TestIcebergSink(SinkCommitContract):
    @pytest.fixture(autouse=True)
    def _catalog(self, tmp_path: Path) -> None:
        self.catalog = tmp_path / "catalog"

    def make(self) -> Sink:
        return IcebergSink(UID, "c.out", {"k": "string", "seq": "long"}, catalog_path=self.catalog)

    def published(self, sink: Sink) -> Counter:
        assert isinstance(sink, IcebergSink)
        return Counter((r["k"], r["seq"]) for r in sink.read_table())


@pytest.mark.integration
class TestKafkaSink(SinkCommitContract):
    @pytest.fixture(autouse=True)
    def _topic(self, kafka_bootstrap: str) -> Iterator[None]:
        self.bootstrap = kafka_bootstrap
        self.topic = f"contract-{uuid.uuid4().hex[:8]}"
        self.made: list[KafkaSink] = []
        yield
        for sink in self.made:
            sink.close()

    def make(self) -> Sink:
        sink = KafkaSink(UID, self.bootstrap, self.topic, key_column="k", partitions=2)
        self.made.append(sink)
        return sink

    def published(self, sink: Sink) -> Counter:
        values = [json.loads(value) for _, _, value in read_topic(self.bootstrap, self.topic)]
        return Counter((v["k"], v["seq"]) for v in values)
