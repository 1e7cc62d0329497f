"""startup_mode on the real broker: where a pipeline without a checkpoint starts."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.source import startup_offsets

T0 = 1_700_000_000_000


@pytest.fixture
def topic(kafka_bootstrap):
    name = f"startup-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as kafka:
        kafka.create_topic(name, 2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=50)
    for i in range(40):
        producer.send(name, value=b"v", partition=i % 2, timestamp_ms=T0 + i * 1000)
    producer.flush()
    producer.close()
    return name


def _config(topic, **extra):
    return CheckpointConfig.from_mapping(
        {"pipeline": "startup", "storage": "file:///tmp/unused", "topics": [topic], **extra}
    )


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"startup_mode": "earliest"}, (0, 0)),
        ({"startup_mode": "latest"}, (20, 20)),
        # Records i = 0..39 alternate partitions; t0 + 21 s is record 21 (partition 1, offset
        # 10); on partition 0 the first record at or after it is record 22 (offset 11).
        ({"startup_mode": "timestamp", "startup_timestamp_ms": T0 + 21_000}, (11, 10)),
        ({"startup_mode": "group_offsets"}, (0, 0)),  # nothing committed: earliest
    ],
)
def test_startup_modes(kafka_bootstrap, topic, settings, expected):
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as kafka:
        got = startup_offsets(kafka, _config(topic, **settings), tps)
    assert got == dict(zip(tps, expected, strict=True))


def test_group_offsets_mode_uses_committed_offsets(kafka_bootstrap, topic):
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    config = _config(topic, group_id=f"g-{uuid.uuid4().hex[:6]}")
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as kafka:
        kafka.commit_group_offsets(config.effective_group_id, {tps[0]: 7})
        got = startup_offsets(kafka, config, tps)
    assert got == {tps[0]: 7, tps[1]: 0}
