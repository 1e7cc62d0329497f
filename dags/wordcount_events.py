"""Word count (examples/wordcount.py) as event-driven epochs: a run when records arrive.

DAGs: ``wordcount_events_pipeline`` (no schedule tick: its Kafka AssetWatcher on
WORDCOUNT_EVENTS_TOPIC queues a run when a record arrives that no completed checkpoint
holds; docs/airflow.md, "Event-driven epochs"), ``wordcount_events_savepoint``,
``wordcount_events_restore`` and ``wordcount_events_cancel``. The watcher's consumer group
is connection ``wordcount_events_watch`` (type ``kafka``: ``bootstrap.servers``,
``group.id``). Settings come from the environment, as in dags/wordcount.py.
"""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags, spark_mode

env = os.environ.get
topic = env("WORDCOUNT_EVENTS_TOPIC", "lines-events")

spec = PipelineSpec(
    name="wordcount_events",
    pipeline="examples.wordcount:build",
    pipeline_kwargs={"topic": topic, "name": "wordcount_events"},
    checkpointing={
        "storage": env("MICROCHECKPOINT_STORAGE", "s3://microcheckpoint-demo/checkpoints"),
        "topics": [topic],
        "timeout": env("WORDCOUNT_EVENTS_TIMEOUT", "10min"),
        "min_pause": env("WORDCOUNT_EVENTS_MIN_PAUSE", "0s"),
        "retained": int(env("WORDCOUNT_EVENTS_RETAINED", "2")),
        "startup_mode": "earliest",
    },
    parallelism=int(env("WORDCOUNT_PARALLELISM", "2")),
    watch_conn_id="wordcount_events_watch",
)

spark = spark_mode(env("MICROCHECKPOINT_SPARK_MODE", "local"), env("MICROCHECKPOINT_SPARK_CONN_ID"))

globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1), spark=spark))
