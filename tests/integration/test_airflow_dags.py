"""The pipeline, savepoint and restore DAGs run with ``dag.test()`` against Tansu and SeaweedFS.

Each scenario runs the project's own DAG files (``dags/``) in a separate process with
Airflow's SQLite database and storage on the S3 server, its epochs in each of the three
Spark modes (local Spark in the task, a Spark Connect client, spark-submit), then checks the
stored checkpoints, the keyed state and the committed group offsets exactly.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from examples import wordcount
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import S3Store
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.airflow_support import dag_test, migrate
from tests.stored import read_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory, kafka_bootstrap, s3_endpoint) -> Path:
    home = tmp_path_factory.mktemp("airflow-dagtest")
    migrate(home, kafka_bootstrap, s3_endpoint)
    return home


def _store(s3_client, bucket: str) -> S3Store:
    return S3Store(s3_client, bucket, "chk")


def _statuses(store, pipeline: str) -> dict[int, str]:
    rows = checkpoint_history(store, pipeline)["checkpoints"]
    return {r["id"]: r["status"] + (f":{r['reason']}" if r.get("reason") else "") for r in rows}


def _group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    with KafkaOffsets(bootstrap) as kafka:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        committed = kafka.committed_group_offsets(group, tps)
    return {tp.partition: off for tp, off in committed.items()}


def test_epochs_then_stop_with_savepoint_then_restore_with_rescale(
    airflow_home, kafka_bootstrap, s3_endpoint, s3_client, s3_bucket, spark_connect_url
):
    topic = f"lines-{uuid.uuid4().hex[:8]}"
    first = wordcount.lines_for(240, seed=11)  # 120 per partition
    wordcount.produce(kafka_bootstrap, topic, first)
    storage = f"s3://{s3_bucket}/chk"
    env = {
        "MICROCHECKPOINT_STORAGE": storage,
        "WORDCOUNT_TOPIC": topic,
        "WORDCOUNT_MAX_RECORDS": "70",
        "WORDCOUNT_RETAINED": "10",
    }
    store = _store(s3_client, s3_bucket)

    # Two epochs, a stop with savepoint, a run while stopped, a restore from outside the roots.
    runs = dag_test(
        airflow_home,
        kafka_bootstrap,
        s3_endpoint,
        "wordcount.py",
        [
            {"dag_id": "wordcount_pipeline"},
            {"dag_id": "wordcount_pipeline"},
            {"dag_id": "wordcount_savepoint", "conf": {"target": "", "stop": True}},
            {"dag_id": "wordcount_pipeline"},
            {"dag_id": "wordcount_restore", "conf": {"point": "s3://elsewhere/wordcount/x"}},
            {"dag_id": "wordcount_restore", "conf": {"point": "chk-9"}},
        ],
        env,
    )
    assert [r["state"] for r in runs] == [
        "success",
        "success",
        "failed",
        "success",
        "failed",
        "failed",
    ]
    assert runs[0]["xcom"]["process_epoch"]["offsets"] == {f"{topic}:0": 70, f"{topic}:1": 70}
    assert runs[1]["xcom"]["process_epoch"]["offsets"] == {
        f"{topic}:0": 120,
        f"{topic}:1": 120,
    }
    assert runs[0]["tasks"]["abort_on_failure"] == "skipped"
    # The savepoint is taken; only pausing the DAG failed (no API server under dag.test()).
    savepoint = runs[2]
    assert savepoint["tasks"] == {
        "validate_target": "success",
        "stop_triggering": "success",
        "await_in_flight": "success",
        "take_savepoint": "success",
        "pause_pipeline": "failed",
        "resume_on_failure": "skipped",  # the savepoint itself succeeded: it stays stopped
    }
    url = savepoint["xcom"]["take_savepoint"]
    assert url.startswith(f"{storage}/wordcount/savepoints/savepoint-0000000002-")
    # While stopped, a run triggers nothing.
    assert runs[3]["tasks"]["process_epoch"] == "skipped"
    # Refused restores change nothing.
    assert runs[4]["tasks"]["validate_point"] == "failed"
    assert runs[4]["tasks"]["restore"] == "upstream_failed"
    assert runs[5]["tasks"]["validate_point"] == "failed"
    assert _statuses(store, "wordcount") == {1: "COMPLETED", 2: "COMPLETED"}
    assert read_json(store, Layout("wordcount").restore) is None
    assert read_json(store, Layout("wordcount").stopped) is not None
    assert read_keyed_state(store, "wordcount", "word-counts") == dict(wordcount.expected(first))
    group = "microcheckpoint-wordcount"
    assert _group_offsets(kafka_bootstrap, group, topic) == {0: 120, 1: 120}

    # More input; restore from the savepoint with parallelism 3 and run two epochs, now as
    # clients of the warm Spark Connect server (connection spark_connect_default).
    second = wordcount.lines_for(100, seed=12)
    wordcount.produce(kafka_bootstrap, topic, second, create=False)
    runs = dag_test(
        airflow_home,
        kafka_bootstrap,
        s3_endpoint,
        "wordcount.py",
        [
            {
                "dag_id": "wordcount_restore",
                "conf": {
                    "point": url,
                    "claim_mode": "NO_CLAIM",
                    "allow_non_restored_state": False,
                    "parallelism": 3,
                    "resume": False,
                },
            },
            {"dag_id": "wordcount_pipeline"},
            {"dag_id": "wordcount_pipeline"},
        ],
        {**env, "MICROCHECKPOINT_SPARK_MODE": "connect"},
        spark_connect=spark_connect_url,
    )
    assert [r["state"] for r in runs] == ["success", "success", "success"]
    assert runs[1]["xcom"]["process_epoch"]["records"] == 100
    assert runs[0]["xcom"]["validate_point"]["checkpoint"] == 2
    assert runs[0]["xcom"]["validate_point"]["parallelism"] == 3
    assert runs[0]["tasks"]["resume_pipeline"] == "success"  # resume=False: nothing to call
    assert read_json(store, Layout("wordcount").stopped) is None
    history = checkpoint_history(store, "wordcount")
    rows = {r["id"]: r for r in history["checkpoints"]}
    assert history["restored_from"] == url
    assert rows[3]["ranges"] == {f"{topic}:0": [120, 170], f"{topic}:1": [120, 170]}
    assert rows[4]["ranges"] == {f"{topic}:0": [170, 170], f"{topic}:1": [170, 170]}
    pending = read_json(store, Layout("wordcount").pending(CheckpointId(3)))
    assert sorted(pending["expected"]) == [  # three subtasks after the rescale
        "lines-source#0",
        "word-counts#0",
        "word-counts#1",
        "word-counts#2",
    ]
    total = wordcount.expected(first + second)
    assert read_keyed_state(store, "wordcount", "word-counts") == dict(total)
    assert sum(total.values()) == sum(len(line.split()) for line in first + second)
    assert _group_offsets(kafka_bootstrap, group, topic) == {0: 170, 1: 170}
    assert rows[3]["labels"]["dag_id"] == "wordcount_pipeline"


def test_data_interval_epochs_and_replay_from_an_older_checkpoint(
    airflow_home, kafka_bootstrap, s3_endpoint, s3_client, s3_bucket, spark_connect_url
):
    """Each run reads exactly the records of its hour; restoring checkpoint 1 and re-running
    hour 1 gives the state of hours 0-1 once (backfill from a savepoint, in dag.test form).

    The first two epochs run in ``MICROCHECKPOINT_SPARK_MODE=submit``: the provider's
    SparkSubmitOperator runs spark_jobs/run_epoch.py against the master of connection
    spark_default (``local[2]`` here), and sensors await its acks. The rest run as clients of
    the Spark Connect server (a JVM start less per epoch)."""
    topic = f"hourly-{uuid.uuid4().hex[:8]}"
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    per_hour = [40, 30, 50]
    lines, stamps = wordcount.hourly_lines(t0, per_hour, seed=20)
    wordcount.produce(kafka_bootstrap, topic, lines, timestamps_ms=stamps)
    env = {
        "MICROCHECKPOINT_STORAGE": f"s3://{s3_bucket}/chk",
        "WORDCOUNT_HOURLY_TOPIC": topic,
        "WORDCOUNT_HOURLY_START": t0.isoformat(),
        "WORDCOUNT_HOURLY_RETAINED": "10",
        "MICROCHECKPOINT_SPARK_MODE": "submit",
    }
    logs: list[str] = []
    hour = lambda h: (t0 + timedelta(hours=h)).isoformat()  # noqa: E731
    # dag.test() gives a run at L the interval that ended at L: [L - 1h, L).
    submitted = dag_test(
        airflow_home,
        kafka_bootstrap,
        s3_endpoint,
        "wordcount_hourly.py",
        [
            {"dag_id": "wordcount_hourly_pipeline", "logical_date": hour(1)},
            {"dag_id": "wordcount_hourly_pipeline", "logical_date": hour(2)},
        ],
        env,
        output=logs,
    )
    assert [r["tasks"]["await_acks"] for r in submitted] == ["success"] * 2
    connected = dag_test(
        airflow_home,
        kafka_bootstrap,
        s3_endpoint,
        "wordcount_hourly.py",
        [
            {"dag_id": "wordcount_hourly_pipeline", "logical_date": hour(3)},
            {"dag_id": "wordcount_hourly_restore", "conf": {"point": "1", "resume": False}},
            {"dag_id": "wordcount_hourly_pipeline", "logical_date": hour(2)},
        ],
        {**env, "MICROCHECKPOINT_SPARK_MODE": "connect"},
        spark_connect=spark_connect_url,
    )
    runs = submitted + connected
    assert [r["state"] for r in runs] == ["success"] * 5
    store = _store(s3_client, s3_bucket)
    rows = {r["id"]: r for r in checkpoint_history(store, "wordcount_hourly")["checkpoints"]}
    assert sorted(rows) == [1, 2, 3, 4]
    # The intervals are the runs' own, and each checkpoint holds exactly that hour's records.
    assert [rows[i]["labels"]["data_interval"][0] for i in (1, 2, 3, 4)] == [
        hour(0),
        hour(1),
        hour(2),
        hour(1),
    ]
    assert [rows[i]["records"] for i in (1, 2, 3, 4)] == [40, 30, 50, 30]
    # The first two epochs went through spark-submit; run_epoch.py reports it, the hook logs it.
    for cid, records in ((1, 40), (2, 30)):
        line = f'{{"checkpoint": {cid}, "attempt": 2, "records": {records}, "master": "local[2]"}}'
        assert line in logs[0]
    assert [r["xcom"]["process_epoch"]["records"] for r in (connected[0], connected[2])] == [50, 30]
    # Checkpoint 4 continued from checkpoint 1's offsets: hour 1 once, not twice.
    assert rows[4]["ranges"] == rows[2]["ranges"]
    expected = Counter()
    for line in lines[: per_hour[0] + per_hour[1]]:
        expected.update(line.split())
    assert read_keyed_state(store, "wordcount_hourly", "word-counts") == dict(expected)
