"""The two-stage Nexmark pipeline (examples/nexmark_stages.py) as Airflow DAGs.

- ``nexmark-join_pipeline`` (every NEXMARK_INTERVAL): bids joined with auctions, written
  to an internal topic with barrier markers; each completed checkpoint updates the Asset
  ``microcheckpoint://nexmark-join``;
- ``nexmark-hot-items_pipeline``: scheduled on that Asset (data-aware scheduling); its
  ``wait_aligned`` sensor waits, deferred, for the join's markers, then it counts bids per
  item and window;
- each stage's savepoint and restore DAGs, and ``nexmark_global_savepoint`` /
  ``nexmark_global_restore`` for both stages at one cut (docs/stages.md).

Settings come from the environment; the Kafka bootstrap is needed at parse time for the
stage sink's topic (MICROCHECKPOINT_KAFKA_BOOTSTRAP, the Kafka connection's fallback too).
"""

import os
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, global_dags, pipeline_dags, spark_mode

env = os.environ.get

STAGES = {
    "bootstrap": env("MICROCHECKPOINT_KAFKA_BOOTSTRAP", "localhost:9092"),
    "auctions_topic": env("NEXMARK_AUCTIONS_TOPIC", "nexmark-auctions"),
    "bids_topic": env("NEXMARK_BIDS_TOPIC", "nexmark-bids"),
    "internal_topic": env("NEXMARK_INTERNAL_TOPIC", "nexmark-joined"),
}
storage = env("MICROCHECKPOINT_STORAGE", "s3://microcheckpoint-demo/checkpoints")
common = {
    "storage": storage,
    "timeout": env("NEXMARK_TIMEOUT", "2min"),
    "retained": int(env("NEXMARK_RETAINED", "5")),
    "startup_mode": "earliest",
}

join = PipelineSpec(
    name="nexmark-join",
    pipeline="examples.nexmark_stages:join_stage",
    pipeline_kwargs=STAGES,
    checkpointing={
        **common,
        "interval": env("NEXMARK_INTERVAL", "30s"),
        "max_records_per_epoch": int(env("NEXMARK_MAX_RECORDS", "200")),
    },
    parallelism=int(env("NEXMARK_JOIN_PARALLELISM", "2")),
)
hot_items = PipelineSpec(
    name="nexmark-hot-items",
    pipeline="examples.nexmark_stages:hot_items_stage",
    pipeline_kwargs=STAGES,
    checkpointing={**common, "aligned_timeout": env("NEXMARK_ALIGNED_TIMEOUT", "0s")},
    parallelism=int(env("NEXMARK_HOT_PARALLELISM", "2")),
    after="nexmark-join",
)

spark = spark_mode(env("MICROCHECKPOINT_SPARK_MODE", "local"), env("MICROCHECKPOINT_SPARK_CONN_ID"))
start = datetime(2026, 1, 1)
for stage in (join, hot_items):
    globals().update(pipeline_dags(stage, start_date=start, spark=spark, tags=("nexmark",)))
globals().update(global_dags("nexmark", [join, hot_items], start_date=start, tags=("nexmark",)))
