"""A SparkSession for local runs and tests (``local[*]`` by default)."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_spark"]


def local_spark(
    master: str | None = None, app: str = "microcheckpoint", shuffle_partitions: int = 4
) -> Any:
    """Build (or get) a SparkSession whose executors run this virtual environment's Python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(
            master or os.environ.get("MICROCHECKPOINT_SPARK_MASTER", "local[2]")
        )
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.driver.memory", "1g")
        .config("spark.task.maxFailures", "1")
        .config("spark.python.worker.reuse", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
