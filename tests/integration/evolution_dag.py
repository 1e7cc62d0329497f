"""DAG file of pipeline ``evolving`` (tests/integration/evolution_pipeline.py): its
pipeline, savepoint, restore and cancel DAGs, storage ``MICROCHECKPOINT_STORAGE``, input
folder ``EVOLUTION_INPUT``; the function's version is the one ``EVOLUTION_DEPLOYED`` names
(``evolution_deployed``), read each time a task loads the pipeline."""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags

spec = PipelineSpec(
    name="evolving",
    pipeline="tests.integration.evolution_deployed:deployed",
    checkpointing={
        "storage": os.environ.get("MICROCHECKPOINT_STORAGE", "s3://nowhere/checkpoints"),
        "interval": "60s",
    },
)

globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1)))
