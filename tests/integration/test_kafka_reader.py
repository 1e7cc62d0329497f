"""kafka_source against a real Tansu broker: splits, the range reader and value decoding.

Nothing is mocked except where Tansu cannot produce the condition: Tansu 0.6 does not
implement DeleteRecords (its memory storage panics with "not yet implemented") and has no
retention that moves the log start, so the log-start check is driven through the offset
lookup it uses (``KafkaOffsets.beginning_offsets``), patched per test.
"""

from __future__ import annotations

import pickle
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from kafka import KafkaProducer

from harness import services
from microcheckpoint.adapters.decoding import SourceRecord, decode_record, decode_value
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.kafka_reader import Split, check_splits, read_split, split_ranges
from microcheckpoint.errors import ConfigError, KafkaSourceError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.barrier import Barrier, OffsetRange

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
MARKER = ("mcp-barrier", b"1")


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaOffsets]:
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as adapter:
        yield adapter


def _topic(kafka: KafkaOffsets, partitions: int = 1) -> str:
    topic = f"source-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(topic, partitions)
    return topic


def _produce(bootstrap: str, topic: str, partition: int, records: list[tuple]) -> None:
    """Send ``(key, value, headers, timestamp_ms)`` records in one produce request."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5_000, batch_size=1 << 20, acks="all"
    )
    try:
        for key, value, headers, ts in records:
            producer.send(
                topic, key=key, value=value, headers=headers, partition=partition, timestamp_ms=ts
            )
        producer.flush()
    finally:
        producer.close()


def _numbered(first: int, count: int) -> list[tuple]:
    return [
        (f"k{i}".encode(), f"v{i}".encode(), [("i", str(i).encode()), ("h", b"x")], T0 + i)
        for i in range(first, first + count)
    ]


def _expected(tp: TopicPartition, offsets: range) -> list[SourceRecord]:
    """The records ``_numbered(0, …)`` put at ``offsets`` of a partition."""
    return [
        SourceRecord(
            tp.topic,
            tp.partition,
            i,
            T0 + i,
            f"k{i}".encode(),
            f"v{i}".encode(),
            (("i", str(i).encode()), ("h", b"x")),
        )
        for i in offsets
    ]


# -- split_ranges (no broker) ----------------------------------------------------------------


def test_split_ranges_cut_sort_and_skip_empty_ranges() -> None:
    a0, a2, a10, b1 = (TopicPartition(t, p) for t, p in [("a", 0), ("a", 2), ("a", 10), ("b", 1)])
    ranges = {
        b1: OffsetRange(0, 10),  # 10 = 2 * 4 + 2
        a10: OffsetRange(7, 8),  # one offset
        a0: OffsetRange(5, 5),  # empty: no split
        a2: OffsetRange(3, 11),  # exactly 2 * 4
    }
    expected = [
        Split(a2, 3, 7),
        Split(a2, 7, 11),
        Split(a10, 7, 8),
        Split(b1, 0, 4),
        Split(b1, 4, 8),
        Split(b1, 8, 10),
    ]
    assert split_ranges(Barrier(ranges), 4) == expected
    assert split_ranges(Barrier(dict(reversed(ranges.items()))), 4) == expected
    assert split_ranges(Barrier(ranges), 8) == [
        Split(a2, 3, 11),
        Split(a10, 7, 8),
        Split(b1, 0, 8),
        Split(b1, 8, 10),
    ]
    assert split_ranges(Barrier(ranges), 1_000) == [
        Split(a2, 3, 11),
        Split(a10, 7, 8),
        Split(b1, 0, 10),
    ]
    assert split_ranges(Barrier({a2: OffsetRange(3, 6)}), 1) == [
        Split(a2, 3, 4),
        Split(a2, 4, 5),
        Split(a2, 5, 6),
    ]
    assert split_ranges(Barrier({a0: OffsetRange(5, 5)}), 4) == []
    assert split_ranges(Barrier({}), 4) == []
    assert pickle.loads(pickle.dumps(expected)) == expected
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_records_per_split"):
            split_ranges(Barrier(ranges), bad)
    with pytest.raises(ValueError, match=r"\[5, 4\)"):
        Split(a0, 5, 4)


# -- read_split ------------------------------------------------------------------------------


def test_read_split_returns_exactly_the_range_inside_one_batch(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    tp = TopicPartition(_topic(kafka), 0)
    _produce(kafka_bootstrap, tp.topic, 0, _numbered(0, 300))
    assert list(read_split(kafka_bootstrap, Split(tp, 137, 211))) == _expected(tp, range(137, 211))
    assert list(read_split(kafka_bootstrap, Split(tp, 0, 1))) == _expected(tp, range(0, 1))
    assert list(read_split(kafka_bootstrap, Split(tp, 299, 300))) == _expected(tp, range(299, 300))
    assert list(read_split(kafka_bootstrap, Split(tp, 0, 300))) == _expected(tp, range(300))
    # a small fetch limit: many fetches, each returning the whole batch, still exact
    small = read_split(kafka_bootstrap, Split(tp, 250, 260), fetch_max_bytes=64)
    assert list(small) == _expected(tp, range(250, 260))


def test_concatenated_splits_equal_one_read_of_each_range(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    topic = _topic(kafka, 3)
    p0, p1, p2 = (TopicPartition(topic, p) for p in range(3))
    _produce(kafka_bootstrap, topic, 0, _numbered(0, 300))
    for first in (300, 307, 314):  # three more batches of 7
        _produce(kafka_bootstrap, topic, 0, _numbered(first, 7))
    _produce(kafka_bootstrap, topic, 1, _numbered(0, 50))
    barrier = Barrier({p0: OffsetRange(10, 321), p1: OffsetRange(0, 50), p2: OffsetRange(0, 0)})
    splits = split_ranges(barrier, 37)
    assert len(splits) == 9 + 2  # ceil(311 / 37) + ceil(50 / 37); none for p2
    by_split = [r for s in splits for r in read_split(kafka_bootstrap, s)]
    whole = [
        r
        for tp, rng in sorted(barrier.ranges.items())
        for r in read_split(kafka_bootstrap, Split(tp, rng.start, rng.end))
    ]
    assert by_split == whole
    assert whole == _expected(p0, range(10, 321)) + _expected(p1, range(50))
    assert len(set(by_split)) == len(by_split) == 311 + 50


def test_empty_split_yields_nothing_without_a_broker() -> None:
    nowhere = f"127.0.0.1:{services.free_port()}"
    started = time.monotonic()
    assert list(read_split(nowhere, Split(TopicPartition("nothing", 0), 5, 5))) == []
    assert time.monotonic() - started < 1


def test_transaction_marker_gap_ends_the_split_by_position(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    tp = TopicPartition(_topic(kafka), 0)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=tp.topic)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send(tp.topic, value=f"t{i}".encode(), partition=0, timestamp_ms=T0 + i)
        producer.commit_transaction()
    finally:
        producer.close()
    assert kafka.end_offsets([tp]) == {tp: 6}  # offset 5 is the commit marker, not a record
    # Deadlines far above a read's time even on a busy machine: a read that waits for its
    # deadline (instead of ending at the marker's position) takes 30 s alone.
    started = time.monotonic()
    got = list(read_split(kafka_bootstrap, Split(tp, 0, 6), timeout_s=30))
    assert [(r.offset, r.value) for r in got] == [(i, f"t{i}".encode()) for i in range(5)]
    assert list(read_split(kafka_bootstrap, Split(tp, 5, 6), timeout_s=30)) == []
    assert time.monotonic() - started < 30  # neither read waited for its deadline


def test_start_below_log_start_raises_naming_both_offsets_and_the_ways_out(
    kafka: KafkaOffsets, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tansu cannot delete records (DeleteRecords is unimplemented, no retention), so the
    # log start offset the reader looks up is raised to 120 here, as retention would.
    tp = TopicPartition(_topic(kafka), 0)
    _produce(kafka_bootstrap, tp.topic, 0, _numbered(0, 200))
    real = KafkaOffsets.beginning_offsets

    def log_start_120(self: KafkaOffsets, tps: list[TopicPartition]) -> dict:
        return {t: 120 if t == tp else off for t, off in real(self, tps).items()}

    monkeypatch.setattr(KafkaOffsets, "beginning_offsets", log_start_120)
    with pytest.raises(KafkaSourceError) as info:
        list(read_split(kafka_bootstrap, Split(tp, 100, 150)))
    message = str(info.value)
    for part in (tp.topic, "partition 0", "offset 100", "log start offset 120"):
        assert part in message, part
    assert "savepoint or checkpoint" in message
    assert "startup_mode" in message
    assert list(read_split(kafka_bootstrap, Split(tp, 120, 130))) == _expected(tp, range(120, 130))


def test_end_above_high_watermark_raises(kafka: KafkaOffsets, kafka_bootstrap: str) -> None:
    tp = TopicPartition(_topic(kafka), 0)
    _produce(kafka_bootstrap, tp.topic, 0, _numbered(0, 10))
    for split in (Split(tp, 0, 11), Split(tp, 12, 15)):
        with pytest.raises(KafkaSourceError, match=f"end offset {split.end} is above the high"):
            read_split(kafka_bootstrap, split)
    with pytest.raises(KafkaSourceError, match="high watermark 10"):
        read_split(kafka_bootstrap, Split(tp, 0, 11))
    assert [r.offset for r in read_split(kafka_bootstrap, Split(tp, 0, 10))] == list(range(10))
    missing = TopicPartition(f"missing-{uuid.uuid4().hex[:8]}", 0)
    with pytest.raises(KafkaSourceError, match=missing.topic):
        read_split(kafka_bootstrap, Split(missing, 0, 1))


def test_check_splits_checks_every_partition_of_an_epoch_at_once(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    # What an epoch's driver runs once before its executors read with check=False.
    topic = _topic(kafka, partitions=2)
    _produce(kafka_bootstrap, topic, 0, _numbered(0, 10))
    _produce(kafka_bootstrap, topic, 1, _numbered(0, 4))
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    good = [Split(p0, 0, 5), Split(p0, 5, 10), Split(p1, 0, 4), Split(p1, 9, 9)]
    check_splits(kafka_bootstrap, good)  # the empty split is not looked at
    check_splits(kafka_bootstrap, [])
    with pytest.raises(KafkaSourceError) as info:
        check_splits(kafka_bootstrap, [*good, Split(p1, 4, 6)])
    assert f"split {topic}:1[4, 6)" in str(info.value)
    assert "end offset 6 is above the high watermark 4" in str(info.value)
    # Unchecked, the reader trusts its caller and reads what is there.
    assert [r.offset for r in read_split(kafka_bootstrap, good[1], check=False)] == list(
        range(5, 10)
    )


def test_no_progress_raises_after_timeout_naming_the_position(
    kafka: KafkaOffsets, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A barrier end the broker never reaches (the high watermark lookup is told 20, there
    # are 10 records) leaves the position stuck at 10 until the deadline.
    tp = TopicPartition(_topic(kafka), 0)
    _produce(kafka_bootstrap, tp.topic, 0, _numbered(0, 10))
    monkeypatch.setattr(KafkaOffsets, "end_offsets", lambda self, tps: dict.fromkeys(tps, 20))
    started = time.monotonic()
    reader = read_split(kafka_bootstrap, Split(tp, 5, 20), timeout_s=1)
    seen: list[int] = []
    with pytest.raises(KafkaSourceError) as info:
        seen.extend(r.offset for r in reader)
    assert seen == list(range(5, 10))
    for part in (tp.topic, "partition 0", "[5, 20)", "position reached is 10", "timeout_s=1"):
        assert part in str(info.value), part
    assert time.monotonic() - started < 5


def test_unreachable_broker_raises_after_timeout_naming_the_last_error() -> None:
    # Nothing listens on the port: the client retries, and the split fails once its
    # position has not moved for timeout_s, with the client's last error in the message.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    split = Split(TopicPartition("gone", 0), 0, 5)
    started = time.monotonic()
    with pytest.raises(KafkaSourceError) as info:
        list(read_split(nowhere, split, timeout_s=1, check=False))
    message = str(info.value)
    for part in ("gone", "[0, 5)", "position reached is 0", "timeout_s=1", nowhere):
        assert part in message, part
    assert "the last error was" in message
    assert time.monotonic() - started < 5


def test_stop_at_ends_the_split_before_the_marker_record(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    tp = TopicPartition(_topic(kafka), 0)
    records = _numbered(0, 20)
    key, value, headers, ts = records[12]
    records[12] = (key, value, [*headers, MARKER], ts)
    _produce(kafka_bootstrap, tp.topic, 0, records)
    markers: list[int] = []

    def is_marker(record: SourceRecord) -> bool:
        if MARKER in record.headers:
            markers.append(record.offset)
            return True
        return False

    got = list(read_split(kafka_bootstrap, Split(tp, 3, 20), stop_at=is_marker))
    assert got == _expected(tp, range(3, 12))
    assert markers == [12]
    after = list(read_split(kafka_bootstrap, Split(tp, 13, 20), stop_at=is_marker))
    assert after == _expected(tp, range(13, 20))  # no marker in range: read to the end
    everything = list(read_split(kafka_bootstrap, Split(tp, 0, 20)))
    assert [r.offset for r in everything] == list(range(20))
    assert everything[12].headers == (("i", b"12"), ("h", b"x"), MARKER)


# -- decoding --------------------------------------------------------------------------------


def test_decode_value_formats_and_schema() -> None:
    assert decode_value(b"\x00\xff", "bytes", None) == b"\x00\xff"
    assert decode_value("grüß".encode(), "text", None) == "grüß"
    assert decode_value(b'{"a": [1, 2.5, null]}', "json", None) == {"a": [1, 2.5, None]}
    assert decode_value(b"7", "json", None) == 7
    for fmt in ("bytes", "text", "json"):
        assert decode_value(None, fmt, None) is None  # tombstone
    schema = {"name": "string", "n": "long", "x": "double", "ok": "boolean", "gone": "long"}
    value = b'{"ok": true, "x": 1, "n": 42, "name": "a", "extra": {"z": 1}}'
    assert decode_value(value, "json", schema) == {
        "name": "a",
        "n": 42,
        "x": 1.0,
        "ok": True,
        "gone": None,
    }
    coerced = b'{"name": {"b": [1, true]}, "n": "-17", "x": "2.5e1", "ok": "false", "gone": 3.0}'
    assert decode_value(coerced, "json", schema) == {
        "name": '{"b":[1,true]}',
        "n": -17,
        "x": 25.0,
        "ok": False,
        "gone": 3,
    }
    nulls = decode_value(b'{"name": null, "n": null}', "json", schema)
    assert nulls == dict.fromkeys(schema)
    assert list(nulls) == list(schema)
    for bad, match in [
        (b'{"n": 2.5}', "field 'n' must be long, got 2.5"),
        (b'{"n": true}', "field 'n' must be long"),
        (b'{"n": 9223372036854775808}', "field 'n' must be long"),
        (b'{"x": "abc"}', "field 'x' must be double"),
        (b'{"ok": 1}', "field 'ok' must be boolean"),
        (b"[1, 2]", "the schema needs an object"),
        (b'{"x": NaN}', "not valid JSON"),
    ]:
        with pytest.raises(ValueError, match=match):
            decode_value(bad, "json", schema)
    with pytest.raises(ValueError, match="not valid UTF-8"):
        decode_value(b"\xff", "text", None)
    with pytest.raises(ConfigError, match="value_format") as info:
        decode_value(b"x", "avro", None)
    assert info.value.field == "value_format"
    with pytest.raises(ConfigError, match="value_schema"):
        decode_value(b"{}", "json", {"a": "int"})
    with pytest.raises(ConfigError, match="value_schema"):
        decode_value(b"x", "text", {"a": "string"})


def test_decode_record_errors_name_topic_partition_and_offset(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    topic = _topic(kafka, 2)
    tp = TopicPartition(topic, 1)
    values = [b'{"id": 1}', b"\xff\xfe{", b"{not json", b'{"id": "x"}', b'{"id": 4}']
    _produce(kafka_bootstrap, topic, 1, [(None, v, [], T0) for v in values])
    records = list(read_split(kafka_bootstrap, Split(tp, 0, 5)))
    schema = {"id": "long"}
    assert decode_record(records[0], "json", schema) == {"id": 1}
    assert decode_record(records[4], "json", schema) == {"id": 4}
    assert decode_record(records[2], "text", None) == "{not json"
    assert decode_record(records[1], "bytes", None) == b"\xff\xfe{"
    for offset, fmt, why in [
        (1, "text", "not valid UTF-8"),
        (1, "json", "not valid UTF-8"),
        (2, "json", "not valid JSON"),
        (3, "json", "field 'id' must be long"),
    ]:
        with pytest.raises(KafkaSourceError) as info:
            decode_record(records[offset], fmt, schema if fmt == "json" else None)
        message = str(info.value)
        for part in (f"offset {offset}", repr(topic), "partition 1", why):
            assert part in message, (offset, part)
    with pytest.raises(ConfigError, match="value_format"):
        decode_record(records[0], "csv", None)


def test_the_engine_readers_batches_are_bounded_by_rows_and_by_values_bytes(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    # Values of 1,000 bytes, one of 9,000 and a tombstone: every batch holds at most
    # batch_rows records and batch_bytes of values, one record at least, all in order.
    from microcheckpoint.engine.sources import KafkaSplitReader

    tp = TopicPartition(_topic(kafka), 0)
    sizes = [1_000] * 7 + [9_000] + [1_000] * 3 + [0] + [1_000] * 9
    records = [(b"k", None if n == 0 else b"v" * n, [], T0 + i) for i, n in enumerate(sizes)]
    _produce(kafka_bootstrap, tp.topic, 0, records)
    split = Split(tp, 0, len(sizes))
    by_bytes = KafkaSplitReader(kafka_bootstrap, (split,), "bytes", batch_bytes=4_500)
    batches = [b.column("value").to_pylist() for b in by_bytes.read(split)]
    lengths = [[len(v or b"") for v in values] for values in batches]
    assert lengths == [
        [1_000] * 4,
        [1_000] * 3,
        [9_000],  # larger than the bound alone: a batch of its own
        [1_000, 1_000, 1_000, 0, 1_000],
        [1_000] * 4,
        [1_000] * 4,
    ]
    assert [v for values in batches for v in values] == [r[1] for r in records]
    # Both bounds: rows first where they come first.
    both = KafkaSplitReader(kafka_bootstrap, (split,), "bytes", batch_rows=3, batch_bytes=4_500)
    counts = [b.num_rows for b in both.read(split)]
    assert counts == [3, 3, 1, 1, 3, 3, 3, 3, 1]


def test_the_engine_reader_builds_arrow_columns_equal_to_the_records(
    kafka: KafkaOffsets, kafka_bootstrap: str
) -> None:
    # What a source task yields: Arrow batches built straight from the fetched records, in
    # batches of batch_rows, equal field by field to read_split's records.
    from microcheckpoint.engine.sources import KafkaSplitReader

    tp = TopicPartition(_topic(kafka), 0)
    _produce(kafka_bootstrap, tp.topic, 0, _numbered(0, 25))
    _produce(kafka_bootstrap, tp.topic, 0, [(None, b"plain", [], T0 + 25)])
    split = Split(tp, 3, 26)
    reader = KafkaSplitReader(kafka_bootstrap, (split,), "bytes", batch_rows=10)
    batches = list(reader.read(split))
    assert [b.num_rows for b in batches] == [10, 10, 3]
    rows = [row for b in batches for row in b.to_pylist()]
    records = list(read_split(kafka_bootstrap, split))
    assert rows == [
        {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp_ms": r.timestamp_ms,
            "key": r.key,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
            "value": r.value,
        }
        for r in records
    ]
    assert [r["offset"] for r in rows] == list(range(3, 26))
    assert rows[-1]["headers"] == [] and rows[-1]["key"] is None
    assert rows[0]["headers"] == [{"key": "i", "value": b"3"}, {"key": "h", "value": b"x"}]
    # A batch without any headers takes the constant path; the columns are the same.
    (plain_batch,) = reader.read(Split(tp, 25, 26))
    plain = plain_batch.to_pylist()
    assert plain == [rows[-1]]
