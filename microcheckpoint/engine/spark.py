"""SparkSessions: in-process (``local[2]`` by default), or a client of a Spark Connect server."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

__all__ = [
    "EPOCH_SETTINGS",
    "arrow_schema",
    "connect_spark",
    "local_cores",
    "local_spark",
    "spark_schema",
]

# Settings for many short epochs, in-process and on the Connect server alike. Adaptive query
# execution re-plans at every shuffle, which costs more than it saves on epoch-sized data
# (a 1M-record keyed count: 1.54 s with it, 1.35 s without; Structured Streaming turns it
# off for its micro-batches too). PySpark's DataFrame debugging records the Python call site
# of every column function for error messages: in-process, five JVM calls each (the session,
# a setting, the origin set and cleared), about 45 ms of a 0.37 s epoch of the built-in
# count; the call sites would be the engine's own lines, which an epoch rebuilds every time.
EPOCH_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


def local_cores(master: str) -> int | None:
    """The cores of a ``local[N]`` or ``local[*]`` master (``local``: 1); None for others."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master.strip())
    if match is None:
        return None
    cores = match.group(1)
    return 1 if cores is None else (os.cpu_count() or 1) if cores == "*" else int(cores)


def local_spark(
    master: str | None = None, app: str = "microcheckpoint", shuffle_partitions: int | None = None
) -> Any:
    """Build (or get) a SparkSession whose executors run this virtual environment's Python.

    ``master`` defaults to ``MICROCHECKPOINT_SPARK_MASTER`` or ``local[2]``; under
    ``spark-submit`` (a Py4J gateway is handed over) the submitted ``--master`` is kept.
    ``shuffle_partitions`` defaults to a local master's cores (4 for another master): an
    epoch's shuffles are small, and each partition is a task, with a Python worker round trip
    in the keyed and sink stages (300-record epochs of the word count on ``local[2]``: 1.03 s
    of CPU each with 2 partitions, 1.41 s with 4). Task retries are the master's: none on
    ``local[N]``, ``spark.task.maxFailures`` (4 by default) on a cluster, where a task lost
    with its executor runs again in the same epoch (tests/integration/test_spark_cluster.py
    kills an executor under spark-submit and under Connect: the counts stay exact).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = master or os.environ.get("MICROCHECKPOINT_SPARK_MASTER", "local[2]")
        builder = builder.master(master)
    if shuffle_partitions is None:
        shuffle_partitions = (local_cores(master) if master else None) or 4
    builder = (
        builder.appName(app)
        .config(map=EPOCH_SETTINGS)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.driver.memory", "1g")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def connect_spark(url: str, shared: str | None = "microcheckpoint") -> Any:
    """A Spark Connect client session for ``url`` (``sc://host:port``): no JVM in this process.

    The server keeps its JVM and Python workers warm between epochs; its settings (shuffle
    partitions, memory) are the server's. With ``shared`` (the default), every client joins
    one server-side session named by it, and ``stop()`` closes only the client: a new session
    would start fresh Python workers for its first Arrow function (2-3 s per epoch task,
    measured), a shared one reuses them (0.3 s). None gives a session of its own, released on
    ``stop()``.
    """
    import uuid

    from pyspark.sql import SparkSession

    if shared is None:
        return SparkSession.builder.remote(url).getOrCreate()
    # Connect wants a version-4 UUID: the name's hash, with the version bits set.
    name = uuid.uuid5(uuid.NAMESPACE_URL, f"microcheckpoint:{shared}")
    session_id = uuid.UUID(bytes=name.bytes, version=4)
    base = url if ";" in url else url.rstrip("/") + "/"
    spark = SparkSession.builder.remote(f"{base};session_id={session_id}").getOrCreate()
    spark.release_session_on_close = False
    return spark


def one_row_per_partition(spark: Any, count: int) -> Any:
    """``count`` rows (``id`` 0 to ``count`` - 1), each in a partition of its own, whose
    schema the client knows: over Connect, an Arrow function over them (``mapInArrow`` asks
    for its input's columns) needs no analysis request to the server."""
    from pyspark.sql.types import LongType, StructField, StructType

    ids = StructType([StructField("id", LongType(), nullable=False)])
    return spark.range(0, count, 1, count).to(ids)


# Spark DDL -> Spark schema: the same in every session, so each is parsed once per process.
_SPARK_SCHEMAS: dict[str, Any] = {}


# A DDL string of named atomic columns (``word string, total long``), the form of the
# built-in aggregations' outputs, and the Spark type each of its type names parses to.
_SIMPLE_DDL = re.compile(
    r"\s*[A-Za-z_][A-Za-z0-9_]*\s+[A-Za-z]+\s*(,\s*[A-Za-z_][A-Za-z0-9_]*\s+[A-Za-z]+\s*)*"
)
_ATOMIC = {
    "string": "StringType",
    "bigint": "LongType",
    "long": "LongType",
    "int": "IntegerType",
    "integer": "IntegerType",
    "smallint": "ShortType",
    "short": "ShortType",
    "tinyint": "ByteType",
    "byte": "ByteType",
    "double": "DoubleType",
    "float": "FloatType",
    "real": "FloatType",
    "boolean": "BooleanType",
    "binary": "BinaryType",
    "date": "DateType",
}


def _simple_schema(ddl: str) -> Any | None:
    """``ddl`` parsed here when it names distinct columns of the types in ``_ATOMIC`` (as
    Spark parses it: every field nullable); None for anything else, which Spark parses."""
    from pyspark.sql import types

    if not _SIMPLE_DDL.fullmatch(ddl):
        return None
    pairs = [part.split() for part in ddl.split(",")]
    names = [name for name, _ in pairs]
    kinds = [_ATOMIC.get(kind.lower()) for _, kind in pairs]
    if None in kinds or len({n.lower() for n in names}) != len(names):
        return None
    fields = [types.StructField(n, getattr(types, k)()) for n, k in zip(names, kinds, strict=True)]
    return types.StructType(fields)


def spark_schema(spark: Any, ddl: str) -> Any:
    """The schema (``StructType``) of a Spark DDL string: parsed here when it is simple
    (``_simple_schema``), else by Spark the first time (in-process, or two requests to the
    Connect server), so that an Arrow function given the schema needs no parse of its own
    per epoch or, for the built-in aggregations' outputs, per process."""
    if ddl not in _SPARK_SCHEMAS:
        simple = _simple_schema(ddl)
        _SPARK_SCHEMAS[ddl] = simple or spark.createDataFrame([], ddl).schema
    return _SPARK_SCHEMAS[ddl]


def arrow_schema(spark: Any, ddl: str) -> Any:
    """The Arrow schema of a Spark DDL string (``spark_schema``'s)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(spark, ddl))
