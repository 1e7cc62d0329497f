"""Reading a barrier's offset ranges from Kafka: splits and the range reader.

Runs inside Spark executors, so it imports Kafka clients only (never pyspark). A barrier's
ranges are cut into :class:`Split` s (``split_ranges``); each split is read by one consumer
with manual assignment and no group (``read_split``), which yields exactly the records with
``start <= offset < end``. Every ``end`` is exclusive: one past the last offset of the range.

The reader works on Apache Kafka and on Tansu 0.6: the high watermark comes
from :class:`KafkaOffsets` (it corrects Tansu's ListOffsets LATEST with a fetch
probe). The records are read with confluent-kafka (librdkafka decodes and checks record
batches in C: about twice kafka-python's speed), and the reader stops when its position
reaches ``end`` (past a record, or at the partition's end), not at a record at ``end - 1``,
because compaction and transaction markers leave offset gaps.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as _CTP

from microcheckpoint.adapters.decoding import SourceRecord
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets, retry_helps
from microcheckpoint.errors import ConfigError, InvalidValue, KafkaSourceError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.barrier import Barrier

__all__ = [
    "Split",
    "batch_columns",
    "check_splits",
    "read_split",
    "read_split_batches",
    "split_ranges",
    "to_record",
]

_CONSUME_MAX = 10_000  # records per consume() call
_QUEUED_KBYTES = 16 * 1024  # what the client prefetches per consumer, at most
_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}


@dataclass(frozen=True)
class Split:
    """One unit of reading: offsets ``[start, end)`` of one partition (``end`` exclusive)."""

    tp: TopicPartition
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise InvalidValue(
                f"split of {self.tp}: offset range [{self.start}, {self.end}) is invalid"
            )

    def __str__(self) -> str:
        return f"{self.tp}[{self.start}, {self.end})"


def split_ranges(barrier: Barrier, max_records_per_split: int) -> list[Split]:
    """Cut every non-empty range of ``barrier`` into consecutive splits of at most
    ``max_records_per_split`` offsets, sorted by (topic, partition, start).

    Empty ranges give no split. The result depends only on the arguments.

    Raises:
        ConfigError: ``max_records_per_split`` is not an integer >= 1.
    """
    if (
        not isinstance(max_records_per_split, int)
        or isinstance(max_records_per_split, bool)
        or max_records_per_split < 1
    ):
        raise ConfigError("max_records_per_split", max_records_per_split, "an integer >= 1")
    return [
        Split(tp, lo, min(lo + max_records_per_split, r.end))
        for tp, r in sorted(barrier.ranges.items())
        for lo in range(r.start, r.end, max_records_per_split)
    ]


def read_split(
    bootstrap_servers: str,
    split: Split,
    *,
    timeout_s: float = 60,
    fetch_max_bytes: int = 4 * 1024 * 1024,
    stop_at: Callable[[SourceRecord], bool] | None = None,
    check: bool = True,
) -> Iterator[SourceRecord]:
    """Records of ``split`` in offset order: exactly those with ``start <= offset < end``.

    Steps:
        1. An empty split returns an empty iterator at once (no broker call, no checks).
        2. Unless ``check=False`` (the caller ran ``check_splits`` already), check the range
           against the partition, when called: ``start`` below the log start offset (records
           deleted by retention) or ``end`` above the high watermark raises.
        3. On iteration: one consumer (manual assignment, no group, no commits, no offset
           reset) seeks to ``start`` and polls until its position reaches ``end``; fetched
           batches may hold records outside the range, which are dropped. Offset gaps
           (compaction, transaction markers) are fine. The consumer is closed when the
           iterator ends, fails or is closed.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        split: the partition and ``[start, end)`` to read.
        timeout_s: raise if the position does not move for this long (and the bound for
            each broker request of step 2).
        fetch_max_bytes: the fetch size limit (one batch larger than this is still returned).
        stop_at: optional predicate, for multi-stage pipelines that read an
            internal topic up to a barrier marker record: the split ends at the first record
            for which it returns True, and that record is not yielded. The predicate is called
            once per record in offset order, so it can remember the marker's offset.
            If no record matches, reading ends at ``end`` as usual.

    Raises:
        KafkaSourceError: the range starts below the log start offset (the message names the
            ways out), ends above the high watermark, the partition does not exist, Kafka did
            not answer, or reading made no progress within ``timeout_s``.
    """
    # Steps 1 and 2 (at call time); step 3 on iteration.
    batches = read_split_batches(
        bootstrap_servers, split, timeout_s=timeout_s, fetch_max_bytes=fetch_max_bytes, check=check
    )
    return _records(batches, stop_at)


def check_splits(bootstrap_servers: str, splits: Iterable[Split], *, timeout_s: float = 60) -> None:
    """Check every non-empty split against its partition, with one client for all of them.

    A reader of many splits (an epoch's Spark job) calls this once in the driver and reads
    with ``read_split(..., check=False)``; what it checks is ``read_split``'s step 2.

    Raises:
        KafkaSourceError: a split starts below its partition's log start offset (records
            deleted by retention) or ends above its high watermark, or Kafka did not answer
            within ``timeout_s``.
    """
    live = [s for s in splits if s.start < s.end]
    if not live:
        return
    tps = sorted({s.tp for s in live})
    timeout_ms = _request_timeout_ms(timeout_s)
    with KafkaOffsets(bootstrap_servers, "microcheckpoint-source", timeout_ms) as kafka:
        log_starts = kafka.beginning_offsets(tps)
        high_watermarks = kafka.end_offsets(tps)
    for split in live:
        if split.start < log_starts[split.tp]:
            raise _below_log_start(split, split.start, log_starts[split.tp])
        if split.end > high_watermarks[split.tp]:
            raise KafkaSourceError(
                f"split {split}: end offset {split.end} is above the high watermark "
                f"{high_watermarks[split.tp]} of {split.tp} (topic {split.tp.topic!r}, "
                f"partition {split.tp.partition}); a barrier only points at existing records, "
                "so the topic was re-created or truncated: restore from a savepoint or reset "
                "the pipeline's offsets"
            )


def _request_timeout_ms(timeout_s: float) -> int:
    return int(min(max(timeout_s, 1.0), 300.0) * 1000)


def _below_log_start(split: Split, offset: int, log_start: int) -> KafkaSourceError:
    return KafkaSourceError(
        f"split {split}: offset {offset} of topic {split.tp.topic!r} partition "
        f"{split.tp.partition} is below the log start offset {log_start}: records "
        f"[{offset}, {log_start}) were deleted (retention) before this epoch read them. Restore "
        "from a newer savepoint or checkpoint, or reset the pipeline's start offsets with "
        "startup_mode, accepting the loss of those records; nothing is skipped silently"
    )


def read_split_batches(
    bootstrap_servers: str,
    split: Split,
    *,
    timeout_s: float = 60,
    fetch_max_bytes: int = 4 * 1024 * 1024,
    check: bool = True,
) -> Iterator[list[Any]]:
    """The records of ``split`` as fetched, one list per fetch, in offset order.

    ``read_split`` without the per-record wrapping: each list holds the client's records,
    exactly those with ``start <= offset < end``, for a caller that converts whole batches:
    ``batch_columns`` gives their fields as lists (the engine builds Arrow columns from
    them), ``to_record`` one record as a :class:`SourceRecord`. Same steps, errors
    and arguments as ``read_split``.
    """
    if split.start == split.end:
        return iter(())
    if check:
        check_splits(bootstrap_servers, [split], timeout_s=timeout_s)
    request_timeout_ms = _request_timeout_ms(timeout_s)
    return _batches(bootstrap_servers, split, timeout_s, fetch_max_bytes, request_timeout_ms)


def _records(
    batches: Iterator[list[Any]], stop_at: Callable[[SourceRecord], bool] | None
) -> Iterator[SourceRecord]:
    try:
        for batch in batches:
            for raw in batch:
                record = to_record(raw)
                if stop_at is not None and stop_at(record):
                    return
                yield record
    finally:
        close = getattr(batches, "close", None)  # the consumer, also when stop_at ended it
        if close is not None:
            close()


def _consumer_config(
    bootstrap_servers: str, fetch_max_bytes: int, request_timeout_ms: int
) -> dict[str, Any]:
    """A consumer that reads what it is assigned and nothing else: no commits, no offset
    reset (a start below the log start is an error), no topic creation, and the records of
    open or aborted transactions too (``read_uncommitted``, as kafka-python's default)."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "microcheckpoint-source",
        "group.id": "microcheckpoint-source",  # required by the client; never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "isolation.level": "read_uncommitted",
        "allow.auto.create.topics": False,
        "socket.timeout.ms": request_timeout_ms,
        "fetch.wait.max.ms": 100,
        "fetch.max.bytes": max(fetch_max_bytes, 1000),
        "message.max.bytes": 1000,  # the client requires fetch.max.bytes >= this
        "max.partition.fetch.bytes": fetch_max_bytes,
        "queued.max.messages.kbytes": _QUEUED_KBYTES,
        "log_level": 2,  # the client's own log is quiet: its errors go to ``error_cb``
    }


def _batches(
    bootstrap_servers: str,
    split: Split,
    timeout_s: float,
    fetch_max_bytes: int,
    request_timeout_ms: int,
) -> Generator[list[Any], None, None]:
    client_errors: deque[KafkaError] = deque(maxlen=1)  # the client's last error (it retries)
    config = _consumer_config(bootstrap_servers, fetch_max_bytes, request_timeout_ms)
    config["error_cb"] = client_errors.append
    with _errors(bootstrap_servers, split, "connecting"):
        consumer = Consumer(config)
    try:
        with _errors(bootstrap_servers, split, "seeking"):
            consumer.assign([_CTP(split.tp.topic, split.tp.partition, split.start)])
        position, moved = split.start, time.monotonic()
        while position < split.end:
            with _errors(bootstrap_servers, split, f"fetching at offset {position}"):
                # No more than the range still holds: consume() returns when it has that
                # many, where a larger count would wait out its timeout at the range's end.
                wanted = min(_CONSUME_MAX, split.end - position)
                fetched = consumer.consume(num_messages=wanted, timeout=0.1)
            records = []
            for message in fetched:
                error = message.error()
                if error is None:
                    records.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    # The high watermark: offsets below it that gave no record are gaps
                    # (transaction markers, compaction).
                    position = max(position, message.offset())
                elif error.code() in _OUT_OF_RANGE:
                    raise _out_of_range(bootstrap_servers, split, position, request_timeout_ms)
                elif not retry_helps(error):
                    raise _failed(bootstrap_servers, split, f"fetching at offset {position}", error)
                else:
                    client_errors.append(error)  # the client retries (a broker restarting)
            before = position
            if records:
                position = max(position, records[-1].offset() + 1)
                inside = _inside(records, split)
                if inside:
                    yield inside
            if position > before:
                moved = time.monotonic()
                client_errors.clear()
            elif time.monotonic() - moved > timeout_s:
                last = f"; the last error was {client_errors[-1].str()}" if client_errors else ""
                raise KafkaSourceError(
                    f"split {split}: reading topic {split.tp.topic!r} partition "
                    f"{split.tp.partition} range [{split.start}, {split.end}) made no progress for "
                    f"timeout_s={timeout_s}; the position reached is {position}{last}. Check the "
                    f"broker at {bootstrap_servers!r} or raise timeout_s"
                )
    finally:
        consumer.close()


def _inside(batch: list[Any], split: Split) -> list[Any]:
    """The records of one fetch (offsets ascending) with ``start <= offset < end``."""
    if batch[0].offset() >= split.start and batch[-1].offset() < split.end:
        return batch
    return [r for r in batch if split.start <= r.offset() < split.end]


def _out_of_range(
    bootstrap_servers: str, split: Split, position: int, request_timeout_ms: int
) -> KafkaSourceError:
    """The error for a fetch the broker refused as out of range (retention ran while reading)."""
    with KafkaOffsets(bootstrap_servers, "microcheckpoint-source", request_timeout_ms) as kafka:
        log_start = kafka.beginning_offsets([split.tp])[split.tp]
    if position < log_start:
        return _below_log_start(split, position, log_start)
    return KafkaSourceError(
        f"split {split}: Kafka at {bootstrap_servers!r} answered offset {position} of topic "
        f"{split.tp.topic!r} partition {split.tp.partition} as out of range (log start "
        f"{log_start}); the topic was re-created or truncated: restore from a savepoint"
    )


def to_record(message: Any) -> SourceRecord:
    """The :class:`SourceRecord` of one record of ``read_split_batches``."""
    return SourceRecord(
        topic=message.topic(),
        partition=message.partition(),
        offset=message.offset(),
        timestamp_ms=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=tuple(message.headers() or ()),
    )


# The fields ``batch_columns`` gives, in this order.
_FIELDS = ("offset", "timestamp_ms", "key", "value", "headers")


def batch_columns(batch: list[Any], names: Iterable[str] | None = None) -> dict[str, list[Any]]:
    """One list per field of the records of ``read_split_batches``: ``offset``,
    ``timestamp_ms``, ``key``, ``value`` and ``headers`` (a list of ``(name, value)`` pairs
    or None), or only the fields ``names``, for a caller that builds columns (the engine's
    Arrow batches)."""
    wanted = set(_FIELDS if names is None else names)
    columns = {}
    # one comprehension per field, each calling the client's method inline (the hot path)
    for name in (n for n in _FIELDS if n in wanted):
        if name == "offset":
            columns[name] = [m.offset() for m in batch]
        elif name == "timestamp_ms":
            columns[name] = [m.timestamp()[1] for m in batch]
        elif name == "key":
            columns[name] = [m.key() for m in batch]
        elif name == "value":
            columns[name] = [m.value() for m in batch]
        else:
            columns[name] = [m.headers() for m in batch]
    return columns


@contextlib.contextmanager
def _errors(bootstrap_servers: str, split: Split, what: str) -> Iterator[None]:
    """Turn the Kafka client's exceptions into KafkaSourceError."""
    try:
        yield
    except KafkaException as exc:
        raise _failed(bootstrap_servers, split, what, exc.args[0] if exc.args else exc) from exc


def _failed(bootstrap_servers: str, split: Split, what: str, error: Any) -> KafkaSourceError:
    detail = error.str() if isinstance(error, KafkaError) else repr(error)
    return KafkaSourceError(
        f"split {split}: Kafka at {bootstrap_servers!r} failed while {what}: {detail}; check "
        "the broker, `bootstrap_servers` and that this client may read the topic"
    )
