"""What a pipeline reads: Kafka, a stage's internal topic, a folder of files, files then
Kafka, or several Kafka inputs as one; each with an optional event time.

Declarations only (frozen dataclasses, checked on creation); the readers are in
``engine.sources`` and ``engine.filescan``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from microcheckpoint.engine.watermarks import EventTime
from microcheckpoint.errors import ConfigError
from microcheckpoint.ids import OperatorUid

__all__ = [
    "FileSource",
    "HybridSource",
    "KafkaSource",
    "Source",
    "StageSource",
    "UnionSource",
    "source_event_time",
    "uid_of",
]


def _check_event_time(event_time: object) -> None:
    if event_time is not None and not isinstance(event_time, EventTime):
        raise ConfigError(
            "event_time", event_time, "an EventTime(column, max_out_of_orderness_ms) or None"
        )


def source_event_time(source: Source) -> EventTime | None:
    """The event time a pipeline's source declares (every input of a union or hybrid source
    that declares one must declare the same), or None."""
    if isinstance(source, UnionSource):
        declared = {i.event_time for i in source.inputs if i.event_time is not None}
    elif isinstance(source, HybridSource):
        declared = {s.event_time for s in (source.files, source.kafka) if s.event_time is not None}
    else:
        return source.event_time
    if len(declared) > 1:
        raise ConfigError(
            "event_time", sorted(map(str, declared)), "the same EventTime on every input"
        )
    return next(iter(declared), None)


def uid_of(kind: str, uid: object) -> str:
    """``uid`` checked as an operator uid of a ``kind`` (named in the error)."""
    if not uid:
        raise ConfigError("uid", uid, f"every {kind} needs a stable, unique uid")
    try:
        return OperatorUid(str(uid)).value
    except ValueError as exc:
        raise ConfigError("uid", uid, str(exc)) from exc


@dataclass(frozen=True)
class KafkaSource:
    """Reads each partition's barrier range; its offsets are its operator state.

    Records have the columns ``topic, partition, offset, timestamp_ms, key, headers`` and
    ``value`` decoded per ``value_format`` (``bytes``, ``text`` or ``json``; with ``json``
    and a ``schema`` of ``{field: string|long|double|boolean}`` the fields become columns).

    ``timeout_s`` bounds how long a reader waits for the broker: a split whose position has
    not moved for that long fails the epoch, naming the broker and the client's last error
    (and it bounds the driver's check of the ranges). Keep it below the checkpoint timeout,
    so that a broker down for longer declines the checkpoint with that reason instead of
    letting it expire (docs/engine.md).

    ``event_time`` declares the rows' event-time column and its bounded out-of-orderness:
    the pipeline then has a watermark (``engine.watermarks``) that process functions' timers
    and windows follow.
    """

    uid: str
    topics: Sequence[str]
    value_format: str = "bytes"
    schema: dict[str, str] | None = None
    max_records_per_split: int = 100_000
    timeout_s: float = 60.0
    event_time: EventTime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", uid_of("source", self.uid))
        object.__setattr__(self, "topics", tuple(self.topics))
        _check_event_time(self.event_time)
        if not self.topics:
            raise ConfigError("topics", self.topics, "at least one Kafka topic")
        if self.value_format not in ("bytes", "text", "json"):
            raise ConfigError("value_format", self.value_format, "one of bytes, text, json")
        if self.max_records_per_split < 1:
            raise ConfigError(
                "max_records_per_split", self.max_records_per_split, "an integer >= 1"
            )
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or not self.timeout_s > 0
        ):
            raise ConfigError("timeout_s", self.timeout_s, "a number of seconds > 0")


@dataclass(frozen=True)
class StageSource(KafkaSource):
    """Reads an internal topic written by an upstream stage's ``StageSink``: a Kafka source
    whose epoch ends, in every partition, at the upstream's next barrier marker.

    ``upstream`` is the upstream stage's pipeline name, ``upstream_uid`` its stage sink's uid.
    Rows are the upstream's rows (``value_format="json"`` with ``schema``, the columns it
    wrote), plus ``topic, partition, offset, timestamp_ms, key, headers``; markers never
    reach the rows. Where a checkpoint ends in each partition follows the checkpointing mode
    (``adapters.stage_offsets``): aligned (the default) waits for every partition's marker,
    unaligned and at-least-once do not (docs/stages.md).
    """

    upstream: str = ""
    upstream_uid: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.upstream:
            raise ConfigError("upstream", self.upstream, "the upstream stage's pipeline name")
        object.__setattr__(self, "upstream_uid", uid_of("stage sink", self.upstream_uid))
        if self.value_format != "json" or not self.schema:
            raise ConfigError(
                "schema", self.schema, "the {column: type} the upstream stage writes (json)"
            )


@dataclass(frozen=True)
class FileSource:
    """Reads the files of a folder (``file:///path`` or ``s3://bucket/prefix``) in name order.

    The folder is one source partition (topic ``files.<uid>``) whose offsets are file
    positions: barrier n holds up to ``max_files_per_epoch`` more files, named in its
    ``_pending``, so a re-run reads exactly them. The folder must only grow in name order
    (new files sort after the old ones); a rewritten past is refused. Names starting with
    ``_`` or ``.`` are skipped. ``format`` is ``parquet`` (columns from the files) or
    ``jsonl`` (one JSON object per line, fields per ``schema``, ``{field: type}`` as for
    ``KafkaSource``). Rows carry ``source_file`` and ``source_row`` (their position, as Kafka
    rows carry partition and offset), so a key's rows reach its function in file order.
    """

    uid: str
    url: str
    format: str = "parquet"
    schema: dict[str, str] | None = None
    max_files_per_epoch: int | None = None
    event_time: EventTime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", uid_of("source", self.uid))
        _check_event_time(self.event_time)
        if not (self.url.startswith("file:///") or self.url.startswith("s3://")):
            raise ConfigError(
                "url", self.url, "a folder URL: file:///absolute/path or s3://bucket/prefix"
            )
        if self.format not in ("parquet", "jsonl"):
            raise ConfigError("format", self.format, "parquet or jsonl")
        if self.format == "jsonl" and not self.schema:
            raise ConfigError("schema", self.schema, "a {field: type} mapping for jsonl files")
        if self.max_files_per_epoch is not None and self.max_files_per_epoch < 1:
            raise ConfigError(
                "max_files_per_epoch", self.max_files_per_epoch, "an integer >= 1 or None"
            )

    @property
    def topics(self) -> tuple[str, ...]:
        """The folder's one partition, named like a topic."""
        return (f"files.{self.uid}",)


@dataclass(frozen=True)
class HybridSource:
    """Files first, then Kafka (Flink's HybridSource): backfill from an archive, then go live.

    Epochs read ``files`` until every file present is read; from the next epoch on they read
    ``kafka``'s partitions, which start where ``startup_mode`` says (``timestamp`` at the
    archive's end, or the group's committed offsets). Rows of both have the same columns
    where their names agree (a ``json`` Kafka source with the files' schema).
    """

    uid: str
    files: FileSource
    kafka: KafkaSource

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", uid_of("source", self.uid))

    @property
    def topics(self) -> tuple[str, ...]:
        return (*self.files.topics, *self.kafka.topics)


@dataclass(frozen=True)
class UnionSource:
    """Several Kafka inputs (sources or stage sources) read as one, for a fan-in stage.

    One source operator (``uid``) whose offsets are every input's partitions. Rows carry
    ``input``, the uid of the input they came from, and every input's columns (missing ones
    are null), so a two-input keyed operator (``co_keyed``) can tell left from right. Stage
    inputs align each on its own upstream's markers.
    """

    uid: str
    inputs: Sequence[KafkaSource]

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", uid_of("source", self.uid))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if len(self.inputs) < 2 or not all(isinstance(i, KafkaSource) for i in self.inputs):
            raise ConfigError(
                "inputs", self.inputs, "two or more KafkaSource or StageSource inputs"
            )
        uids = [i.uid for i in self.inputs]
        if len(set(uids)) != len(uids):
            raise ConfigError("inputs", uids, "inputs with distinct uids")
        topics = [t for i in self.inputs for t in i.topics]
        if len(set(topics)) != len(topics):
            raise ConfigError("inputs", topics, "inputs that read distinct topics")

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(t for i in self.inputs for t in i.topics)


Source = KafkaSource | FileSource | HybridSource | UnionSource
