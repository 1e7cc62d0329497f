"""Sources as Arrow: an epoch's records arrive in the executors as Arrow record batches.

``KafkaSplitReader`` is a ``mapInArrow`` function over ``spark.range(n_splits)``: each row is
a split of the barrier, read by one consumer in an executor and turned into record batches
column by column, so no Python row object crosses into Spark. No Spark import here.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from microcheckpoint.adapters.decoding import (
    check_value_format,
    decode_json_columns,
    decode_record,
)
from microcheckpoint.engine.gc_pause import fewer_gc_passes
from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.faults import Faults

__all__ = [
    "HEADERS",
    "FileReader",
    "KafkaSplitReader",
    "fields_schema",
    "kafka_schema",
    "source_offsets",
]

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_FIELD_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}


def fields_schema(schema: dict[str, str]) -> pa.Schema:
    """The Arrow schema of ``{field: string|long|double|boolean}``."""
    return pa.schema([(name, _FIELD_TYPES[kind]) for name, kind in schema.items()])


def kafka_schema(
    value_format: str, schema: dict[str, str] | None, columns: tuple[str, ...] | None = None
) -> tuple[pa.Schema, str]:
    """The Arrow schema of a Kafka source's rows, and the same as a Spark DDL string.

    Columns: ``topic, partition, offset, timestamp_ms, key, headers`` and ``value`` (binary
    for ``bytes``, string for ``text`` and ``json``), or, for ``json`` with a schema, its
    fields in its order. A field named like a record column (``key``, say, in the rows an
    upstream stage wrote) replaces that column. With ``columns``, only those (in this
    order): what the pipeline reads of the rows (``runner``'s projection).
    """
    check_value_format(value_format, schema)
    fields = [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("headers", HEADERS),
    ]
    if value_format == "json" and schema:
        fields = [(name, kind) for name, kind in fields if name not in schema]
        fields += [(name, _FIELD_TYPES[kind]) for name, kind in schema.items()]
    else:
        fields.append(("value", pa.binary() if value_format == "bytes" else pa.string()))
    if columns is not None:
        fields = [(name, kind) for name, kind in fields if name in columns]
    arrow = pa.schema(fields)
    return arrow, ", ".join(f"`{f.name}` {_spark_type(f.type)}" for f in arrow)


def _spark_type(kind: pa.DataType) -> str:
    if kind == HEADERS:
        return "array<struct<key:string,value:binary>>"
    return {
        pa.string(): "string",
        pa.int32(): "int",
        pa.int64(): "bigint",
        pa.binary(): "binary",
        pa.float64(): "double",
        pa.bool_(): "boolean",
    }[kind]


@dataclass(frozen=True)
class KafkaSplitReader:
    """Reads splits of a barrier as record batches (a ``mapInArrow`` function).

    Its input batches hold split indexes into ``splits``; each split is read whole, in offset
    order, and yielded in batches of at most ``batch_rows`` records and ``batch_bytes`` of
    values (one record at least): few batches for small records, bounded memory for large
    ones.
    """

    bootstrap: str
    splits: tuple[Any, ...]
    value_format: str
    schema: dict[str, str] | None = None
    faults: Faults = field(default_factory=Faults)
    batch_rows: int = 65536
    batch_bytes: int = 8 * 1024 * 1024  # bounds a batch's memory: records can be large
    drop_markers: bool = False  # an internal topic's barrier markers are not rows
    timeout_s: float = 60.0  # a split that makes no progress this long fails (the source's)
    # only these columns (``kafka_schema``); every value is decoded and checked all the same
    columns: tuple[str, ...] | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with fewer_gc_passes():  # a message object per record (engine.gc_pause)
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from self.read(self.splits[index])

    def read(self, split: Any) -> Iterator[pa.RecordBatch]:
        from microcheckpoint.adapters.kafka_reader import read_split_batches

        arrow, _ = kafka_schema(self.value_format, self.schema, self.columns)
        records: list[Any] = []
        sizes: list[int] = []  # each pending record's value bytes (``len`` of a message)
        # The driver checked every split against its partition (``check_splits``).
        fetched = read_split_batches(self.bootstrap, split, check=False, timeout_s=self.timeout_s)
        for batch in self.faults.reading_batches(fetched):
            kept = self._without_markers(batch) if self.drop_markers else batch
            records += kept
            sizes += map(len, kept)
            while records and (len(records) >= self.batch_rows or sum(sizes) > self.batch_bytes):
                n = self._cut(sizes)
                yield self._batch(split, records[:n], arrow)
                del records[:n], sizes[:n]
        if records:
            yield self._batch(split, records, arrow)

    def _cut(self, sizes: list[int]) -> int:
        """How many of the pending records (their values' bytes ``sizes``, which fill a
        batch) the next batch takes: as many as keep it within ``batch_rows`` records and
        ``batch_bytes``, and one at least."""
        within = bisect.bisect_right(
            list(itertools.accumulate(sizes[: self.batch_rows])), self.batch_bytes
        )
        return max(within, 1)

    def _batch(self, split: Any, records: list[Any], arrow: pa.Schema) -> pa.RecordBatch:
        """Arrow columns straight from the reader's records of ``split``, one pass per
        column (the topic and partition are the split's)."""
        from microcheckpoint.adapters.kafka_reader import batch_columns

        # The record fields the columns need, and the value always: every record is decoded
        # (and refused if it does not decode) whether or not its fields are read.
        decoded_fields = self.schema if self.value_format == "json" and self.schema else {}
        fields = batch_columns(records, {*arrow.names} - set(decoded_fields) | {"value"})
        n = len(records)
        columns: dict[str, Any] = {
            "topic": lambda: pa.repeat(pa.scalar(split.tp.topic, pa.string()), n),
            "partition": lambda: pa.repeat(pa.scalar(split.tp.partition, pa.int32()), n),
            "offset": lambda: fields["offset"],
            "timestamp_ms": lambda: fields["timestamp_ms"],
            "key": lambda: fields["key"],
            "headers": lambda: _headers(fields["headers"]),
        }
        if self.value_format == "json" and self.schema:
            # In bulk when that equals value by value, else value by value (naming the record
            # that does not decode); a field named like a record column replaces it.
            bulk = decode_json_columns(fields["value"], self.schema)
            if bulk is not None:
                columns.update(bulk)
            else:
                decoded = [decode_record(r, "json", self.schema) for r in self._records(records)]
                for name in self.schema:
                    columns[name] = [d[name] if d else None for d in decoded]
        elif self.value_format == "bytes":
            columns["value"] = fields["value"]
        else:
            columns["value"] = self._text(records, fields["value"])

        def column(f: pa.Field) -> pa.Array:
            values = columns[f.name]
            values = values() if callable(values) else values
            return values if isinstance(values, pa.Array) else pa.array(values, type=f.type)

        return pa.RecordBatch.from_arrays([column(f) for f in arrow], schema=arrow)

    def _text(self, records: list[Any], raw: list[bytes | None]) -> pa.Array:
        """Values as strict UTF-8 (and, for ``json``, valid JSON), validated in bulk."""
        if self.value_format == "text":
            try:
                return pa.array(raw, pa.binary()).cast(pa.string())
            except pa.ArrowInvalid:
                pass  # find the record that is not UTF-8, and name it
        for record in self._records(records):
            decode_record(record, self.value_format)  # raises, naming the record
        # Valid: the column keeps the text as it is.
        return pa.array([None if v is None else bytes(v).decode() for v in raw], pa.string())

    @staticmethod
    def _without_markers(batch: list[Any]) -> list[Any]:
        from microcheckpoint.protocol.markers import is_marker

        return [r for r in batch if not is_marker(r.headers())]

    @staticmethod
    def _records(records: list[Any]) -> Iterator[Any]:
        from microcheckpoint.adapters.kafka_reader import to_record

        return (to_record(r) for r in records)


def _headers(headers: list[Any]) -> list[list[dict[str, Any]]]:
    """The ``headers`` column of records whose headers are ``headers``."""
    if not any(headers):
        return [[]] * len(headers)
    return [[{"key": k, "value": v} for k, v in h or ()] for h in headers]


@dataclass(frozen=True)
class FileReader:
    """Reads named files of a folder as record batches (a ``mapInArrow`` function), through
    the object-store port, so ``file://`` and ``s3://`` folders read the same way (pyspark
    has no S3 file system of its own). Rows get ``source_file`` (the file's key) and
    ``source_row`` (its index in the file): their source position, as Kafka rows have
    partition and offset."""

    url: str
    store_options: dict[str, Any]
    names: tuple[str, ...]
    format: str
    schema: pa.Schema
    faults: Faults = field(default_factory=Faults)
    batch_rows: int = 65536

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return self.faults.reading_batches(self._read(batches))

    def _read(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import io
        import json

        import pyarrow.parquet as pq

        from microcheckpoint.adapters.stores import open_store

        store = open_store(self.url, **self.store_options)
        with fewer_gc_passes():  # a dict per jsonl record (engine.gc_pause)
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    name = self.names[index]
                    obj = store.get(name)
                    if obj is None:
                        raise KafkaSourceError(
                            f"file {store.child_url(name)} of the barrier is gone"
                        )
                    if self.format == "parquet":
                        table = pq.read_table(io.BytesIO(obj.data)).select(self.schema.names)
                    else:
                        rows = [json.loads(line) for line in obj.data.splitlines() if line.strip()]
                        table = pa.Table.from_pylist(
                            [{f: r.get(f) for f in self.schema.names} for r in rows],
                            schema=self.schema,
                        )
                    table = table.cast(self.schema)
                    table = table.append_column(
                        "source_file", pa.repeat(pa.scalar(name, pa.string()), table.num_rows)
                    )
                    table = table.append_column(
                        "source_row", pa.array(np.arange(table.num_rows, dtype=np.int64))
                    )
                    yield from table.to_batches(max_chunksize=self.batch_rows)


def source_offsets(source: Any, kafka: Any, store_options: dict[str, Any] | None = None) -> Any:
    """The protocol's source port for ``source``: Kafka's offsets, a folder's, both, an
    internal topic's (cut at the upstream stage's markers), or several inputs'."""
    from microcheckpoint.adapters.file_offsets import FileOffsets, HybridOffsets
    from microcheckpoint.adapters.stage_offsets import StageOffsets
    from microcheckpoint.adapters.stores import open_store
    from microcheckpoint.adapters.union_offsets import UnionOffsets
    from microcheckpoint.engine.api import FileSource, HybridSource, StageSource, UnionSource

    def folder(files: FileSource) -> FileOffsets:
        store = open_store(files.url, **(store_options or {}))
        return FileOffsets(store, files.topics[0], files.max_files_per_epoch)

    if isinstance(source, FileSource):
        return folder(source)
    if isinstance(source, HybridSource):
        return HybridOffsets(folder(source.files), kafka)
    if isinstance(source, StageSource):
        return StageOffsets(kafka, source.upstream, source.upstream_uid)
    if isinstance(source, UnionSource):
        return UnionOffsets(
            {i.uid: (i.topics, source_offsets(i, kafka, store_options)) for i in source.inputs}
        )
    return kafka
