"""One input, three ways to run Spark: in-process, spark-submit and a Spark Connect client.

Each mode runs the same word count (with its file sink) over the same topic, epoch by epoch,
in its own storage: the keyed state, the checkpoints' offsets and the published output are
identical across the three, and equal to a count in plain Python.
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

from examples.wordcount import expected, generate
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent


def _cycles(mode: str, topic: str, bootstrap: str, connect: str, tmp: Path) -> list[dict]:
    """Two cycles of ``mode`` in one job; the report of each."""
    sink = f"file://{tmp}/{mode}-out"
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "WORDCOUNT_TOPIC": topic,
        "WORDCOUNT_SINK": sink,
    }
    job = [
        str(ROOT / "spark_jobs" / "run_epoch.py"),
        "--pipeline",
        "examples.wordcount:pipeline",
        "--storage",
        f"file://{tmp}/{mode}-store",
        "--bootstrap",
        bootstrap,
        "--config",
        # Each mode its own consumer group: the group offsets live in Kafka, not in the store.
        json.dumps({"max_records_per_epoch": 40, "group_id": f"modes-{mode}-{topic}"}),
    ]
    if mode == "local":
        argv = [sys.executable, *job]
    elif mode == "submit":
        argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]", *job]
    else:
        argv = [sys.executable, *job, "--remote", connect]
    # Both cycles in one job (one JVM per mode): one JSON report per epoch.
    done = subprocess.run(
        [*argv, "--cycles", "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_in_process_spark_submit_and_connect_give_identical_state_and_output(
    kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    topic = f"modes-{uuid.uuid4().hex[:8]}"
    lines = generate(kafka_bootstrap, topic, 160, seed=23)  # 80 per partition
    results = {}
    for mode in ("local", "submit", "connect"):
        reports = _cycles(mode, topic, kafka_bootstrap, spark_connect_url, tmp_path)
        store = FileStore(f"file://{tmp_path}/{mode}-store")
        results[mode] = {
            "epochs": [(r["checkpoint"], r["records"]) for r in reports],
            "state": read_keyed_state(store, "wordcount", "word-counts"),
            "output": read_committed(f"file://{tmp_path}/{mode}-out", "wordcount", "word-totals"),
        }
        assert (
            reports[-1]["master"]
            == {
                "local": "local[2]",
                "submit": "local[2]",
                "connect": f"connect {spark_connect_url}",
            }[mode]
        )
    assert results["local"]["epochs"] == [(1, 80), (2, 80)]
    assert results["local"]["state"] == dict(expected(lines))
    assert results["submit"] == results["local"]
    assert results["connect"] == results["local"]
