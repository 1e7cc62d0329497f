"""The pipeline the file-source crash tests run in ``spark_jobs/run_epoch.py`` subprocesses:
Flink's sequence checker over Parquet files of ``{"k", "seq"}`` rows in ``FILE_SOURCE_URL``."""

from __future__ import annotations

import os

from microcheckpoint.engine.api import FileSource, KeyedOperator, Pipeline
from tests.integration.crash_pipeline import OPERATOR, check_sequence

__all__ = ["NAME", "pipeline"]

NAME = "filecrash"

pipeline = Pipeline(
    NAME,
    FileSource(
        "files", os.environ.get("FILE_SOURCE_URL", "file:///nowhere"), max_files_per_epoch=2
    ),
).then(KeyedOperator(OPERATOR, key="k", fn=check_sequence, output_schema="k string, last long"))
