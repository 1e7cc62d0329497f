"""spark-submit with two executor JVMs (local-cluster): the same exact result as local mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyspark

from examples.wordcount import build, expected, generate
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_on_local_cluster_counts_exactly(kafka_bootstrap, tmp_path):
    topic = f"submit-{uuid.uuid4().hex[:8]}"
    lines = generate(kafka_bootstrap, topic, 90, seed=11)
    module = tmp_path / "submit_pipeline.py"
    module.write_text(
        f"from examples.wordcount import build\npipeline = build({topic!r}, name='submitted')\n"
    )
    env = {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
    }
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    storage = f"file://{tmp_path}/store"
    # 90 lines over 2 partitions, 30 per partition per epoch: two cycles in one job.
    done = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local-cluster[2,1,1024]",
            str(ROOT / "spark_jobs" / "run_epoch.py"),
            "--pipeline",
            "submit_pipeline:pipeline",
            "--storage",
            storage,
            "--bootstrap",
            kafka_bootstrap,
            "--parallelism",
            "3",
            "--config",
            json.dumps({"max_records_per_epoch": 30}),
            "--cycles",
            "2",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(o["checkpoint"], o["records"]) for o in outputs] == [(1, 60), (2, 30)]
    assert {o["master"] for o in outputs} == {"local-cluster[2,1,1024]"}
    state = read_keyed_state(FileStore(storage), "submitted", "word-counts")
    assert state == dict(expected(lines))
    assert build(topic).name == "wordcount"  # the module-level default is untouched
