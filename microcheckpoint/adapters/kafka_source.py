"""Reading a barrier's offset ranges from Kafka: splits, a range reader and value decoding.

Runs inside Spark executors, so it imports kafka-python only (never pyspark). A barrier's
ranges are cut into :class:`Split` s (``split_ranges``); each split is read by one consumer
with manual assignment and no group (``read_split``), which yields exactly the records with
``start <= offset < end``. Every ``end`` is exclusive: one past the last offset of the range.

The reader works on Apache Kafka and on Tansu 0.6 (DESIGN.md §3): the high watermark comes
from :class:`KafkaOffsets` (which corrects Tansu's ListOffsets LATEST with a fetch probe), and
the reader stops when the consumer's position reaches ``end``, not at a record at ``end - 1``,
because compaction and transaction markers leave offset gaps.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as _KTP
from kafka import errors as kerr

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.barrier import Barrier
from microcheckpoint.errors import ConfigError, KafkaSourceError
from microcheckpoint.ids import TopicPartition

__all__ = [
    "VALUE_FORMATS",
    "SCHEMA_TYPES",
    "SourceRecord",
    "Split",
    "check_value_format",
    "decode_record",
    "decode_value",
    "read_split",
    "split_ranges",
]

VALUE_FORMATS = ("bytes", "text", "json")
SCHEMA_TYPES = ("string", "long", "double", "boolean")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(r"-?[0-9]+")  # strings a long field accepts (JSON integer syntax)
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")  # and a double field


@dataclass(frozen=True)
class Split:
    """One unit of reading: offsets ``[start, end)`` of one partition (``end`` exclusive)."""

    tp: TopicPartition
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(
                f"split of {self.tp}: offset range [{self.start}, {self.end}) is invalid"
            )

    def __str__(self) -> str:
        return f"{self.tp}[{self.start}, {self.end})"


@dataclass(frozen=True)
class SourceRecord:
    """One Kafka record as read by ``read_split``; ``headers`` keep the produced order
    (a header value may be None when the producer sent a null)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


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
) -> Iterator[SourceRecord]:
    """Records of ``split`` in offset order: exactly those with ``start <= offset < end``.

    Steps:
        1. An empty split returns an empty iterator at once (no broker call, no checks).
        2. Check the range against the partition, when called: ``start`` below the log start
           offset (records deleted by retention) or ``end`` above the high watermark raises.
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
        stop_at: optional predicate, for multi-stage pipelines (DESIGN.md §6) that read an
            internal topic up to a barrier marker record: the split ends at the first record
            for which it returns True, and that record is not yielded. The predicate is called
            once per record in offset order, so it can remember the marker's offset.
            If no record matches, reading ends at ``end`` as usual.

    Raises:
        KafkaSourceError: the range starts below the log start offset (the message names the
            ways out), ends above the high watermark, the partition does not exist, Kafka did
            not answer, or reading made no progress within ``timeout_s``.
    """
    # Step 1
    if split.start == split.end:
        return iter(())
    # Step 2
    request_timeout_ms = int(min(max(timeout_s, 1.0), 300.0) * 1000)
    with KafkaOffsets(bootstrap_servers, "microcheckpoint-source", request_timeout_ms) as kafka:
        log_start = kafka.beginning_offsets([split.tp])[split.tp]
        high_watermark = kafka.end_offsets([split.tp])[split.tp]
    if split.start < log_start:
        raise _below_log_start(split, split.start, log_start)
    if split.end > high_watermark:
        raise KafkaSourceError(
            f"split {split}: end offset {split.end} is above the high watermark "
            f"{high_watermark} of {split.tp} (topic {split.tp.topic!r}, partition "
            f"{split.tp.partition}); a barrier only points at existing records, so the topic was "
            "re-created or truncated: restore from a savepoint or reset the pipeline's offsets"
        )
    # Step 3
    return _read(bootstrap_servers, split, timeout_s, fetch_max_bytes, request_timeout_ms, stop_at)


def _below_log_start(split: Split, offset: int, log_start: int) -> KafkaSourceError:
    return KafkaSourceError(
        f"split {split}: offset {offset} of topic {split.tp.topic!r} partition "
        f"{split.tp.partition} is below the log start offset {log_start}: records "
        f"[{offset}, {log_start}) were deleted (retention) before this epoch read them. Restore "
        "from a newer savepoint or checkpoint, or reset the pipeline's start offsets with "
        "startup_mode, accepting the loss of those records; nothing is skipped silently"
    )


def _read(
    bootstrap_servers: str,
    split: Split,
    timeout_s: float,
    fetch_max_bytes: int,
    request_timeout_ms: int,
    stop_at: Callable[[SourceRecord], bool] | None,
) -> Iterator[SourceRecord]:
    ktp = _KTP(split.tp.topic, split.tp.partition)
    with _errors(bootstrap_servers, split, "connecting"):
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            client_id="microcheckpoint-source",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            allow_auto_create_topics=False,
            request_timeout_ms=request_timeout_ms,
            fetch_max_wait_ms=100,
            fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=fetch_max_bytes,
        )
    try:
        with _errors(bootstrap_servers, split, "seeking"):
            consumer.assign([ktp])
            consumer.seek(ktp, split.start)
            position = consumer.position(ktp)
        moved = time.monotonic()
        while position < split.end:
            try:
                with _errors(bootstrap_servers, split, f"fetching at offset {position}"):
                    batch = consumer.poll(timeout_ms=100).get(ktp, [])
            except kerr.OffsetOutOfRangeError:
                raise _out_of_range(
                    bootstrap_servers, split, position, request_timeout_ms
                ) from None
            for raw in batch:
                if raw.offset < split.start:
                    continue
                if raw.offset >= split.end:
                    return
                record = _record(raw)
                if stop_at is not None and stop_at(record):
                    return
                yield record
            with _errors(bootstrap_servers, split, "reading the position"):
                now = consumer.position(ktp)
            if now > position:
                position, moved = now, time.monotonic()
            elif time.monotonic() - moved > timeout_s:
                raise KafkaSourceError(
                    f"split {split}: reading topic {split.tp.topic!r} partition "
                    f"{split.tp.partition} range [{split.start}, {split.end}) made no progress for "
                    f"timeout_s={timeout_s}; the position reached is {position}. Check the "
                    f"broker at {bootstrap_servers!r} or raise timeout_s"
                )
    finally:
        consumer.close(autocommit=False)


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


def _record(raw: Any) -> SourceRecord:
    return SourceRecord(
        topic=raw.topic,
        partition=raw.partition,
        offset=raw.offset,
        timestamp_ms=raw.timestamp,
        key=raw.key,
        value=raw.value,
        headers=tuple((name, value) for name, value in raw.headers or ()),
    )


@contextlib.contextmanager
def _errors(bootstrap_servers: str, split: Split, what: str) -> Iterator[None]:
    """Turn kafka-python errors (other than OffsetOutOfRange) into KafkaSourceError."""
    try:
        yield
    except kerr.OffsetOutOfRangeError:
        raise
    except kerr.KafkaError as exc:
        raise KafkaSourceError(
            f"split {split}: Kafka at {bootstrap_servers!r} failed while {what}: {exc!r}; check "
            "the broker, `bootstrap_servers` and that this client may read the topic"
        ) from exc


# -- value decoding --------------------------------------------------------------------------


def check_value_format(fmt: str, schema: dict[str, str] | None = None) -> None:
    """Validate a value format and optional JSON schema (at load time).

    Raises:
        ConfigError: ``fmt`` is not one of ``VALUE_FORMATS``, a schema is given for a format
            other than ``json``, or a schema type is not one of ``SCHEMA_TYPES``.
    """
    if fmt not in VALUE_FORMATS:
        raise ConfigError("value_format", fmt, f"one of {', '.join(VALUE_FORMATS)}")
    if schema is None:
        return
    if fmt != "json":
        raise ConfigError("value_schema", schema, "a schema only applies to value_format 'json'")
    if not isinstance(schema, dict):
        raise ConfigError("value_schema", schema, "a mapping of field name to type")
    for name, kind in schema.items():
        if not isinstance(name, str) or kind not in SCHEMA_TYPES:
            raise ConfigError(
                "value_schema", {name: kind}, f"field names map to one of {', '.join(SCHEMA_TYPES)}"
            )


def decode_value(value: bytes | None, fmt: str, schema: dict[str, str] | None = None) -> Any:
    """Decode a record value.

    - ``bytes``: the value as it is.
    - ``text``: the value as strict UTF-8.
    - ``json``: strict JSON in UTF-8 (``NaN`` and ``Infinity`` are refused). With ``schema``
      (``{field: type}``), the value must be an object and the result is a dict with exactly
      the schema's fields in the schema's order: a missing field or JSON ``null`` gives None,
      other fields are dropped. Types: ``string`` (str; a number, boolean, object or array
      becomes its compact JSON text), ``long`` (an integer in the signed 64-bit range, an
      integral float or a string holding an integer), ``double`` (a number or a string
      holding a finite number), ``boolean`` (true/false or the strings "true"/"false").

    A null value (a tombstone) decodes to None in every format.

    Raises:
        ConfigError: ``fmt`` or ``schema`` is invalid (see ``check_value_format``).
        ValueError: the value is not valid UTF-8 or JSON, or does not fit the schema.
    """
    check_value_format(fmt, schema)
    if value is None or fmt == "bytes":
        return value
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"value is not valid UTF-8: {exc}") from None
    if fmt == "text":
        return text
    try:
        parsed = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError, a refused constant, an over-long integer
        raise ValueError(f"value is not valid JSON: {exc}") from None
    if schema is None:
        return parsed
    if not isinstance(parsed, dict):
        raise ValueError(f"value is JSON {type(parsed).__name__}, the schema needs an object")
    return {name: _coerce(name, parsed.get(name), kind) for name, kind in schema.items()}


def decode_record(record: SourceRecord, fmt: str, schema: dict[str, str] | None = None) -> Any:
    """``decode_value`` of ``record.value``, with errors that name where the record is.

    Raises:
        ConfigError: ``fmt`` or ``schema`` is invalid.
        KafkaSourceError: the value cannot be decoded; the message names topic, partition and
            offset.
    """
    check_value_format(fmt, schema)
    try:
        return decode_value(record.value, fmt, schema)
    except ValueError as exc:
        raise KafkaSourceError(
            f"record at offset {record.offset} of topic {record.topic!r} partition "
            f"{record.partition} cannot be decoded as value_format {fmt!r}: {exc}; fix the "
            "producer, or change value_format / value_schema"
        ) from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _coerce(name: str, raw: Any, kind: str) -> Any:
    if raw is None:
        return None
    if kind == "string":
        return raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
    if kind == "boolean":
        if isinstance(raw, bool):
            return raw
        if raw in ("true", "false"):
            return raw == "true"
    elif kind == "long":
        number = _long(raw)
        if number is not None:
            return number
    elif kind == "double":
        number = _double(raw)
        if number is not None:
            return number
    raise ValueError(f"field {name!r} must be {kind}, got {json.dumps(raw)[:80]}")


def _long(raw: Any) -> int | None:
    if (isinstance(raw, float) and raw.is_integer()) or (
        isinstance(raw, str) and len(raw) <= 20 and _INTEGER.fullmatch(raw)
    ):
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    return raw if _LONG_MIN <= raw <= _LONG_MAX else None


def _double(raw: Any) -> float | None:
    if isinstance(raw, str) and len(raw) <= 400 and _NUMBER.fullmatch(raw):
        raw = float(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    try:
        number = float(raw)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
