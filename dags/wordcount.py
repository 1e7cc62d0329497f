"""Word count (examples/wordcount.py) as checkpointed epochs: policy ``latest``.

DAGs: ``wordcount_pipeline`` (every WORDCOUNT_INTERVAL), ``wordcount_savepoint``,
``wordcount_restore``. Settings come from the environment so one file serves the demo,
the tests and docker/ (see the README's "Airflow" section).
"""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags, spark_mode

env = os.environ.get

spec = PipelineSpec(
    name="wordcount",
    pipeline="examples.wordcount:pipeline",
    checkpointing={
        "storage": env("MICROCHECKPOINT_STORAGE", "s3://microcheckpoint-demo/checkpoints"),
        "topics": [env("WORDCOUNT_TOPIC", "lines")],
        "interval": env("WORDCOUNT_INTERVAL", "60s"),
        "timeout": env("WORDCOUNT_TIMEOUT", "10min"),
        "min_pause": env("WORDCOUNT_MIN_PAUSE", "0s"),
        "max_concurrent": int(env("WORDCOUNT_MAX_CONCURRENT", "1")),
        "tolerable_failures": int(env("WORDCOUNT_TOLERABLE_FAILURES", "1")),
        "retained": int(env("WORDCOUNT_RETAINED", "2")),
        "max_records_per_epoch": int(env("WORDCOUNT_MAX_RECORDS", "5000")),
        "startup_mode": "earliest",
    },
    parallelism=int(env("WORDCOUNT_PARALLELISM", "2")),
    savepoint_roots=tuple(r for r in env("MICROCHECKPOINT_SAVEPOINT_ROOTS", "").split(",") if r),
)

spark = spark_mode(env("MICROCHECKPOINT_SPARK_MODE", "local"), env("MICROCHECKPOINT_SPARK_CONN_ID"))

globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1), spark=spark))
