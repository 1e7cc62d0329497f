"""A failed epoch's task error names the cause: ``checkpoint 1: ValueError: bad row 3``.

The pipeline of ``failing_pipeline.py`` raises ``ValueError("bad row 3")`` in its keyed
function, inside a Spark task. Spark hands the driver a ``PythonException`` whose ``repr``
is ``PythonException()``, with the worker's traceback in its text;
``microcheckpoint.engine.errors.failure_cause`` turns it into one line.

- Through Airflow: the pipeline's DAG (``failing_dag.py``) runs one epoch with
  ``dag.test()`` (Airflow's own task execution, against Tansu and SeaweedFS) as a client of the
  Spark Connect server, as ``make demo`` does. The epoch task fails with exactly
  ``checkpoint 1: ValueError: bad row 3``, and the checkpoint is aborted as DECLINED by
  the subtask that raised: ``task fails#1: ValueError: bad row 3``.
- In-process Spark (the other mode of the same operator): the engine's cycle on the
  session's local Spark raises a captured ``PythonException`` that names the same cause.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from examples import wordcount
from microcheckpoint.adapters.s3 import S3Store
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.errors import failure_cause
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.storage import FileStore
from tests.integration import failing_pipeline
from tests.integration.airflow_support import dag_test, migrate

pytestmark = pytest.mark.integration

DAG_FILE = Path(__file__).with_name("failing_dag.py")
# The line Airflow logs for the epoch task's failure (the last of its traceback).
TASK_FAILURE = re.compile(r"^airflow\.sdk\.exceptions\.AirflowFailException: (checkpoint .*)$")


def test_the_epoch_task_fails_naming_the_workers_exception(
    tmp_path, kafka_bootstrap, s3_endpoint, s3_client, s3_bucket, spark_connect_url
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    migrate(home, kafka_bootstrap, s3_endpoint)
    # dag.test() runs DAGs of the configured DAGs folder only: one holding just this file.
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_file = shutil.copy(DAG_FILE, dags)
    topic = f"failing-{uuid.uuid4().hex[:8]}"
    wordcount.produce(kafka_bootstrap, topic, wordcount.lines_for(20, seed=5))
    env = {
        "MICROCHECKPOINT_STORAGE": f"s3://{s3_bucket}/failing",
        "FAILING_TOPIC": topic,
        "MICROCHECKPOINT_SPARK_MODE": "connect",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
    }
    output: list[str] = []
    runs = dag_test(
        home,
        kafka_bootstrap,
        s3_endpoint,
        str(dag_file),
        [{"dag_id": "failing_pipeline"}],
        env,
        output=output,
        spark_connect=spark_connect_url,
    )
    assert runs[0]["state"] == "failed"
    assert runs[0]["tasks"]["process_epoch"] == "failed"
    assert runs[0]["tasks"]["abort_on_failure"] == "success"
    failures = [m[1] for m in map(TASK_FAILURE.match, output[0].splitlines()) if m]
    assert failures == ["checkpoint 1: ValueError: bad row 3"]
    history = checkpoint_history(S3Store(s3_client, s3_bucket, "failing"), "failing")
    assert [(r["id"], r["status"]) for r in history["checkpoints"]] == [(1, "ABORTED")]
    # The abort names the subtask that declined it and the worker's exception.
    row = history["checkpoints"][0]
    assert row["failed_task"] in {"fails#0", "fails#1"}
    assert {k: row[k] for k in ("reason", "detail", "cause")} == {
        "reason": "DECLINED",
        "detail": f"task {row['failed_task']}: ValueError: bad row 3",
        "cause": "ValueError: bad row 3",
    }
    assert history["latest"]["failed"]["failed_task"] == row["failed_task"]


def test_in_process_spark_failure_names_the_workers_exception(
    spark, kafka_bootstrap, tmp_path
) -> None:
    topic = f"failing-{uuid.uuid4().hex[:8]}"
    wordcount.produce(kafka_bootstrap, topic, wordcount.lines_for(20, seed=5))
    pipeline = failing_pipeline.build(topic)
    store = FileStore(f"file://{tmp_path}/store")
    config = CheckpointConfig.from_mapping({"pipeline": pipeline.name, "storage": store.url})
    with pytest.raises(Exception) as raised:
        run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2)
    assert type(raised.value).__name__ == "PythonException"
    assert repr(raised.value) == "PythonException()"  # what the task said before
    assert failure_cause(raised.value) == "ValueError: bad row 3"
