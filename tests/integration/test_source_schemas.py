"""The sources' row schemas are made in Python (no DDL string for Spark to parse, which over
Connect is a request to the server every epoch); each equals what Spark parses from the DDL
the engine used to hand it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from microcheckpoint.engine import FileSource
from microcheckpoint.engine.filescan import file_frame
from microcheckpoint.engine.sources import kafka_schema
from microcheckpoint.faults import Faults

pytestmark = pytest.mark.integration

JSON = {"key": "string", "seq": "long", "price": "double", "ok": "boolean"}


@pytest.mark.parametrize(
    ("value_format", "schema", "columns"),
    [
        ("bytes", None, None),
        ("text", None, None),
        ("json", None, None),
        ("json", JSON, None),
        ("json", JSON, ("key", "seq")),
        ("json", {"key": "string", "offset": "long"}, None),  # a field named like a column
    ],
)
def test_a_kafka_source_s_schema_is_the_one_spark_parses_from_its_ddl(
    spark, value_format, schema, columns
) -> None:
    arrow, ddl = kafka_schema(value_format, schema, columns)

    assert from_arrow_schema(arrow) == spark.createDataFrame([], ddl).schema


def test_a_file_source_s_schema_is_the_one_spark_parses_from_its_ddl(spark, tmp_path) -> None:
    # Required columns, a list and a map: a DDL string makes all of them nullable.
    fields = [
        pa.field("word", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False))),
        pa.field("attrs", pa.map_(pa.string(), pa.field("value", pa.int32(), nullable=False))),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("price", pa.decimal128(10, 2)),
    ]
    table = pa.table(
        {
            "word": ["a"],
            "n": [1],
            "tags": [["x"]],
            "attrs": [[("k", 1)]],
            "at": pa.array([0], pa.timestamp("us", tz="UTC")),
            "price": pa.array([1], pa.decimal128(10, 2)),
        },
        schema=pa.schema(fields),
    )
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "part-0.parquet")
    source = FileSource("files", (tmp_path / "in").as_uri())
    ddl = from_arrow_schema(table.schema).simpleString()[len("struct<") : -1]
    parsed = spark.createDataFrame([], f"{ddl}, source_file string, source_row bigint").schema

    assert file_frame(spark, source, [], {}, Faults()).schema == parsed
    frame = file_frame(spark, source, ["part-0.parquet"], {}, Faults())
    assert frame.collect()[0].asDict()["word"] == "a"
