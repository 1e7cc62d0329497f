"""One input, three ways to run Spark: in-process, spark-submit and a Spark Connect client.

Each mode runs the same word count (with its file sink) over the same topic, two epochs, in
its own storage: the keyed state, the checkpoints' offsets and the published output are
identical across the three, and equal to a count in plain Python.

- in-process: ``run_cycle`` on the session's local Spark, in this process;
- spark-submit: ``spark_jobs/run_epoch.py --cycles 2`` with two executor JVMs
  (``local-cluster[2,1,1024]``) and parallelism 3, so records and state cross JVMs;
- Connect: ``spark_jobs/run_epoch.py --cycles 2 --remote`` against the session's server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyspark
import pytest

from examples.wordcount import build, expected, generate
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
CLUSTER = "local-cluster[2,1,1024]"
PARALLELISM = 3


def _settings(mode: str, topic: str) -> dict:
    # Each mode its own consumer group: the group offsets live in Kafka, not in the store.
    return {"max_records_per_epoch": 40, "group_id": f"modes-{mode}-{topic}"}


def _in_process(spark, topic: str, bootstrap: str, tmp: Path) -> list[dict]:
    pipeline = build(topic, sink_target=f"file://{tmp}/local-out")
    store = FileStore(f"file://{tmp}/local-store")
    config = CheckpointConfig.from_mapping(
        {"pipeline": pipeline.name, "storage": store.url, **_settings("local", topic)}
    )
    reports = []
    for _ in range(2):
        result = run_cycle(
            spark, pipeline, config, store, bootstrap=bootstrap, parallelism=PARALLELISM
        )
        reports.append(
            {
                "checkpoint": result.checkpoint_id.value,
                "records": result.records,
                "master": spark.sparkContext.master,
            }
        )
    return reports


def _job(mode: str, topic: str, bootstrap: str, connect: str, tmp: Path) -> list[dict]:
    """Two cycles of ``mode`` in one job; the report of each."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "WORDCOUNT_TOPIC": topic,
        "WORDCOUNT_SINK": f"file://{tmp}/{mode}-out",
    }
    job = [
        str(ROOT / "spark_jobs" / "run_epoch.py"),
        "--pipeline",
        "examples.wordcount:pipeline",
        "--storage",
        f"file://{tmp}/{mode}-store",
        "--bootstrap",
        bootstrap,
        "--parallelism",
        str(PARALLELISM),
        "--config",
        json.dumps(_settings(mode, topic)),
        "--cycles",
        "2",
    ]
    if mode == "submit":
        argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", CLUSTER, *job]
    else:
        argv = [sys.executable, *job, "--remote", connect]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_in_process_spark_submit_and_connect_give_identical_state_and_output(
    spark, kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    topic = f"modes-{uuid.uuid4().hex[:8]}"
    lines = generate(kafka_bootstrap, topic, 160, seed=23)  # 80 per partition
    results, masters = {}, {}
    for mode in ("local", "submit", "connect"):
        if mode == "local":
            reports = _in_process(spark, topic, kafka_bootstrap, tmp_path)
        else:
            reports = _job(mode, topic, kafka_bootstrap, spark_connect_url, tmp_path)
        store = FileStore(f"file://{tmp_path}/{mode}-store")
        results[mode] = {
            "epochs": [(r["checkpoint"], r["records"]) for r in reports],
            "state": read_keyed_state(store, "wordcount", "word-counts"),
            "output": read_committed(f"file://{tmp_path}/{mode}-out", "wordcount", "word-totals"),
        }
        masters[mode] = {r["master"] for r in reports}
    assert masters == {
        "local": {"local[2]"},
        "submit": {CLUSTER},
        "connect": {f"connect {spark_connect_url}"},
    }
    assert results["local"]["epochs"] == [(1, 80), (2, 80)]
    assert results["local"]["state"] == dict(expected(lines))
    assert sum(results["local"]["state"].values()) == sum(len(x.split()) for x in lines)
    assert results["local"]["output"]
    assert results["submit"] == results["local"]
    assert results["connect"] == results["local"]


def test_the_engines_session_records_no_python_call_site_per_column_function(spark) -> None:
    # PySpark's DataFrame debugging would make every column function of an epoch's plan
    # five JVM calls in-process (engine.spark.EPOCH_SETTINGS says what it cost).
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False


SIMPLE_DDL = [
    "key string, total long",
    "word STRING,count BIGINT",
    "  a int , b integer, c smallint, d short, e tinyint, f byte  ",
    "x double, y float, z real, flag boolean, raw binary, day date",
    "Key_1 string",
]
OTHER_DDL = [
    "a decimal(10, 2)",  # parameters
    "a array<int>, b map<string, long>",  # nested
    "a: int",  # Spark's other separator
    "`a b` string",  # a quoted name
    "a string not null",  # a constraint
    "a timestamp",  # its type depends on spark.sql.timestampType
    "a string, A long",  # names Spark compares without case
    "a varchar(5)",
]


def test_simple_schemas_are_parsed_here_as_spark_parses_them(spark) -> None:
    # The built-in aggregations' output schemas are parsed without a request to a Connect
    # server (two requests each, once per process: every Airflow task's epoch paid them).
    from microcheckpoint.engine.spark import _simple_schema

    for ddl in SIMPLE_DDL:
        assert _simple_schema(ddl) == spark.createDataFrame([], ddl).schema, ddl
    for ddl in OTHER_DDL:
        assert _simple_schema(ddl) is None, ddl
