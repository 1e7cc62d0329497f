"""Epoch times on a Spark standalone cluster beside ``local[2]``, on the same records.

Three ways to run ``spark_jobs/run_epoch.py --cycles E`` of the word count
(``examples.wordcount``, no sink) over one 2-partition topic, each with its own storage and
consumer group, so every mode reads exactly the same ranges:

- ``local[2]``: ``spark-submit --master local[2]`` (one JVM, the driver runs the tasks);
- ``cluster submit``: ``spark-submit --master spark://…`` (a driver JVM, and one executor
  JVM on each of two workers, started for the job);
- ``cluster connect``: a client of a Spark Connect server whose master is the cluster (its
  executors stay up between jobs).

The cluster (``harness.spark_cluster``) has two workers of 2 cores and 1g each, and every
application asks for 2 executors of 1 core and 512m (``spark.cores.max``), so the
Connect server and a submitted job share it. Each round runs every mode once (E epochs),
rotating the order. An epoch's time is its checkpoint's duration (trigger to
``_metadata``, from the checkpoint history); the first epoch of a job is reported apart
(a new session: Python workers, a new JVM for spark-submit). Medians over the rounds,
ratios against ``local[2]``, the job's wall time, and the machine's load average.

Run: ``.venv/bin/python -m bench.cluster_epochs [--rounds 3 --epochs 4 --lines 4000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import table, write_results
from harness import services
from harness.spark_cluster import SparkCluster, spark_home, start_spark_cluster

ROOT = Path(__file__).resolve().parent.parent
MODES = ("local[2]", "cluster submit", "cluster connect")
APP_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
}


def run_job(mode: str, cluster: SparkCluster, connect: str, args: dict[str, Any]) -> float:
    """One job of ``mode`` (``--cycles epochs``); its wall time in seconds.

    Raises:
        RuntimeError: the job failed (its stderr's tail is in the message).
    """
    job = [str(ROOT / "spark_jobs" / "run_epoch.py"), "--pipeline", "examples.wordcount:pipeline"]
    job += ["--storage", args["storage"][mode], "--bootstrap", args["bootstrap"]]
    job += ["--parallelism", "2", "--cycles", str(args["epochs"])]
    config = {"max_records_per_epoch": args["per_epoch"], "retained": 1000}
    job += [
        "--config",
        json.dumps({**config, "group_id": f"bench-{args['run']}-{MODES.index(mode)}"}),
    ]
    if mode == "cluster connect":
        argv = [sys.executable, *job, "--remote", connect]
    else:
        master = "local[2]" if mode == "local[2]" else cluster.master_url
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", master]
        argv += ["--driver-memory", "1g"]
        for name, value in APP_CONF.items():
            argv += ["--conf", f"{name}={value}"]
        argv += job
    env = {**cluster.client_env(), "WORDCOUNT_TOPIC": args["topic"], "WORDCOUNT_SINK": ""}
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(
            f"{mode} job failed (rc {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return time.monotonic() - started


def durations(storage: str) -> list[float]:
    """Every completed checkpoint's duration in seconds, in id order."""
    from microcheckpoint.protocol.history import checkpoint_history
    from microcheckpoint.storage import FileStore

    history = checkpoint_history(FileStore(storage), "wordcount")
    rows = sorted(history["checkpoints"], key=lambda r: r["id"])
    return [r["duration_ms"] / 1000 for r in rows if r["status"] == "COMPLETED"]


def measure(rounds: int, epochs: int, lines: int, work: Path) -> dict[str, Any]:
    """Steps: 1. start Tansu, the cluster and a Connect server on it; 2. produce every
    round's lines; 3. run the rounds, rotating the modes; 4. read the epochs' durations,
    and check every mode's word counts against the lines.

    Raises:
        RuntimeError: a job failed, or a mode's counts are not the lines' counts.
    """
    from examples.wordcount import expected, generate
    from microcheckpoint.state.reader import read_keyed_state
    from microcheckpoint.storage import FileStore

    logs = work / "logs"
    # Step 1
    tansu = services.start_tansu(logs)
    cluster = start_spark_cluster(logs / "cluster", workers=2, cores=2, memory="1g")
    connect = services.start_spark_connect(logs, master=cluster.master_url, conf=APP_CONF)
    try:
        # Step 2
        topic = f"bench-cluster-{uuid.uuid4().hex[:8]}"
        produced = generate(tansu.address, topic, lines * epochs * rounds, seed=5)
        args = {
            "run": uuid.uuid4().hex[:6],
            "bootstrap": tansu.address,
            "topic": topic,
            "epochs": epochs,
            "per_epoch": lines // 2,
            "storage": {m: (work / f"store-{i}").as_uri() for i, m in enumerate(MODES)},
        }
        # Step 3
        load = [os.getloadavg()[0]]
        walls: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
            for mode in order:
                walls[mode].append(run_job(mode, cluster, connect.address, args))
                load.append(os.getloadavg()[0])
                print(f"round {r + 1} {mode}: {walls[mode][-1]:.1f}s", flush=True)
        # Step 4
        times = {m: durations(args["storage"][m]) for m in MODES}
        states = {
            m: read_keyed_state(FileStore(args["storage"][m]), "wordcount", "word-counts")
            for m in MODES
        }
        if any(state != dict(expected(produced)) for state in states.values()):
            raise RuntimeError("a mode's word counts differ from the lines produced")
    finally:
        connect.stop()
        cluster.stop()
        tansu.stop()
    return {"times": times, "walls": walls, "load": load, "epochs": epochs, "lines": lines}


def summarize(result: dict[str, Any]) -> list[list[Any]]:
    """One row per mode: first-epoch and later-epoch medians, ratios to local[2], wall."""
    epochs = result["epochs"]
    rows, base = [], {}
    for mode in MODES:
        times = result["times"][mode]
        firsts = times[0::epochs]
        later = [t for i, t in enumerate(times) if i % epochs]
        first, rest = statistics.median(firsts), statistics.median(later)
        wall = statistics.median(result["walls"][mode])
        base = base or {"first": first, "rest": rest, "wall": wall}
        rows.append(
            [
                mode,
                len(times),
                first,
                first / base["first"],
                rest,
                rest / base["rest"],
                wall,
                wall / base["wall"],
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="jobs per mode (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per job (default 4)")
    parser.add_argument("--lines", type=int, default=4000, help="lines per epoch (default 4000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mcp-bench-cluster-") as work:
        result = measure(args.rounds, args.epochs, args.lines, Path(work))
    rows = summarize(result)
    header = ["mode", "epochs", "first s", "first x", "later s", "later x", "job s", "job x"]
    print()
    print(
        f"{args.lines} lines per epoch, {args.epochs} epochs per job, {args.rounds} jobs per mode"
    )
    print(table(rows, header))
    load = result["load"]
    print(f"load average (1 min) during the runs: {min(load):.1f} to {max(load):.1f}")
    write_results(
        "cluster_epochs", {"rows": [dict(zip(header, r, strict=True)) for r in rows], **result}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
