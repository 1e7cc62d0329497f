"""DAG file of ``failing_pipeline``: ``failing_pipeline`` etc., epochs in the Spark mode of
``MICROCHECKPOINT_SPARK_MODE``, storage ``MICROCHECKPOINT_STORAGE``, topic ``FAILING_TOPIC``."""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags, spark_mode

env = os.environ.get

spec = PipelineSpec(
    name="failing",
    pipeline="tests.integration.failing_pipeline:pipeline",
    checkpointing={
        "storage": env("MICROCHECKPOINT_STORAGE", "s3://nowhere/checkpoints"),
        "topics": [env("FAILING_TOPIC", "lines")],
        "interval": "60s",
        "startup_mode": "earliest",
        "tolerable_failures": 1,  # one failed epoch aborts its checkpoint, no more
    },
)

spark = spark_mode(env("MICROCHECKPOINT_SPARK_MODE", "local"), env("MICROCHECKPOINT_SPARK_CONN_ID"))

globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1), spark=spark))
