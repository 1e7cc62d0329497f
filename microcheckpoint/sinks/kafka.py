"""Kafka sink: exactly-once publish after ``_metadata`` without broker transactions (docs/sinks.md).

Tansu 0.6 returns records of aborted transactions to ``read_committed`` consumers,
so exactly-once output cannot rest on Kafka transactions. Instead every record carries headers
that say who wrote it and where it sits in its epoch:

- ``mcp-pipeline``, ``mcp-uid``: the writer (pipeline and sink uid);
- ``mcp-epoch``: the checkpoint id, in decimal;
- ``mcp-seq``: the record's number within (epoch, target partition): 0, 1, 2, … in a fixed
  order (parts in order, rows in order).

``commit`` reads the tail of each target partition, finds which (epoch, seq) of this writer
are already there and produces only the rest, so a commit repeated after a crash, or by a
zombie notifier, publishes nothing twice.

Assumption — one writer per partition: a given partition receives records of this
(pipeline, uid) only from the notify step of that pipeline, one epoch at a time, in epoch
order. Records of other writers (no headers, or another pipeline or uid) may interleave; the
scan ignores them. The checkpoint protocol fences writers: only the notify step after a
completed ``_metadata`` publishes, and the headers make a repeated or zombie commit skip what
is already there. Two commits of the *same* epoch running at the same moment can still race:
both may scan before either produces and then both publish the missing records (duplicates).
The coordinator's single notifier per pipeline is what prevents that; this sink does not.

The assignment of rows to partitions depends on the topic's partition count: do not add
partitions to a topic while an epoch may still be (re)committed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import decimal
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from kafka import KafkaProducer
from kafka import errors as kerr

from microcheckpoint.adapters.decoding import SourceRecord
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.kafka_reader import Split, read_split
from microcheckpoint.errors import ConfigError, KafkaSinkError
from microcheckpoint.faults import Faults
from microcheckpoint.ids import TopicPartition
from microcheckpoint.sinks.base import EpochInfo, Row, Sink

__all__ = ["HEADERS", "KafkaSink", "KafkaSinkError", "read_topic"]

HEADERS = ("mcp-pipeline", "mcp-uid", "mcp-epoch", "mcp-seq")
AT_LEAST_ONCE_PART_STRIDE = 1_000_000  # seq of row i of part p in AT_LEAST_ONCE: p * this + i
_LINGER_MS = 5

_log = logging.getLogger(__name__)

# (seq, key, value) of one record to produce into a partition
_Out = tuple[int, bytes | None, bytes]


class KafkaSink(Sink):
    """Publishes each epoch's rows to a Kafka topic, exactly once per (pipeline, uid, epoch).

    Picklable: it is shipped to Spark executors. Clients are created on first use and are not
    pickled; ``close()`` closes them (the sink may be used again).

    Args:
        uid: the sink's operator uid.
        bootstrap_servers: ``host:port[,host:port...]``.
        topic: the output topic.
        key_column: the column whose value (``str`` as UTF-8, ``bytes`` as is, other values as
            ``str()``) is the record key. Rows are then assigned to partitions by a stable hash
            of the key (blake2b, as for key groups) modulo the partition count. Without it, or
            for a row whose key is None (a null key), by a hash of the row's position
            ``(part index, row index)``.
        value_columns: the columns the JSON value holds (an object in this order), or None
            for the whole row. Dates and times become ISO strings, decimals strings.
        partitions: the partition count ``open()`` creates a missing topic with (1 if None).
            An existing topic keeps its count, and assignment uses the topic's actual count.
        request_timeout_ms: the limit for each broker request.
        scan_chunk: how many records the tail scan reads first; it doubles per step back.
    """

    def __init__(
        self,
        uid: str,
        bootstrap_servers: str,
        topic: str,
        key_column: str | None = None,
        value_columns: Sequence[str] | None = None,
        partitions: int | None = None,
        request_timeout_ms: int = 30_000,
        scan_chunk: int = 256,
    ) -> None:
        super().__init__(uid)
        try:
            TopicPartition(topic, 0)
        except ValueError as exc:
            raise ConfigError("topic", topic, str(exc)) from exc
        if isinstance(value_columns, str) or (
            value_columns is not None and not all(isinstance(c, str) for c in value_columns)
        ):
            raise ConfigError(
                "value_columns", value_columns, "a list of column names, or None for the whole row"
            )
        if partitions is not None and (
            not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1
        ):
            raise ConfigError("partitions", partitions, "an integer >= 1, or None")
        if not isinstance(scan_chunk, int) or scan_chunk < 1:
            raise ConfigError("scan_chunk", scan_chunk, "an integer >= 1")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key_column = key_column
        self.value_columns = None if value_columns is None else tuple(value_columns)
        self.partitions = partitions
        self.request_timeout_ms = request_timeout_ms
        self.scan_chunk = scan_chunk
        self._producer: Any = None
        self._unsettled: list[Any] = []  # producers whose close timed out with sends pending
        self._offsets: KafkaOffsets | None = None
        self._partition_count: int | None = None

    # -- clients and pickling ----------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_producer=None, _unsettled=[], _offsets=None, _partition_count=None)
        return state

    def _kafka(self) -> KafkaOffsets:
        if self._offsets is None:
            self._offsets = KafkaOffsets(
                self.bootstrap_servers, "microcheckpoint-sink", self.request_timeout_ms
            )
        return self._offsets

    def _producer_client(self) -> Any:
        if self._producer is None:
            with self._errors("connecting the producer"):
                # No idempotence, no retries, one request in flight: a failed send is never
                # retried behind our back (which could duplicate); commit re-scans instead.
                # delivery_timeout_ms bounds how long a send can stay pending, so that
                # _drop_clients can wait until none is (Kafka's minimum: linger + request).
                self._producer = KafkaProducer(
                    bootstrap_servers=self.bootstrap_servers,
                    client_id="microcheckpoint-sink",
                    acks="all",
                    retries=0,
                    enable_idempotence=False,
                    max_in_flight_requests_per_connection=1,
                    linger_ms=_LINGER_MS,
                    batch_size=512 * 1024,
                    request_timeout_ms=self.request_timeout_ms,
                    delivery_timeout_ms=self._delivery_timeout_ms(),
                    max_block_ms=self.request_timeout_ms,
                )
        return self._producer

    def _delivery_timeout_ms(self) -> int:
        return self.request_timeout_ms + _LINGER_MS

    def close(self) -> None:
        """Close the clients, once no send through them is pending; re-created on next use."""
        self._drop_clients()

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except kerr.KafkaError as exc:
            raise KafkaSinkError(
                f"Kafka sink {self.uid!r}: Kafka at {self.bootstrap_servers!r} failed while "
                f"{what} (topic {self.topic!r}): {exc!r}; check the broker and call commit "
                "again, which publishes only what is missing"
            ) from exc

    def _count(self) -> int:
        if self._partition_count is None:
            numbers = [tp.partition for tp in self._kafka().partitions(self.topic)]
            if numbers != list(range(len(numbers))):
                raise KafkaSinkError(f"topic {self.topic!r} has partitions {numbers}, not 0..n-1")
            self._partition_count = len(numbers)
        return self._partition_count

    # -- encoding ----------------------------------------------------------------------------

    def _target(self, row: Row, key: bytes | None, part: int, index: int) -> int:
        """The partition row ``index`` of part ``part`` goes to (``key`` is its encoded key)."""
        return self._partition_for(key, part, index)

    def _partition_for(self, key: bytes | None, part: int, index: int) -> int:
        basis = key if key is not None else f"{part}:{index}".encode()
        digest = hashlib.blake2b(basis, digest_size=8).digest()
        return int.from_bytes(digest, "big") % self._count()

    def _encode(self, row: Row) -> tuple[bytes | None, bytes]:
        key: bytes | None = None
        if self.key_column is not None:
            if self.key_column not in row:
                raise KafkaSinkError(
                    f"Kafka sink {self.uid!r}: row has no key column {self.key_column!r} "
                    f"(columns {sorted(row)}); fix key_column"
                )
            raw = row[self.key_column]
            if raw is not None:
                key = raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
        if self.value_columns is None:
            value = row
        else:
            missing = [c for c in self.value_columns if c not in row]
            if missing:
                raise KafkaSinkError(
                    f"Kafka sink {self.uid!r}: row has no columns {missing} (columns "
                    f"{sorted(row)}); fix value_columns"
                )
            value = {c: row[c] for c in self.value_columns}
        try:
            text = json.dumps(
                value, separators=(",", ":"), ensure_ascii=False, default=_json_default
            )
        except (TypeError, ValueError) as exc:
            raise KafkaSinkError(
                f"Kafka sink {self.uid!r}: a row cannot be written as JSON ({exc}); convert the "
                "column to a string or number before the sink"
            ) from exc
        return key, text.encode("utf-8")

    def _headers(self, epoch: EpochInfo, seq: int) -> list[tuple[str, bytes]]:
        values = (epoch.pipeline, self.uid, str(epoch.checkpoint_id), str(seq))
        return [(name, value.encode("utf-8")) for name, value in zip(HEADERS, values, strict=True)]

    def _plan(self, parts: Sequence[Sequence[Row]]) -> dict[int, list[_Out]]:
        """Records per target partition, numbered 0.. in (part, row) order."""
        plan: dict[int, list[_Out]] = {}
        for part, rows in enumerate(parts):
            for index, row in enumerate(rows):
                key, value = self._encode(row)
                records = plan.setdefault(self._target(row, key, part, index), [])
                records.append((len(records), key, value))
        return plan

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Create the topic with ``partitions`` (default 1) if it is missing; idempotent.

        Connects anew: clients kept from an earlier epoch may predate a broker restart, and
        such a client can fail fast or time out although the broker is back.
        """
        self._drop_clients()
        with self._fresh_clients_after_failure():
            self._kafka().create_topic(self.topic, self.partitions or 1)

    @contextlib.contextmanager
    def _fresh_clients_after_failure(self) -> Iterator[None]:
        """Drop the clients when a call fails, so the next call connects anew.

        A client that saw its broker go away (a restart) can keep failing fast
        (``NodeNotReadyError``) long after the broker is back; a long-lived process (a
        local cycle loop, ``run_epoch.py --cycles``) must not be stuck with it.
        """
        try:
            yield
        except Exception:
            self._drop_clients()
            raise

    def _drop_clients(self) -> None:
        """Close the clients; returns once no record sent through them can still be written.

        A producer closed with sends pending (``close(timeout=0)``) keeps its I/O thread, and
        that thread delivers the pending batches when the broker answers again: after the
        next commit's scan found them missing and sent them a second time. So the producer
        is closed gracefully: ``close`` waits until every send is acknowledged, failed, or
        expired (``delivery_timeout_ms``, which bounds the wait), then joins the thread.
        """
        producers = [*self._unsettled, *([self._producer] if self._producer else [])]
        offsets = self._offsets
        self._producer, self._offsets, self._partition_count = None, None, None
        self._unsettled = []
        try:
            wait_s = 2 * self._delivery_timeout_ms() / 1000
            for index, producer in enumerate(producers):
                try:
                    producer.close(timeout=wait_s)
                except kerr.KafkaError as exc:
                    # kept, and waited for again before the next commit scans
                    self._unsettled = producers[index:]
                    raise KafkaSinkError(
                        f"Kafka sink {self.uid!r}: the producer to {self.bootstrap_servers!r} "
                        f"still had sends pending after {wait_s:g} s ({exc!r}); they may yet be "
                        "written, so wait for the broker before calling commit again"
                    ) from exc
        finally:
            if offsets is not None:
                try:
                    offsets.close()
                except Exception as exc:  # a broken metadata client leaks nothing to publish
                    _log.warning("Kafka sink %r: closing its offsets client: %r", self.uid, exc)

    def commit(self, epoch: EpochInfo, parts: Sequence[Sequence[Row]]) -> None:
        """Publish epoch ``epoch`` exactly once (see the module docstring for the assumptions).

        Steps:
            1. Plan: encode every row, assign its partition and its seq within the partition.
            2. Per target partition, scan the tail for this writer's records: a later epoch
               means this epoch is published there (skip); else the seqs of this epoch present.
            3. Produce the missing records in seq order (acks=all, one request in flight, no
               producer retries) and flush. Between the first target partition and the rest
               sits the ``publishing`` hold point (``microcheckpoint.faults``).
            4. Verify every send succeeded; on a failed send raise KafkaSinkError (a new
               ``commit`` call re-scans and publishes only what is missing).

        Raises:
            KafkaSinkError: a row lacks a configured column, or Kafka failed.
            KafkaSourceError: the topic does not exist (call ``open()``) or cannot be read.
        """
        with self._fresh_clients_after_failure():
            if self._unsettled:  # an earlier commit's sends may still land: wait for them
                self._drop_clients()
            self._commit(epoch, parts)

    def _commit(self, epoch: EpochInfo, parts: Sequence[Sequence[Row]]) -> None:
        # Step 1
        plan = self._plan(parts)
        # Step 2
        missing: dict[int, list[_Out]] = {}
        for partition, records in sorted(plan.items()):
            present = self._published(TopicPartition(self.topic, partition), epoch)
            if present is not None:
                todo = [r for r in records if r[0] not in present]
                if todo:
                    missing[partition] = todo
        # Step 3
        producer = self._producer_client()
        futures = []
        held = Faults.from_env()
        with self._errors(f"publishing epoch {epoch.checkpoint_id}"):
            for index, (partition, records) in enumerate(missing.items()):
                if index == 1:  # the hold point: one partition published, the rest not yet
                    held.hold("publishing", lambda: self._flush(producer))
                for seq, key, value in records:
                    futures.append(
                        self._send(producer, partition, key, value, self._headers(epoch, seq))
                    )
            self._flush(producer)
        # Step 4
        self._verify(futures, f"publishing epoch {epoch.checkpoint_id}")

    def _flush(self, producer: Any) -> None:
        producer.flush(timeout=self.request_timeout_ms / 1000)

    def _send(
        self,
        producer: Any,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> Any:
        return producer.send(self.topic, key=key, value=value, headers=headers, partition=partition)

    def _verify(self, futures: list[Any], what: str) -> None:
        failed = [f.exception for f in futures if not f.is_done or f.failed()]
        if failed:
            raise KafkaSinkError(
                f"Kafka sink {self.uid!r}: {len(failed)} of {len(futures)} sends to topic "
                f"{self.topic!r} failed while {what} (first: {failed[0]!r}); call again — "
                "commit publishes only what is missing"
            )

    def _published(self, tp: TopicPartition, epoch: EpochInfo) -> set[int] | None:
        """Seqs of ``epoch`` this writer already has in ``tp``; None when a later epoch is.

        Reads backwards from the end in chunks (``scan_chunk``, doubling) until a chunk holds
        a record of this writer from an earlier epoch, or the beginning of the partition.
        """
        kafka = self._kafka()
        begin = kafka.beginning_offsets([tp])[tp]
        hi = kafka.end_offsets([tp])[tp]
        seqs: set[int] = set()
        size = self.scan_chunk
        while hi > begin:
            lo = max(begin, hi - size)
            older = False
            for record in read_split(
                self.bootstrap_servers, Split(tp, lo, hi), timeout_s=self.request_timeout_ms / 1000
            ):
                mark = _mark(record, epoch.pipeline, self.uid)
                if mark is None:
                    continue
                if mark[0] > epoch.checkpoint_id:
                    return None
                if mark[0] == epoch.checkpoint_id:
                    seqs.add(mark[1])
                else:
                    older = True
            if older:
                break
            hi, size = lo, size * 2
        return seqs

    def write_at_least_once(self, epoch: EpochInfo, part: int, rows: Sequence[Row]) -> None:
        """AT_LEAST_ONCE: produce ``rows`` now, without dedup (a replay duplicates them).

        Row ``i`` gets seq ``part * 1_000_000 + i`` (unique while a part has fewer than a
        million rows) and its partition by key, or by ``(part, i)``.

        Raises:
            KafkaSinkError: a row lacks a configured column, or a send failed.
        """
        with self._fresh_clients_after_failure():
            self._write_now(epoch, part, rows)

    def _write_now(self, epoch: EpochInfo, part: int, rows: Sequence[Row]) -> None:
        producer = self._producer_client()
        futures = []
        what = f"writing part {part} of epoch {epoch.checkpoint_id}"
        with self._errors(what):
            for index, row in enumerate(rows):
                key, value = self._encode(row)
                seq = part * AT_LEAST_ONCE_PART_STRIDE + index
                partition = self._target(row, key, part, index)
                futures.append(
                    self._send(producer, partition, key, value, self._headers(epoch, seq))
                )
            producer.flush(timeout=self.request_timeout_ms / 1000)
        self._verify(futures, what)


def _mark(record: SourceRecord, pipeline: str, uid: str) -> tuple[int, int] | None:
    """(epoch, seq) of a record written by (pipeline, uid), else None (foreign or malformed)."""
    headers = {name: value for name, value in record.headers if value is not None}
    if headers.get("mcp-pipeline") != pipeline.encode() or headers.get("mcp-uid") != uid.encode():
        return None
    try:
        return int(headers["mcp-epoch"]), int(headers["mcp-seq"])
    except (KeyError, ValueError):
        return None


def _json_default(value: Any) -> Any:
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} value {value!r} is not JSON serializable")


def read_topic(
    bootstrap_servers: str, topic: str, partitions: Sequence[int] | None = None
) -> list[tuple[dict[str, str], bytes | None, bytes | None]]:
    """Every record of ``topic`` (or of ``partitions``) as ``(headers, key, value)``.

    In partition order, then offset order; headers decoded as UTF-8 (for tests and the demo).
    """
    with KafkaOffsets(bootstrap_servers, "microcheckpoint-reader") as kafka:
        tps = kafka.partitions(topic)
        if partitions is not None:
            tps = [tp for tp in tps if tp.partition in set(partitions)]
        begin, end = kafka.beginning_offsets(tps), kafka.end_offsets(tps)
    out = []
    for tp in tps:
        for record in read_split(bootstrap_servers, Split(tp, begin[tp], end[tp])):
            headers = {n: (v or b"").decode("utf-8") for n, v in record.headers}
            out.append((headers, record.key, record.value))
    return out
