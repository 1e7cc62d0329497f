"""A file source's frame: the barrier's files as rows with ``source_file`` and ``source_row``.

Two readers give the same rows:

- **Spark's own Parquet reader** for Parquet files in a local folder (``file://``): the
  JVM reads the columns, vectorized, and ``source_row`` is the row's index in its file
  (Spark's ``_metadata.row_index``). No Python worker touches the records on the way in.
- **The object-store reader** (``sources.FileReader``, a ``mapInArrow`` function) for
  ``s3://`` folders (the pyspark wheel has no S3 file system) and JSON lines.

``source_file`` is the file's name in the folder (its key, as the barrier names it). Spark
reports a file as a URI (``_metadata.file_path``, percent-encoded); it is decoded and
looked up among the barrier's names, and a row from a file outside them fails the job,
naming the file, rather than getting a wrong position.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pyarrow as pa

from microcheckpoint.adapters.decoding import check_value_format
from microcheckpoint.engine.api import FileSource
from microcheckpoint.engine.sources import FileReader, fields_schema
from microcheckpoint.engine.spark import one_row_per_partition
from microcheckpoint.errors import ConfigError, KafkaSourceError
from microcheckpoint.faults import Faults
from microcheckpoint.storage.port import ObjectStore

__all__ = ["file_frame"]

# Characters Spark's path globbing or Hadoop's Path would read as syntax, not as a name.
_NOT_LITERAL = set("*?[]{}\\:")
# A path Spark reports as ``file:<path>`` unchanged: URI-unreserved characters and slashes.
_URI_AS_IS = re.compile(r"/[A-Za-z0-9._~/-]*")


def file_frame(
    spark: Any, source: FileSource, names: list[str], options: dict[str, Any], faults: Faults
) -> Any:
    """The files ``names`` of ``source`` (the barrier's, in order), one row per record."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from microcheckpoint.adapters.file_offsets import data_files
    from microcheckpoint.adapters.stores import open_store
    from microcheckpoint.storage import FileStore

    store = open_store(source.url, **options)
    arrow = _file_schema(store, source, names or data_files(store)[:1])
    positions = [("source_file", pa.string()), ("source_row", pa.int64())]
    # made here: a DDL string would be parsed by Spark (over Connect, a request) every epoch
    with_position = _nullable(from_arrow_schema(pa.schema([*arrow, *positions])))
    if not names:
        return spark.createDataFrame([], with_position)
    if (
        source.format == "parquet"
        and isinstance(store, FileStore)
        and not any(_NOT_LITERAL & set(n) for n in names)
    ):
        frame = _spark_parquet(spark, store, names, arrow)
        if faults.crash_at == "reading":  # the crash point, in the executor that reads
            frame = frame.mapInArrow(faults.reading_batches, frame.schema)
        return frame
    reader = FileReader(source.url, options, tuple(names), source.format, arrow, faults)
    return one_row_per_partition(spark, len(names)).mapInArrow(reader, with_position)


def _nullable(schema: Any) -> Any:
    """``schema`` with every field, element and map value nullable, as Spark parses a DDL
    string (a Parquet file's required columns would otherwise stay required)."""
    from pyspark.sql.types import StructType

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            flags = ("nullable", "containsNull", "valueContainsNull")
            return {k: True if k in flags else walk(v) for k, v in node.items()}
        return [walk(v) for v in node] if isinstance(node, list) else node

    return StructType.fromJson(walk(schema.jsonValue()))


def _spark_parquet(spark: Any, store: Any, names: list[str], arrow: Any) -> Any:
    """``names`` of the local folder ``store`` read by Spark's Parquet reader."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    paths = [store.root / name for name in names]
    for name, path in zip(names, paths, strict=True):
        if not path.is_file():
            raise _gone(store, name)
    frame = spark.read.schema(from_arrow_schema(arrow)).parquet(*map(str, paths))
    uri = F.col("_metadata.file_path")
    if not all(_URI_AS_IS.fullmatch(str(p)) for p in paths):
        # Spark's URI of the file, decoded ('+' is literal in a URI path, not a space); a
        # path of unreserved characters only is its URI as it is, with no decoding per row.
        uri = F.url_decode(F.replace(uri, F.lit("+"), F.lit("%2B")))
    pairs = zip([f"file:{p}" for p in paths], names, strict=True)
    lookup = F.create_map(*[F.lit(x) for pair in pairs for x in pair])
    name = F.element_at(lookup, uri)
    outside = F.concat(F.lit("a row of a file outside the barrier: "), uri)
    return frame.select(
        *[F.col(f"`{c}`") for c in arrow.names],
        F.when(name.isNull(), F.raise_error(outside)).otherwise(name).alias("source_file"),
        F.col("_metadata.row_index").alias("source_row"),
    )


def _file_schema(store: ObjectStore, source: FileSource, sample: list[str]) -> Any:
    import pyarrow.parquet as pq

    if source.schema:
        check_value_format("json", source.schema)
        return fields_schema(source.schema)
    if not sample:
        raise ConfigError(
            "schema", None, f"a schema for file source {source.uid!r}: its folder holds no file yet"
        )
    from microcheckpoint.storage import FileStore

    if isinstance(store, FileStore) and (store.root / sample[0]).is_file():
        return pq.read_schema(store.root / sample[0])  # the footer only
    obj = store.get(sample[0])
    if obj is None:
        raise _gone(store, sample[0])
    return pq.read_schema(io.BytesIO(obj.data))


def _gone(store: ObjectStore, name: str) -> KafkaSourceError:
    return KafkaSourceError(f"file {store.child_url(name)} of the barrier is gone")
