"""KafkaSink against a real Tansu broker: exactly once without broker transactions.

Each test uses its own topic. Expected partitions are computed here independently
(blake2b of the key, 8 bytes, big-endian, modulo the partition count).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.ids import TopicPartition
from microcheckpoint.sinks.base import EpochInfo
from microcheckpoint.sinks.kafka import KafkaSink, read_topic

pytestmark = pytest.mark.integration

PIPELINE = "orders"
PARTITIONS = 3


class SimulatedCrash(Exception):
    """The notifier dies in the middle of a commit."""


class CrashingSink(KafkaSink):
    """Flushes the first ``crash_after`` sends of a commit, then dies."""

    def __init__(self, *args, crash_after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.crash_after = crash_after
        self.sent = 0

    def _send(self, producer, partition, key, value, headers):
        if self.sent == self.crash_after:
            producer.flush()
            raise SimulatedCrash(f"after {self.sent} sends")
        self.sent += 1
        return super()._send(producer, partition, key, value, headers)


@pytest.fixture
def topic() -> str:
    return f"sink-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sink(kafka_bootstrap: str, topic: str) -> Iterator[KafkaSink]:
    s = KafkaSink("out", kafka_bootstrap, topic, key_column="k", partitions=PARTITIONS)
    s.open()
    yield s
    s.close()


def _epoch(n: int) -> EpochInfo:
    return EpochInfo(PIPELINE, "out", n)


def _parts(n: int, parts: int = 3, rows: int = 7) -> list[list[dict]]:
    """Epoch ``n``'s input: ``parts`` parts of ``rows`` rows, keys spread over partitions."""
    return [
        [{"k": f"key-{(p * rows + i) % 11}", "epoch": n, "part": p, "i": i} for i in range(rows)]
        for p in range(parts)
    ]


def _partition(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % PARTITIONS


def _expected(epochs: range) -> Counter:
    return Counter(
        (row["k"].encode(), json.dumps(row, separators=(",", ":")).encode())
        for n in epochs
        for part in _parts(n)
        for row in part
    )


def _ours(bootstrap: str, topic: str, partition: int | None = None) -> list[tuple]:
    where = None if partition is None else [partition]
    return [r for r in read_topic(bootstrap, topic, where) if r[0].get("mcp-uid") == "out"]


def _assert_exactly_once(bootstrap: str, topic: str, epochs: range) -> None:
    ours = _ours(bootstrap, topic)
    assert Counter((key, value) for _, key, value in ours) == _expected(epochs)
    for partition in range(PARTITIONS):
        records = _ours(bootstrap, topic, partition)
        for headers, key, value in records:
            assert headers["mcp-pipeline"] == PIPELINE
            assert _partition(key.decode()) == partition
            assert json.loads(value)["epoch"] == int(headers["mcp-epoch"])
        # per-partition sequence check: each epoch's seqs are 0..k-1 in offset order
        for n in epochs:
            seqs = [int(h["mcp-seq"]) for h, _, _ in records if h["mcp-epoch"] == str(n)]
            assert seqs == list(range(len(seqs)))
        epochs_seen = [int(h["mcp-epoch"]) for h, _, _ in records]
        assert epochs_seen == sorted(epochs_seen)


def _end_offsets(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    with KafkaOffsets(bootstrap) as kafka:
        return kafka.end_offsets(kafka.partitions(topic))


def test_commits_publish_every_epoch_once_with_headers(
    kafka_bootstrap: str, topic: str, sink: KafkaSink
) -> None:
    sink.open()  # idempotent
    for n in (1, 2, 3):
        sink.commit(_epoch(n), _parts(n))
    _assert_exactly_once(kafka_bootstrap, topic, range(1, 4))
    per_partition = [len(_ours(kafka_bootstrap, topic, p)) for p in range(PARTITIONS)]
    assert sum(per_partition) == 3 * 21 and all(per_partition)  # keys reach every partition


def test_crash_in_the_middle_of_a_commit_then_retry_publishes_the_rest(
    kafka_bootstrap: str, topic: str, sink: KafkaSink
) -> None:
    sink.commit(_epoch(1), _parts(1))
    crashing = CrashingSink(
        "out", kafka_bootstrap, topic, key_column="k", partitions=PARTITIONS, crash_after=8
    )
    with pytest.raises(SimulatedCrash):
        crashing.commit(_epoch(2), _parts(2))
    crashing.close()
    # the story so far: epoch 1 and exactly the first 8 records of epoch 2
    assert len(_ours(kafka_bootstrap, topic)) == 21 + 8
    # a fresh notifier retries epoch 2, then goes on
    retry = KafkaSink("out", kafka_bootstrap, topic, key_column="k")
    retry.commit(_epoch(2), _parts(2))
    retry.commit(_epoch(3), _parts(3))
    retry.close()
    _assert_exactly_once(kafka_bootstrap, topic, range(1, 4))


def test_zombie_commit_of_an_older_or_the_same_epoch_produces_nothing(
    kafka_bootstrap: str, topic: str, sink: KafkaSink
) -> None:
    for n in (1, 2, 3):
        sink.commit(_epoch(n), _parts(n))
    before = _end_offsets(kafka_bootstrap, topic)
    zombie = KafkaSink("out", kafka_bootstrap, topic, key_column="k")
    zombie.commit(_epoch(2), _parts(2))
    zombie.commit(_epoch(3), _parts(3))
    zombie.commit(_epoch(1), _parts(1))
    zombie.close()
    assert _end_offsets(kafka_bootstrap, topic) == before
    _assert_exactly_once(kafka_bootstrap, topic, range(1, 4))


def test_foreign_writers_interleaving_do_not_confuse_the_dedup(
    kafka_bootstrap: str, topic: str, sink: KafkaSink
) -> None:
    del sink  # only for open(): creates the topic

    def foreign(tag: str) -> None:
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        try:
            for p in range(PARTITIONS):
                producer.send(topic, value=f"{tag}-plain".encode(), partition=p)
                # same pipeline, another uid: also someone else's record
                other = [("mcp-pipeline", PIPELINE.encode()), ("mcp-uid", b"other")]
                other += [("mcp-epoch", b"99"), ("mcp-seq", b"0")]
                producer.send(topic, value=f"{tag}-other".encode(), partition=p, headers=other)
            producer.flush()
        finally:
            producer.close()

    # scan_chunk=1: the tail scan has to step back over foreign records, doubling its reach
    sink = KafkaSink("out", kafka_bootstrap, topic, key_column="k", scan_chunk=1)
    foreign("a")
    sink.commit(_epoch(1), _parts(1))
    foreign("b")
    crashing = CrashingSink("out", kafka_bootstrap, topic, key_column="k", crash_after=5)
    with pytest.raises(SimulatedCrash):
        crashing.commit(_epoch(2), _parts(2))
    crashing.close()
    foreign("c")
    sink.commit(_epoch(2), _parts(2))
    foreign("d")
    sink.commit(_epoch(3), _parts(3))
    sink.commit(_epoch(2), _parts(2))  # zombie
    sink.close()
    _assert_exactly_once(kafka_bootstrap, topic, range(1, 4))
    values = Counter(v for h, _, v in read_topic(kafka_bootstrap, topic) if "mcp-uid" not in h)
    plain = {f"{t}-plain".encode(): PARTITIONS for t in "abcd"}
    assert values == plain
    others = [h for h, _, _ in read_topic(kafka_bootstrap, topic) if h.get("mcp-uid") == "other"]
    assert len(others) == 4 * PARTITIONS


def test_at_least_once_replay_duplicates_only_the_replayed_part(
    kafka_bootstrap: str, topic: str, sink: KafkaSink
) -> None:
    parts = _parts(1)
    sink.write_at_least_once(_epoch(1), 0, parts[0])
    sink.write_at_least_once(_epoch(1), 1, parts[1])
    sink.write_at_least_once(_epoch(1), 1, parts[1])  # the replay
    sink.write_at_least_once(_epoch(1), 2, parts[2])
    ours = _ours(kafka_bootstrap, topic)
    got = Counter(json.loads(value)["part"] for _, _, value in ours)
    assert got == {0: 7, 1: 14, 2: 7}
    rows = Counter(json.dumps(json.loads(v), sort_keys=True) for _, _, v in ours)
    assert rows == Counter(
        json.dumps(row, sort_keys=True)
        for p, part in enumerate(parts)
        for row in part * (1 + p % 2)
    )
    for headers, _, value in ours:
        row = json.loads(value)
        assert int(headers["mcp-seq"]) == row["part"] * 1_000_000 + row["i"]
        assert headers["mcp-epoch"] == "1"


def test_keyless_value_columns_and_pickle_round_trip(kafka_bootstrap: str, topic: str) -> None:
    keyless = KafkaSink("out", kafka_bootstrap, topic, value_columns=["i", "part"], partitions=2)
    keyless.open()
    keyless.commit(_epoch(1), _parts(1))
    copy = pickle.loads(pickle.dumps(keyless))
    assert copy._producer is None and copy._offsets is None
    assert (copy.topic, copy.value_columns, copy.key_column) == (topic, ("i", "part"), None)
    copy.commit(_epoch(1), _parts(1))  # repeated through the copy: nothing new
    copy.commit(_epoch(2), _parts(2))
    copy.close()
    keyless.close()
    ours = _ours(kafka_bootstrap, topic)
    assert all(key is None for _, key, _ in ours)
    values = Counter(value for _, _, value in ours)
    expected = Counter(f'{{"i":{i},"part":{p}}}'.encode() for p in range(3) for i in range(7))
    assert values == expected + expected  # one per row of epochs 1 and 2
    assert len(_ours(kafka_bootstrap, topic, 0)) and len(_ours(kafka_bootstrap, topic, 1))
