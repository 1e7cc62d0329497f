"""Load the epoch task's modules once, in Airflow's long-lived processes.

A LocalExecutor (or Celery) worker forks a process per task. Each epoch task imports the
Spark Connect client, boto3, kafka-python, pyarrow and the engine: about 1.5 s on a 2-core
machine, paid again by every task. Imported in the process the tasks are forked from, they
are loaded once and shared. Call ``preload()`` from ``airflow_local_settings.py`` (in
``$AIRFLOW_HOME/config/``), which Airflow imports in every component at start:

    from microcheckpoint_airflow.preload import preload
    preload()

botocore's S3 model and endpoint rules are parsed here too (``adapters.s3.load_models``:
about 80 ms of a task's first S3 client). Nothing here connects or starts a Python thread.
Importing pyarrow (the Connect client needs it) starts jemalloc's background thread, a
native one; jemalloc's fork handlers make a fork after it safe, as for any
``multiprocessing`` pool forked after ``import pyarrow``. It is the
same idea as Airflow's own ``[dag_processor] parsing_pre_import_modules``, for tasks.
"""

from __future__ import annotations

import importlib
import logging

__all__ = ["MODULES", "preload"]

log = logging.getLogger(__name__)

MODULES = (
    "pyarrow",
    "boto3",
    "kafka",
    "pyspark.sql.functions",
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.dataframe",
    "microcheckpoint.adapters.s3",
    "microcheckpoint.adapters.kafka_offsets",
    "microcheckpoint.adapters.kafka_reader",
    "microcheckpoint.engine.runner",
    "microcheckpoint.engine.sinkstage",
    "microcheckpoint_airflow.operators",
)


def preload(modules: tuple[str, ...] = MODULES) -> list[str]:
    """Import ``modules``, then load botocore's S3 model (``adapters.s3.load_models``);
    returns the modules that could not be imported (logged, not raised: a missing optional
    package must not stop Airflow from starting)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional edge package may be absent
            log.warning("microcheckpoint preload: cannot import %s: %s", name, exc)
            missing.append(name)
    if "microcheckpoint.adapters.s3" in modules and "microcheckpoint.adapters.s3" not in missing:
        from microcheckpoint.adapters.s3 import load_models

        try:
            load_models()
        except Exception as exc:  # a task then parses the model itself
            log.warning("microcheckpoint preload: cannot load the S3 model: %s", exc)
    return missing
