"""An owner for test_service_reaping: start the harness's services, print their pids, wait.

``python reaping_owner.py LOG_DIR [--no-spark] [--airflow]`` starts, through the harness as the tests do,
the local stack (the S3 server and Tansu), a Spark Connect server, a Spark standalone master
and one worker (not with ``--no-spark``), PostgreSQL (or, with
``--airflow``, ``airflow standalone`` on its own PostgreSQL) and a service whose child
leaves the process group and daemonizes (as Spark's scripts and Airflow's children may).
It then prints one JSON line ``{"services": {name: pid}, "daemon": pid}`` and sleeps until
it is killed; it never stops what it started: that is the guards' job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import services
from harness.airflow_stack import start_airflow
from harness.postgres import start_postgres
from harness.spark_cluster import start_spark_cluster
from tests.daemon_tree import TREE


def main(log_dir: Path, spark: bool, airflow: bool) -> None:
    """Start everything, print the pids, sleep (the ``with`` never exits normally)."""
    with services.local_stack(log_dir) as stack:
        started = {service.name: service.pid for service in stack.started}
        if spark:
            connect = services.start_spark_connect(log_dir)
            started[connect.name] = connect.pid
            cluster = start_spark_cluster(log_dir / "cluster", workers=1, timeout=240)
            started |= {service.name: service.pid for service in cluster.services}
        if airflow:
            world = start_airflow(log_dir / "airflow", stack.kafka_bootstrap, stack.s3)
            started["airflow"] = world.service.pid
            started["postgres"] = world.postgres.service.pid  # type: ignore[union-attr]
        else:
            started["postgres"] = start_postgres(log_dir / "postgres").service.pid
        daemon_file = log_dir / "daemon.pid"
        tree = services._spawn(
            "tree", [sys.executable, "-c", TREE, str(daemon_file)], dict(os.environ), log_dir, "-"
        )
        started[tree.name] = tree.pid
        while not daemon_file.exists():
            time.sleep(0.05)
        line = {"services": started, "daemon": int(daemon_file.read_text())}
        print(json.dumps(line), flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--no-spark" not in sys.argv[2:], "--airflow" in sys.argv[2:])
