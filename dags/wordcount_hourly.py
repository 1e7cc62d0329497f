"""Word count over hourly data intervals: policy ``data_interval``.

Each run processes the records whose Kafka timestamps fall in its data interval, so
Airflow's backfill over past hours replays them deterministically (after a restore from
a savepoint: the "backfill from savepoint" flow). DAGs: ``wordcount_hourly_pipeline``,
``wordcount_hourly_savepoint``, ``wordcount_hourly_restore``.
"""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags, spark_mode

env = os.environ.get
topic = env("WORDCOUNT_HOURLY_TOPIC", "lines-hourly")

spec = PipelineSpec(
    name="wordcount_hourly",
    pipeline="examples.wordcount:build",
    pipeline_kwargs={"topic": topic, "name": "wordcount_hourly"},
    checkpointing={
        "storage": env("MICROCHECKPOINT_STORAGE", "s3://microcheckpoint-demo/checkpoints"),
        "topics": [topic],
        "interval": "1h",
        "barrier_policy": "data_interval",
        "timeout": env("WORDCOUNT_HOURLY_TIMEOUT", env("WORDCOUNT_TIMEOUT", "10min")),
        "tolerable_failures": 1,
        "retained": int(env("WORDCOUNT_HOURLY_RETAINED", "3")),
        "startup_mode": "earliest",
    },
    parallelism=2,
    savepoint_roots=tuple(r for r in env("MICROCHECKPOINT_SAVEPOINT_ROOTS", "").split(",") if r),
)

spark = spark_mode(env("MICROCHECKPOINT_SPARK_MODE", "local"), env("MICROCHECKPOINT_SPARK_CONN_ID"))

start = datetime.fromisoformat(env("WORDCOUNT_HOURLY_START", "2026-01-01T00:00:00+00:00"))
end = env("WORDCOUNT_HOURLY_END")  # set it to replay a fixed past range only
globals().update(
    pipeline_dags(
        spec,
        start_date=start,
        end_date=datetime.fromisoformat(end) if end else None,
        spark=spark,
    )
)
