"""KafkaOffsets against real brokers: Tansu on memory storage and Tansu on S3 (SeaweedFS) storage.

Nothing is mocked. Tansu 0.6 answers ListOffsets LATEST and by-timestamp wrongly (see
the adapter corrects them); every expected value below is the Kafka answer, so the same tests also pass
against a real Kafka named by MICROCHECKPOINT_KAFKA_BOOTSTRAP.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTP
from kafka import errors as kerr

from harness import services
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets, kafka_python_client
from microcheckpoint.adapters.s3 import ensure_bucket, make_client
from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.ids import TopicPartition

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000  # record CreateTime base, ms
BIG = [T0 + 10 * i for i in range(500)]  # partition 0: one produce request of 500 records
# partition 1: three separate batches of 5, with equal timestamps inside a batch
SMALL = [[T0 + 100_000 + 1_000 * j + 10 * (i // 2) for i in range(5)] for j in range(3)]
SMALL_FLAT = [ts for batch in SMALL for ts in batch]


def _s3_tansu(log_dir: Path, endpoint: services.S3Endpoint, port: int | None = None):
    bucket = f"tansu-{uuid.uuid4().hex[:12]}"
    ensure_bucket(
        make_client(endpoint.url, endpoint.region, endpoint.access_key, endpoint.secret_key),
        bucket,
    )
    log = log_dir / f"tansu-{bucket}"
    return bucket, services.start_tansu(log, storage=f"s3://{bucket}/", s3=endpoint, port=port)


@pytest.fixture(scope="module")
def s3_kafka_bootstrap(service_log_dir: Path, s3_endpoint: services.S3Endpoint) -> Iterator[str]:
    """A Tansu broker storing its log in a fresh bucket on the S3 server."""
    _, service = _s3_tansu(service_log_dir, s3_endpoint)
    try:
        yield service.address
    finally:
        service.stop()


@pytest.fixture(params=["memory", "s3"])
def bootstrap(request: pytest.FixtureRequest) -> str:
    name = "kafka_bootstrap" if request.param == "memory" else "s3_kafka_bootstrap"
    return request.getfixturevalue(name)


@pytest.fixture
def offsets(bootstrap: str) -> Iterator[KafkaOffsets]:
    with KafkaOffsets(bootstrap, request_timeout_ms=10_000) as adapter:
        yield adapter


def _topic() -> str:
    return f"offsets-{uuid.uuid4().hex[:12]}"


def _produce(bootstrap: str, topic: str, partition: int, batches: list[list[int]]) -> None:
    """Send one produce request per batch (linger and batch size hold the records together)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5_000, batch_size=1 << 20, acks="all"
    )
    try:
        for batch in batches:
            for ts in batch:
                producer.send(
                    topic, value=f"{partition}:{ts}".encode(), partition=partition, timestamp_ms=ts
                )
            producer.flush()
    finally:
        producer.close()


def _standard_topic(offsets: KafkaOffsets, bootstrap: str) -> list[TopicPartition]:
    """Partition 0: 500 records in one batch; 1: 3 batches of 5; 2: empty."""
    topic = _topic()
    offsets.create_topic(topic, 3)
    _produce(bootstrap, topic, 0, [BIG])
    _produce(bootstrap, topic, 1, SMALL)
    return [TopicPartition(topic, p) for p in range(3)]


def _kafka_answer(timestamps: list[int], ts: int) -> int:
    return next((i for i, t in enumerate(timestamps) if t >= ts), len(timestamps))


def _read_all(bootstrap: str, tp: TopicPartition, end: int) -> list[tuple[int, int, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    ktp = KafkaTP(tp.topic, tp.partition)
    try:
        consumer.assign([ktp])
        consumer.seek(ktp, 0)
        out: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 10
        while consumer.position(ktp) < end and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=200).get(ktp, []):
                out.append((record.offset, record.timestamp, record.value))
        return out
    finally:
        consumer.close()


def test_create_topic_is_idempotent_and_partitions_are_listed(offsets: KafkaOffsets) -> None:
    topic = _topic()
    offsets.create_topic(topic, 3)
    offsets.create_topic(topic, 3)
    assert offsets.partitions(topic) == [TopicPartition(topic, p) for p in range(3)]


def test_end_offsets_are_exclusive_for_one_batch_many_batches_and_empty(
    offsets: KafkaOffsets, bootstrap: str
) -> None:
    tps = _standard_topic(offsets, bootstrap)
    assert offsets.beginning_offsets(tps) == dict.fromkeys(tps, 0)
    assert offsets.end_offsets(tps) == {tps[0]: 500, tps[1]: 15, tps[2]: 0}
    _produce(bootstrap, tps[0].topic, 0, [[T0 + 9_000 + i for i in range(7)]])
    _produce(bootstrap, tps[2].topic, 2, [[T0]])
    assert offsets.end_offsets(tps) == {tps[0]: 507, tps[1]: 15, tps[2]: 1}
    assert offsets.end_offsets([tps[1]]) == {tps[1]: 15}
    assert offsets.end_offsets([]) == {}


def test_offsets_for_times_follow_kafka_semantics(offsets: KafkaOffsets, bootstrap: str) -> None:
    tps = _standard_topic(offsets, bootstrap)
    p0, p1, p2 = tps

    def at(ts: int) -> dict[TopicPartition, int]:
        return offsets.offsets_for_times(tps, ts)

    assert at(0) == {p0: 0, p1: 0, p2: 0}  # before every record
    assert at(T0) == {p0: 0, p1: 0, p2: 0}  # equal to the first record
    assert at(T0 + 2_000) == {p0: 200, p1: 0, p2: 0}  # equal to a record in the middle
    assert at(T0 + 1_995) == {p0: 200, p1: 0, p2: 0}  # between records 199 and 200
    assert at(T0 + 4_990) == {p0: 499, p1: 0, p2: 0}  # equal to the last record
    assert at(T0 + 4_991) == {p0: 500, p1: 0, p2: 0}  # after p0's records: its end
    assert at(T0 + 101_010) == {p0: 500, p1: 7, p2: 0}  # equal pair 7,8: the earliest
    assert at(T0 + 101_005) == {p0: 500, p1: 7, p2: 0}  # between 6 and 7
    assert at(T0 + 102_020) == {p0: 500, p1: 14, p2: 0}  # p1's last record
    assert at(T0 + 10**9) == {p0: 500, p1: 15, p2: 0}  # after every record: the end offsets
    for ts in sorted({*SMALL_FLAT, *(t + 1 for t in SMALL_FLAT)})[::3]:
        assert at(ts)[p1] == _kafka_answer(SMALL_FLAT, ts), ts
    with pytest.raises(KafkaSourceError, match="-1"):
        offsets.offsets_for_times(tps, -1)


def test_group_offsets_commit_and_read_back(offsets: KafkaOffsets) -> None:
    topic = _topic()
    offsets.create_topic(topic, 3)
    tps = offsets.partitions(topic)
    group, other = f"group-{uuid.uuid4().hex[:8]}", f"group-{uuid.uuid4().hex[:8]}"
    assert offsets.committed_group_offsets(group, tps) == dict.fromkeys(tps, None)
    offsets.commit_group_offsets(group, {tps[0]: 42, tps[1]: 0}, metadata="chk-1")
    assert offsets.committed_group_offsets(group, tps) == {tps[0]: 42, tps[1]: 0, tps[2]: None}
    offsets.commit_group_offsets(group, {tps[0]: 100})
    assert offsets.committed_group_offsets(group, tps) == {tps[0]: 100, tps[1]: 0, tps[2]: None}
    assert offsets.committed_group_offsets(other, tps) == dict.fromkeys(tps, None)


def test_a_group_with_a_live_member_refuses_the_commit_naming_the_way_out(
    offsets: KafkaOffsets, bootstrap: str
) -> None:
    topic, group = _topic(), f"group-{uuid.uuid4().hex[:8]}"
    offsets.create_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    member = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    try:
        # Once the consumer has joined (its polls drive the join), a standalone commit is
        # refused; until then the broker may take it.
        deadline = time.monotonic() + 30
        while True:
            member.poll(100)
            try:
                offsets.commit_group_offsets(group, {tp: 1})
            except KafkaSourceError as exc:
                refused = str(exc)
                break
            assert time.monotonic() < deadline, "the live member's group took every commit"
    finally:
        member.close(autocommit=False)
    assert f"refused committing offsets of group {group!r}: {{'{topic}:0': " in refused
    assert "stop its consumers, or give the pipeline its own group_id" in refused


def test_missing_topic_or_partition_raises_naming_it(offsets: KafkaOffsets) -> None:
    missing = _topic()
    tp = TopicPartition(missing, 0)
    calls = [
        lambda: offsets.partitions(missing),
        lambda: offsets.beginning_offsets([tp]),
        lambda: offsets.end_offsets([tp]),
        lambda: offsets.offsets_for_times([tp], T0),
        lambda: offsets.commit_group_offsets("g", {tp: 1}),
    ]
    for call in calls:
        with pytest.raises(KafkaSourceError, match=missing) as info:
            call()
        assert "create it or fix `topics`" in str(info.value)
    topic = _topic()
    offsets.create_topic(topic, 2)
    with pytest.raises(KafkaSourceError, match=f"{topic}:5"):
        offsets.end_offsets([TopicPartition(topic, 5)])


def test_unreachable_bootstrap_raises_naming_the_address() -> None:
    address = f"127.0.0.1:{services.free_port()}"
    started = time.monotonic()
    before = set(threading.enumerate())
    with KafkaOffsets(address, request_timeout_ms=1_000) as adapter:
        with pytest.raises(KafkaSourceError, match=address) as info:
            adapter.partitions("anything")  # the admin client
        assert "bootstrap_servers" in str(info.value)
        with pytest.raises(KafkaSourceError, match=address):
            adapter.end_offsets([TopicPartition("anything", 0)])
    with pytest.raises(kerr.KafkaError):  # the offsets' consumer, as the adapter makes it
        kafka_python_client(KafkaConsumer, bootstrap_servers=address, bootstrap_timeout_ms=1_000)
    assert time.monotonic() - started < 10
    # No client is left reconnecting in this process: each failed constructor's IO thread
    # was stopped (kafka-python returns no object to close when its constructor raises).
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not [name for name in left if name.startswith("kafka-io")], left


def test_s3_tansu_keeps_records_and_offsets_across_restart(
    service_log_dir: Path, s3_endpoint: services.S3Endpoint
) -> None:
    bucket, service = _s3_tansu(service_log_dir, s3_endpoint)
    port = int(service.address.rsplit(":", 1)[1])
    topic, group = _topic(), f"group-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(3)]
    try:
        with KafkaOffsets(service.address, request_timeout_ms=10_000) as offsets:
            offsets.create_topic(topic, 3)
            _produce(service.address, topic, 0, [BIG])
            _produce(service.address, topic, 1, SMALL)
            offsets.commit_group_offsets(group, {tps[0]: 250})
            ends = offsets.end_offsets(tps)
            assert ends == {tps[0]: 500, tps[1]: 15, tps[2]: 0}
            before = {tp: _read_all(service.address, tp, ends[tp]) for tp in tps}
        service.stop()
        service = services.start_tansu(
            service_log_dir / f"tansu-{bucket}",
            storage=f"s3://{bucket}/",
            s3=s3_endpoint,
            port=port,
        )
        with KafkaOffsets(service.address, request_timeout_ms=10_000) as offsets:
            assert offsets.partitions(topic) == tps
            assert offsets.end_offsets(tps) == ends
            assert offsets.offsets_for_times(tps, T0 + 2_000) == {tps[0]: 200, tps[1]: 0, tps[2]: 0}
            assert offsets.committed_group_offsets(group, tps[:1]) == {tps[0]: 250}
            after = {tp: _read_all(service.address, tp, ends[tp]) for tp in tps}
        assert after == before
        assert [(o, ts) for o, ts, _ in after[tps[0]]] == list(enumerate(BIG))
        assert [ts for _, ts, _ in after[tps[1]]] == SMALL_FLAT
        assert after[tps[2]] == []
    finally:
        service.stop()


def test_the_end_offsets_probe_does_not_poll_the_records_it_fetched(
    offsets: KafkaOffsets, bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch probe behind ``end_offsets`` reads each partition's high watermark from its
    first record or end of partition. The fetched batch holds many more (Tansu answers
    ListOffsets LATEST with its last batch's first offset), and once the partition's
    watermark is read they are dropped, not polled one by one."""
    import confluent_kafka

    polled: list[tuple[int, int]] = []

    class Counting(confluent_kafka.Consumer):  # type: ignore[misc]
        def poll(self, *args: object, **kwargs: object) -> object:
            message = super().poll(*args, **kwargs)
            if message is not None and message.error() is None:
                polled.append((message.partition(), message.offset()))
            return message

    topic = _topic()
    offsets.create_topic(topic, 2)
    tps = [TopicPartition(topic, p) for p in range(2)]
    for tp in tps:
        _produce(bootstrap, topic, tp.partition, [[T0 + i for i in range(2_000)]])
    monkeypatch.setattr(confluent_kafka, "Consumer", Counting)
    for _ in range(3):
        polled.clear()
        assert offsets.end_offsets(tps) == dict.fromkeys(tps, 2_000)
        # a record or two of each partition, where all its fetched records were polled
        assert len(polled) <= 10, (len(polled), polled[:3])
