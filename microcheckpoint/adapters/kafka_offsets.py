"""Kafka offsets for checkpointed sources: partitions, begin/end, by-time and group offsets,
and what retention needs (``retention.ms``, record timestamps).

Works on Apache Kafka and on Tansu 0.6 (the dev broker), whose answers to two requests are
wrong: ListOffsets LATEST (corrected with a fetch probe's high watermark) and
ListOffsets by timestamp (verified by fetching around the answer, else a binary search by
fetch). All offsets are exclusive-end positions in the Kafka sense: the end offset of a
partition is one past its last record, and an empty partition has ``end == beginning``.

Not thread-safe: use one ``KafkaOffsets`` per thread.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as _KTP
from kafka import errors as kerr
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.structs import OffsetAndMetadata

from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.ids import TopicPartition

__all__ = ["KafkaOffsets", "kafka_python_client", "retry_helps"]

_Offsets = dict[TopicPartition, int]
_Client = TypeVar("_Client")

_UNREACHABLE = tuple(
    e for e in (getattr(kerr, "NoBrokersAvailable", None), kerr.KafkaConnectionError) if e
)


def _k(tp: TopicPartition) -> _KTP:
    return _KTP(tp.topic, tp.partition)


def kafka_python_client(kind: Callable[..., _Client], **config: Any) -> _Client:
    """``kind(**config)``, a kafka-python consumer or admin client, whose network client is
    closed when the constructor raises.

    kafka-python starts the network client's IO thread before it first reaches a broker; a
    constructor that fails there (no broker answered) returns no object to close, and the
    thread would go on reconnecting for the rest of the process, one more each time. The
    network client is made through kafka-python's ``kafka_client`` setting, the class's
    own, and kept here until the constructor returns.
    """
    made: list[Any] = []
    default = kind.DEFAULT_CONFIG["kafka_client"]  # type: ignore[attr-defined]

    def network_client(**settings: Any) -> Any:
        made.append(default(**settings))
        return made[-1]

    try:
        return kind(**config, kafka_client=network_client)
    except BaseException:
        for client in made:
            with contextlib.suppress(Exception):
                client.close()
        raise


def retry_helps(error: Any) -> bool:
    """Whether librdkafka's own retries may get past ``error`` (a ``KafkaError``): it is
    retriable, or the broker is unreachable for now (a transport error, every broker down,
    a name that did not resolve). Fatal errors and refusals (ACLs, say) are not."""
    from confluent_kafka import KafkaError

    transient = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE)
    return not error.fatal() and (error.retriable() or error.code() in transient)


class KafkaOffsets:
    """Offset queries and consumer-group commits against one Kafka cluster.

    Clients are created on first use and closed by ``close()`` (or leaving a ``with`` block);
    the consumers used to fetch records are created per call and always closed.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        client_id: the Kafka client id, visible in broker logs.
        request_timeout_ms: the limit for each broker request, for connecting at all, and for
            each fetch probe (end offsets, by-time lookups).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str = "microcheckpoint-offsets",
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self._admin: Any = None
        self._meta: Any = None

    # -- clients -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn kafka-python errors raised while doing ``what`` into KafkaSourceError."""
        try:
            yield
        except KafkaSourceError:
            raise
        except (*_UNREACHABLE, kerr.KafkaTimeoutError) as exc:
            raise KafkaSourceError(
                f"Kafka at bootstrap servers {self.bootstrap_servers!r} did not answer while "
                f"{what} within request_timeout_ms={self.request_timeout_ms} ({exc}); start the "
                "broker, or fix `bootstrap_servers` or the network"
            ) from exc
        except kerr.KafkaError as exc:
            raise KafkaSourceError(
                f"Kafka at {self.bootstrap_servers!r} failed while {what}: {exc!r}; check that "
                "the topic, partitions and group exist and that this client may use them"
            ) from exc

    def _consumer(self, **extra: Any) -> Any:
        config = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "bootstrap_timeout_ms": self.request_timeout_ms,
            "fetch_max_wait_ms": min(50, self.request_timeout_ms // 2),
            "enable_auto_commit": False,
            "allow_auto_create_topics": False,
            "auto_offset_reset": "earliest",
        }
        with self._errors("connecting"):
            return kafka_python_client(KafkaConsumer, **{**config, **extra})

    def _meta_consumer(self) -> Any:
        if self._meta is None:
            self._meta = self._consumer()
        return self._meta

    def _admin_client(self) -> Any:
        if self._admin is None:
            with self._errors("connecting"):
                self._admin = kafka_python_client(
                    KafkaAdminClient,
                    bootstrap_servers=self.bootstrap_servers,
                    client_id=self.client_id,
                    request_timeout_ms=self.request_timeout_ms,
                    bootstrap_timeout_ms=self.request_timeout_ms,
                )
        return self._admin

    def close(self) -> None:
        """Close the clients; the object may be used again (clients are re-created)."""
        meta, admin, self._meta, self._admin = self._meta, self._admin, None, None
        try:
            if meta is not None:
                meta.close(autocommit=False)
        finally:
            if admin is not None:
                admin.close()

    def __enter__(self) -> KafkaOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topics and listed offsets -----------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int = 1,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """Create ``topic``, with topic ``configs`` such as ``{"retention.ms": "86400000"}``;
        an existing topic is left as it is (its partition count and configs too)."""
        spec: dict[str, Any] = {
            "num_partitions": partitions,
            "replication_factor": replication_factor,
        }
        if configs:
            spec["configs"] = dict(configs)
        with (
            self._errors(f"creating topic {topic!r}"),
            contextlib.suppress(kerr.TopicAlreadyExistsError),
        ):
            self._admin_client().create_topics({topic: spec}, wait_for_metadata=True)

    def _describe(self, topics: set[str]) -> dict[str, list[int]]:
        """Partition numbers of each topic; raise KafkaSourceError for a missing topic."""
        with self._errors(f"describing topics {sorted(topics)}"):
            infos = self._admin_client().describe_topics(sorted(topics))
        found = {}
        for info in infos:
            code, name = info["error_code"], info["name"]
            if code == kerr.UnknownTopicOrPartitionError.errno or (
                not code and not info["partitions"]
            ):
                raise KafkaSourceError(
                    f"Kafka topic {name!r} does not exist on {self.bootstrap_servers!r}; "
                    "create it or fix `topics`"
                )
            if code:
                raise KafkaSourceError(
                    f"describing Kafka topic {name!r} on {self.bootstrap_servers!r} failed with "
                    f"{kerr.for_code(code).__name__}; check the topic and this client's ACLs"
                )
            found[name] = sorted(p["partition_index"] for p in info["partitions"])
        return found

    def _known(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """``tps`` as a list, checked to exist (Tansu answers offset 0 for unknown ones)."""
        tps = list(tps)
        described = self._describe({tp.topic for tp in tps}) if tps else {}
        for tp in tps:
            if tp.partition not in described.get(tp.topic, ()):
                raise KafkaSourceError(
                    f"partition {tp} does not exist on {self.bootstrap_servers!r}: topic "
                    f"{tp.topic!r} has partitions {described.get(tp.topic)}; fix the partition"
                )
        return tps

    def _listed(self, kind: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """ListOffsets EARLIEST (``kind="beginning"``) or LATEST (``"end"``) as answered."""
        with self._errors(f"listing {kind} offsets of {[str(tp) for tp in tps]}"):
            got = getattr(self._meta_consumer(), f"{kind}_offsets")(
                [_k(tp) for tp in tps], timeout_ms=self.request_timeout_ms
            )
        return {tp: int(got[_k(tp)]) for tp in tps}

    def partitions(self, topic: str) -> list[TopicPartition]:
        """The partitions of ``topic``, sorted by number.

        Raises:
            KafkaSourceError: the topic does not exist, or the broker cannot be reached.
        """
        return [TopicPartition(topic, p) for p in self._describe({topic})[topic]]

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still in each partition (0 unless retention or deletion removed
        records); equal to the end offset when the partition is empty.

        Raises:
            KafkaSourceError: a topic or partition does not exist, or Kafka did not answer.
        """
        return self._listed("beginning", self._known(tps))

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: one past its last record (exclusive).

        Computed as the larger of the ListOffsets LATEST answer and the high watermark of a
        fetch from ``max(beginning, listed - 1)``, since Tansu under-reports LATEST. An empty
        partition gives its beginning offset. Records produced during the call may or may not
        be counted, as with Kafka's own ``end_offsets``.

        Raises:
            KafkaSourceError: a topic or partition does not exist, or no fetch answered within
                ``request_timeout_ms``.
        """
        return self._bounds(self._known(tps))[1]

    def _bounds(self, tps: list[TopicPartition]) -> tuple[_Offsets, _Offsets]:
        """(beginning, end) offsets of ``tps``, the end corrected by a fetch probe."""
        if not tps:
            return {}, {}
        begin, listed = self._listed("beginning", tps), self._listed("end", tps)
        water = self._highwater({tp: max(begin[tp], listed[tp] - 1) for tp in tps})
        return begin, {tp: max(listed[tp], water[tp]) for tp in tps}

    def _highwater(self, starts: Mapping[TopicPartition, int]) -> _Offsets:
        """Each partition's high watermark as a fetch from ``starts[tp]`` answers it.

        The probe is a confluent-kafka consumer (librdkafka decodes the fetched batch in C;
        kafka-python decoded a whole producer batch in Python, 1,000 records or more, to
        read one number). A new consumer per probe, and a partition's watermark is read only
        once this consumer has had a record or the end of that partition from its own
        fetch, so no value comes from an earlier call. The partition is then unassigned: the
        rest of its fetched batch (thousands of records, from Tansu's low LATEST) is dropped,
        not polled record by record.
        """
        from confluent_kafka import KafkaException

        try:
            return self._probe_highwater(starts)
        except KafkaException as exc:
            raise KafkaSourceError(
                f"Kafka at {self.bootstrap_servers!r} failed while probing the high watermark "
                f"of {[str(tp) for tp in starts]}: {exc}; check the broker and that this "
                "client may read the topic"
            ) from exc

    def _probe_highwater(self, starts: Mapping[TopicPartition, int]) -> _Offsets:
        from confluent_kafka import Consumer, KafkaError, KafkaException
        from confluent_kafka import TopicPartition as _CTP

        probe = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "client.id": self.client_id,
                "group.id": self.client_id,  # required by the client; never joined
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",  # retention ran meanwhile: still an answer
                # as the reader, and as kafka-python's default: an open transaction's
                # records count, so the fetch from the high watermark - 1 answers at once
                "isolation.level": "read_uncommitted",
                "allow.auto.create.topics": False,
                "socket.timeout.ms": min(max(self.request_timeout_ms, 10), 300_000),
                "fetch.wait.max.ms": 10,
                "fetch.max.bytes": 1024,
                "message.max.bytes": 1000,  # the client requires fetch.max.bytes >= this
                "max.partition.fetch.bytes": 1024,
                "log_level": 2,
            }
        )
        water: _Offsets = {}
        last: deque[Any] = deque(maxlen=1)  # the client's last error (it retries)
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        try:
            probe.assign([_CTP(tp.topic, tp.partition, at) for tp, at in starts.items()])
            while len(water) < len(starts):
                if time.monotonic() > deadline:
                    missing = [str(tp) for tp in starts if tp not in water]
                    detail = f"; the last error was {last[-1].str()}" if last else ""
                    raise KafkaSourceError(
                        f"no fetch response from {self.bootstrap_servers!r} gave the high "
                        f"watermark of {missing} within request_timeout_ms="
                        f"{self.request_timeout_ms}{detail}; check the broker's health or "
                        "raise request_timeout_ms"
                    )
                # One event at a time: ``consume(n, timeout)`` would wait for n events
                # or the whole timeout, 50 ms per probe where a fetch takes a few.
                message = probe.poll(0.05)
                if message is None:
                    continue
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    if not retry_helps(error):
                        raise KafkaException(error)  # refused (ACLs, say): no retry helps
                    last.append(error)
                    continue  # the client retries; the deadline bounds the wait
                tp = TopicPartition(message.topic(), message.partition())
                if tp in starts and tp not in water:
                    ctp = _CTP(tp.topic, tp.partition)
                    water[tp] = int(probe.get_watermark_offsets(ctp, cached=True)[1])
                    probe.incremental_unassign([ctp])
        finally:
            probe.close()
        return water

    # -- offsets by time ---------------------------------------------------------------------

    def offsets_for_times(
        self, tps: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int]:
        """For each partition, the earliest offset whose record timestamp is >= ``timestamp_ms``,
        or the end offset when there is no such record (Kafka semantics).

        The broker's answer is trusted only after fetching the record at it (timestamp >=
        ``timestamp_ms``) and the one just before it (timestamp < ``timestamp_ms``, or the
        answer is the beginning offset). Otherwise (Tansu answers 0 for any timestamp) the
        offset is found by a binary search by fetch over ``[beginning, end)``, which assumes
        timestamps that do not decrease along the partition (LogAppendTime, or CreateTime
        from one ordered producer). Offset gaps (compaction, transaction markers) are allowed;
        the result is then the offset of the first record at or after the searched position.

        Raises:
            KafkaSourceError: ``timestamp_ms`` is negative, or Kafka could not answer.
        """
        if timestamp_ms < 0:
            raise KafkaSourceError(
                f"offsets_for_times timestamp_ms={timestamp_ms} is negative; pass milliseconds "
                "since the epoch (>= 0)"
            )
        tps = self._known(tps)
        if not tps:
            return {}
        begin, end = self._bounds(tps)
        with self._errors(f"listing offsets of {[str(tp) for tp in tps]} at {timestamp_ms}"):
            answers = self._meta_consumer().offsets_for_times(
                {_k(tp): timestamp_ms for tp in tps}, timeout_ms=self.request_timeout_ms
            )
        reader = self._consumer(max_partition_fetch_bytes=1024)
        result: dict[TopicPartition, int] = {}
        try:
            with self._errors(f"fetching records of {[str(tp) for tp in tps]}"):
                for tp in tps:
                    answer = answers.get(_k(tp))
                    guess = end[tp] if answer is None else int(answer.offset)
                    span = (begin[tp], end[tp])
                    found = self._verified(reader, tp, span, guess, timestamp_ms)
                    if found is None:
                        found = self._search(reader, tp, span, timestamp_ms)
                    result[tp] = found
        finally:
            reader.close(autocommit=False)
        return result

    def _verified(
        self, reader: Any, tp: TopicPartition, span: tuple[int, int], guess: int, ts: int
    ) -> int | None:
        """``guess`` normalised to a record offset if it is the answer for ``ts``, else None."""
        lo, hi = span
        if not lo <= guess <= hi:
            return None
        if guess > lo:
            before = self._record_at(reader, tp, guess - 1, hi)
            if before is None or before.offset != guess - 1 or before.timestamp >= ts:
                return None
        at = self._record_at(reader, tp, guess, hi)
        if at is None:
            return hi
        return at.offset if at.timestamp >= ts else None

    def _search(self, reader: Any, tp: TopicPartition, span: tuple[int, int], ts: int) -> int:
        lo, hi = span  # invariant: the answer position lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            record = self._record_at(reader, tp, mid, span[1])
            if record is None or record.timestamp >= ts:
                hi = mid
            else:
                lo = record.offset + 1
        record = self._record_at(reader, tp, lo, span[1])
        return span[1] if record is None else record.offset

    def _record_at(self, reader: Any, tp: TopicPartition, offset: int, end: int) -> Any:
        """The first record at or after ``offset`` and before ``end``, or None."""
        if offset >= end:
            return None
        ktp = _k(tp)
        reader.assign([ktp])
        reader.seek(ktp, offset)
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while time.monotonic() < deadline:
            for record in reader.poll(timeout_ms=100, max_records=1).get(ktp, []):
                if record.offset >= offset:
                    return record if record.offset < end else None
            if reader.position(ktp) >= end:
                return None
        raise KafkaSourceError(
            f"no record of {tp} at or after offset {offset} arrived from "
            f"{self.bootstrap_servers!r} within request_timeout_ms={self.request_timeout_ms}; "
            "check the broker's health or raise request_timeout_ms"
        )

    # -- retention ---------------------------------------------------------------------------

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None]:
        """Each topic's ``retention.ms`` as the broker describes it (DescribeConfigs, every
        config, not just the modified ones); ``-1`` means unlimited.

        None for a topic whose value the broker does not report: Tansu 0.6 reports only the
        configs a topic was created with, Kafka always reports one (the broker default if
        the topic has no override).

        Raises:
            KafkaSourceError: the broker could not answer.
        """
        topics = sorted(set(topics))
        if not topics:
            return {}
        resources = [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics]
        with self._errors(f"describing the configs of topics {topics}"):
            described = self._admin_client().describe_configs(resources, config_filter="all")
        found: dict[str, int | None] = {}
        for topic in topics:
            entry = described.get("topic", {}).get(topic, {}).get("retention.ms") or {}
            try:
                found[topic] = int(entry["value"])
            except (KeyError, TypeError, ValueError):
                found[topic] = None
        return found

    def record_timestamps(
        self, positions: Iterable[tuple[TopicPartition, int]]
    ) -> dict[tuple[TopicPartition, int], int | None]:
        """The timestamp (ms) of the record at each (partition, offset), fetched.

        Where ``offset`` falls in a gap (compaction, transaction markers), the first record
        after it is used. None where there is no such record: the offset is at or past the
        log end (nothing produced there yet), or below the log start (already deleted).

        Raises:
            KafkaSourceError: a topic or partition does not exist, or Kafka did not answer.
        """
        positions = sorted(set(positions), key=lambda p: (p[0].topic, p[0].partition, p[1]))
        if not positions:
            return {}
        tps = self._known(dict.fromkeys(tp for tp, _ in positions))
        begin, end = self._bounds(tps)
        reader = self._consumer(max_partition_fetch_bytes=1024)
        found: dict[tuple[TopicPartition, int], int | None] = {}
        try:
            with self._errors(f"fetching records of {[str(tp) for tp in tps]}"):
                for tp, offset in positions:
                    record = None
                    if offset >= begin[tp]:
                        record = self._record_at(reader, tp, offset, end[tp])
                    found[(tp, offset)] = None if record is None else int(record.timestamp)
        finally:
            reader.close(autocommit=False)
        return found

    # -- consumer groups ---------------------------------------------------------------------

    def commit_group_offsets(
        self, group_id: str, offsets: dict[TopicPartition, int], metadata: str = ""
    ) -> None:
        """Commit ``offsets`` (next offset to read, per partition) for ``group_id``.

        The commit is a standalone (generation-less) commit, as Kafka allows for manually
        assigned consumers; it fails if the group has live members. Tansu drops ``metadata``.
        It goes through this object's admin client (an OffsetCommit to the group's
        coordinator), so a client already connected commits without a new bootstrap.
        """
        if not offsets:
            return
        self._known(offsets)
        bad = {str(tp): off for tp, off in offsets.items() if off < 0}
        if bad:
            raise KafkaSourceError(
                f"group {group_id!r}: offsets to commit must be >= 0, got {bad}; pass the next "
                "offset to read"
            )
        admin = self._admin_client()
        what = f"committing offsets of group {group_id!r}"
        with self._errors(what):
            answers = admin.alter_group_offsets(
                group_id,
                {_k(tp): OffsetAndMetadata(off, metadata, -1) for tp, off in offsets.items()},
            )
        failed = {
            f"{tp.topic}:{tp.partition}": error.__name__
            for tp, error in answers.items()
            if error is not kerr.NoError
        }
        if failed:
            raise KafkaSourceError(
                f"Kafka at {self.bootstrap_servers!r} refused {what}: {failed}; a group with "
                "live members cannot take a standalone commit: stop its consumers, or give "
                "the pipeline its own group_id"
            )

    def committed_group_offsets(
        self, group_id: str, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The offsets committed by ``group_id``; None for a partition without a commit
        (including partitions of topics that do not exist)."""
        tps = list(tps)
        if not tps:
            return {}
        with self._errors(f"reading committed offsets of group {group_id!r}"):
            got = self._admin_client().list_group_offsets({group_id: [_k(tp) for tp in tps]})
        per_tp = got.get(group_id, {})
        out: dict[TopicPartition, int | None] = {}
        for tp in tps:
            committed = per_tp.get(_k(tp))
            out[tp] = None if committed is None or committed.offset < 0 else int(committed.offset)
        return out
