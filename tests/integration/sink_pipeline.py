"""A word count whose running totals go to a FileSink; configured by environment variables
so a spark_jobs/run_epoch.py process and the test build the same pipeline."""

from __future__ import annotations

import os

from pyspark.sql import functions as F

from microcheckpoint.engine import KafkaSource, Pipeline, running_sum
from microcheckpoint.sinks.files import FileSink

pipeline = (
    Pipeline(
        os.environ.get("SINK_NAME", "sinky"),
        KafkaSource("lines", [os.environ.get("SINK_TOPIC", "sink-lines")], value_format="text"),
    )
    .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
    .then(lambda df: df.where("word != ''"))
    .then(running_sum("counts", key="word"))
    .then(FileSink("totals", os.environ.get("SINK_TARGET", "file:///tmp/sink-target")))
)
