"""Airflow pieces of microcheckpoint: hooks, checks, deferrable triggers, sensors, operators
and the DAG factory. Thin by design: every decision is the core coordinator's.

DAG files use ``pipeline_dags`` (see ``factory``); nothing here contacts Kafka, S3 or
Spark at import time.

The names below are loaded on first use (PEP 562), not when the package is imported:
Airflow imports ``microcheckpoint_airflow.provider`` while it is still reading its own
configuration (provider discovery), and importing the factory (``airflow.sdk``) at that
moment is a circular import.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "LocalSpark",
    "PipelineSpec",
    "SparkConnect",
    "SparkSubmit",
    "global_dags",
    "pipeline_dags",
    "spark_mode",
]


def __getattr__(name: str) -> Any:
    """``from microcheckpoint_airflow import pipeline_dags``: the factory's names, on demand.

    Raises:
        AttributeError: a name that is not in ``__all__``.
    """
    if name in __all__:
        return getattr(importlib.import_module("microcheckpoint_airflow.factory"), name)
    raise AttributeError(f"module 'microcheckpoint_airflow' has no attribute {name!r}")
