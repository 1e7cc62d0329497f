"""Airflow pieces of microcheckpoint: hooks, checks, deferrable triggers, sensors, operators
and the DAG factory. Thin by design: every decision is the core coordinator's.

DAG files use ``pipeline_dags`` (see ``factory``); nothing here contacts Kafka, S3 or
Spark at import time.
"""

from microcheckpoint_airflow.factory import (
    LocalSpark,
    PipelineSpec,
    SparkConnect,
    SparkSubmit,
    global_dags,
    pipeline_dags,
    spark_mode,
)

__all__ = [
    "LocalSpark",
    "PipelineSpec",
    "SparkConnect",
    "SparkSubmit",
    "global_dags",
    "pipeline_dags",
    "spark_mode",
]
