"""``make demo``: the word count run by Airflow's scheduler, with a savepoint and a restore.

1. Starts Tansu (Kafka-compatible broker) and SeaweedFS (S3) on loopback ports, and
   ``airflow standalone`` (SQLite, LocalExecutor) with the project's ``dags/`` and
   the installed package's plugin; prints the UI address and login.
2. Produces lines of text to a 2-partition topic and unpauses ``wordcount_pipeline``:
   every run is one checkpoint, one task (min pause and max concurrent, trigger, Spark
   epoch, complete, notify with retention); progress is printed as checkpoints land.
3. Triggers ``wordcount_savepoint`` with ``stop=true`` through the REST API, as the UI's
   form does: triggering stops, the savepoint is taken, the pipeline DAG is paused.
4. Produces more lines, triggers ``wordcount_restore`` from that savepoint: the DAG is
   unpaused and the new lines are counted.
5. Prints the checkpoint history and compares the checkpointed counts and the published
   output with a ground truth computed independently (``str.split``).

``make demo KEEP=1`` leaves Airflow and the services running until Ctrl-C or SIGTERM, and
prints the ``export`` lines that point the ``microcheckpoint`` command at them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from harness import services
from harness.airflow_stack import PROJECT_ROOT, AirflowStack, start_airflow
from harness.services import S3Endpoint

BUCKET = "microcheckpoint-demo"
STORAGE = f"s3://{BUCKET}/checkpoints"
TOPIC = "lines"
PIPELINE = "wordcount"


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _history(store) -> dict:
    from microcheckpoint.protocol.history import checkpoint_history

    return checkpoint_history(store, PIPELINE)


def _row_text(row: dict) -> str:
    ranges = ", ".join(f"[{a}, {b})" for a, b in row.get("ranges", {}).values())
    took = f"{row['duration_ms'] / 1000:.1f}s" if "duration_ms" in row else ""
    reason = row.get("reason") or ""
    return (
        f"checkpoint {row['id']:>2} {row['status']:<9} {reason:<8} ranges {ranges:<22} "
        f"records {row.get('records', ''):>4}  {took:>6}  run {row.get('labels', {}).get('run_id', '')}"
    )


def _follow(store, until, timeout: float, seen: set[int]) -> None:
    """Print each checkpoint as it completes or aborts, until ``until(history)``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = _history(store)
        for row in sorted(history["checkpoints"], key=lambda r: r["id"]):
            if row["id"] not in seen and row["status"] in ("COMPLETED", "ABORTED"):
                seen.add(row["id"])
                _say(_row_text(row))
        if until(history):
            return
        time.sleep(1)
    raise TimeoutError(f"the pipeline did not get there within {timeout:.0f}s")


def _consumed(ends: int):
    def check(history: dict) -> bool:
        latest = history["latest_completed"]
        if latest is None:
            return False
        row = next(r for r in history["checkpoints"] if r["id"] == latest)
        # Notified: the sink has published and the group offsets are committed.
        return row["notified"] and all(e == ends for _, e in row["ranges"].values())

    return check


def _start_spark(log_dir: Path, spark: str, started: list[services.Service]) -> services.Service:
    """The demo's Spark Connect server, appended to ``started`` with what it needs.

    ``spark`` is ``local`` (the server runs ``local[2]`` in its own JVM) or ``cluster`` (a
    standalone master and two workers on loopback, ``harness.spark_cluster``, are the
    server's master: the executors are JVMs of the workers, with their own Python workers).
    """
    if spark == "local":
        connect = services.start_spark_connect(log_dir)
        started.append(connect)
        _say(f"Spark: a Spark Connect server on local[2] ({connect.address})")
        return connect
    from harness.spark_cluster import start_spark_cluster

    cluster = start_spark_cluster(log_dir / "spark-cluster")
    started.extend(cluster.services)
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    connect = services.start_spark_connect(log_dir, master=cluster.master_url, conf=loopback)
    started.append(connect)
    _say(
        f"Spark: a Spark Connect server ({connect.address}) whose master is the standalone "
        f"cluster {cluster.master_url}: {len(cluster.workers)} workers, executors in JVMs "
        f"of their own (master UI {cluster.web_url})"
    )
    return connect


def run(
    lines_first: int, lines_second: int, max_records: int, keep: bool, spark: str = "local"
) -> int:
    from examples import wordcount
    from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client
    from microcheckpoint.sinks.files import read_committed
    from microcheckpoint.state.reader import read_keyed_state

    output = PROJECT_ROOT / "demo-output" / "airflow-demo"
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    sink = f"file://{output / 'published'}"
    _say(f"starting Tansu, SeaweedFS (S3), a Spark Connect server and Airflow (logs in {output})")
    services.quick_jvms()
    with services.local_stack(output / "service-logs") as stack:
        connect = _start_spark(output / "service-logs", spark, stack.started)
        s3 = stack.s3
        client = make_client(s3.url, s3.region, s3.access_key, s3.secret_key)
        ensure_bucket(client, BUCKET)
        store = S3Store(client, BUCKET, "checkpoints")
        env = {
            "MICROCHECKPOINT_STORAGE": STORAGE,
            "WORDCOUNT_TOPIC": TOPIC,
            "WORDCOUNT_SINK": sink,
            "WORDCOUNT_INTERVAL": "20s",
            "WORDCOUNT_MIN_PAUSE": "5s",
            "WORDCOUNT_MAX_RECORDS": str(max_records),
            "WORDCOUNT_RETAINED": "20",
            # Every epoch runs on the one warm Spark Connect server: no JVM per task.
            "MICROCHECKPOINT_SPARK_MODE": "connect",
        }
        airflow: AirflowStack = start_airflow(
            output / "airflow", stack.kafka_bootstrap, s3, env, spark_connect=connect.address
        )
        try:
            api = airflow.client
            _say(f"Airflow UI: {airflow.url}  login: {airflow.username} / {airflow.password}")
            _say(f"checkpoint history page: {airflow.url}/microcheckpoint/")
            api.wait_dags(["wordcount_pipeline", "wordcount_savepoint", "wordcount_restore"])
            first = wordcount.lines_for(lines_first, seed=7)
            wordcount.produce(stack.kafka_bootstrap, TOPIC, first)
            per_partition = lines_first // 2
            _say(f"produced {lines_first} lines; unpausing wordcount_pipeline (every 20s)")
            api.set_paused("wordcount_pipeline", False)
            seen: set[int] = set()
            _follow(store, _consumed(per_partition), 600, seen)

            _say("triggering wordcount_savepoint with {'target': '', 'stop': true}")
            run_id = api.trigger("wordcount_savepoint", {"target": "", "stop": True})
            state = api.wait_run("wordcount_savepoint", run_id, 300)
            savepoint = api.xcom("wordcount_savepoint", run_id, "take_savepoint")
            paused = api.dag("wordcount_pipeline")["is_paused"]
            _say(f"savepoint run {state}: {savepoint}; wordcount_pipeline paused: {paused}")

            second = wordcount.lines_for(lines_second, seed=8)
            wordcount.produce(stack.kafka_bootstrap, TOPIC, second, create=False)
            _say(f"produced {lines_second} more lines; restoring from the savepoint")
            conf = {"point": savepoint, "claim_mode": "NO_CLAIM", "parallelism": 2, "resume": True}
            run_id = api.trigger("wordcount_restore", conf)
            state = api.wait_run("wordcount_restore", run_id, 300)
            paused = api.dag("wordcount_pipeline")["is_paused"]
            _say(f"restore run {state}; wordcount_pipeline paused: {paused}")
            _follow(store, _consumed(per_partition + lines_second // 2), 600, seen)
            # Pause it with no run left half done (one may be in flight).
            states = api.quiesce("wordcount_pipeline", 300)
            _say(f"wordcount_pipeline paused; its runs: {dict(Counter(states))}")

            counts = read_keyed_state(store, "wordcount", "word-counts")
            truth = Counter(w for line in first + second for w in line.split())
            code = _report(_history(store), counts, truth, len(first) + len(second))
            published = read_committed(sink, "wordcount", "word-totals")
            from harness.demo_engine import show_output

            code = code or show_output(output / "published", published, truth)
            code = code or _check_logs(output, s3, airflow)
            print()
            if keep:
                print(f"Airflow UI: {airflow.url}  (login {airflow.username} / {airflow.password})")
                print(
                    f"KEEP: Airflow and the services keep running; press Ctrl-C (or "
                    f"`kill {os.getpid()}`) to stop them."
                )
                print()
                latest = _history(store)["latest_completed"]
                lines = cli_exports(s3, stack.kafka_bootstrap, airflow, latest)
                print("\n".join(lines), flush=True)
                _wait_for_stop()
            else:
                print("Airflow and the services are stopped now. `make demo KEEP=1` keeps them")
                print("running at the end, to look around in the UI, and prints `export` lines")
                print("(storage, pipeline, S3 endpoint and keys, Kafka, Airflow) for the")
                print("`microcheckpoint` command of README.md's Operating it.")
            return code
        finally:
            airflow.stop()


def cli_exports(
    s3: S3Endpoint, kafka_bootstrap: str, airflow: AirflowStack, latest: int | None
) -> list[str]:
    """Shell lines that point the ``microcheckpoint`` command at the demo's services.

    Printed on the demo's standard output only, after the credential scan of the logs
    (``_check_logs``), never to a file: the S3 keys and the Airflow login are this run's
    throwaway ones, and the scan looks for the secret and the password in every log. Values
    are quoted for the shell; comment lines keep the block safe to paste whole.

    Args:
        s3: the demo's S3 server and its keys.
        kafka_bootstrap: ``host:port`` of the demo's broker.
        airflow: the demo's Airflow: ``savepoint --stop`` and ``cancel`` pause the
            pipeline DAG through its REST API with this URL and login.
        latest: the latest completed checkpoint's id, for the ``show`` example; None (no
            checkpoint completed) names no id.

    Returns:
        The lines, comments first, one ``export`` per variable.
    """
    variables = {
        "MICROCHECKPOINT_STORAGE": STORAGE,
        "MICROCHECKPOINT_PIPELINE": PIPELINE,
        "MICROCHECKPOINT_S3_ENDPOINT": s3.url,
        "MICROCHECKPOINT_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "MICROCHECKPOINT_AIRFLOW_URL": airflow.url,
        "MICROCHECKPOINT_AIRFLOW_USER": airflow.username,
        "MICROCHECKPOINT_AIRFLOW_PASSWORD": airflow.password,
    }
    return [
        "# The microcheckpoint command on this demo (README.md, Operating it): paste into a shell,",
        f"# then: microcheckpoint list; microcheckpoint show {latest or 'ID'}",
        *(f"export {name}={shlex.quote(value)}" for name, value in variables.items()),
        f"# Airflow UI: {airflow.url}/  Checkpoints page: {airflow.url}/microcheckpoint/",
    ]


def _check_logs(output, s3, airflow: AirflowStack) -> int:
    """No credential in any log written so far (Airflow's, its tasks', the services')."""
    from harness.leaks import find_leaks, log_files

    secrets = {
        "S3 secret key": s3.secret_key,
        "Airflow admin password": airflow.password,
        "Airflow JWT secret": airflow.env["AIRFLOW__API_AUTH__JWT_SECRET"],
    }
    leaks = find_leaks([output], secrets)
    if leaks:
        print("CREDENTIALS: LEAKED - " + "; ".join(leaks))
        return 1
    files = len(log_files([output]))
    print(f"CREDENTIALS: OK - none of {len(secrets)} secrets in {files} log files")
    return 0


def _wait_for_stop() -> None:
    """Sleep until Ctrl-C or SIGTERM (also when started in the background, where the shell
    makes SIGINT ignored)."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping Airflow and the services", flush=True)


def _report(history: dict, counts: dict, truth: Counter, produced: int) -> int:
    print()
    print(f"Checkpoint history of wordcount (storage {history['storage']})")
    for row in sorted(history["checkpoints"], key=lambda r: r["id"]):
        print("  " + _row_text(row))
    print(f"  savepoints: {history['savepoints']}")
    print(f"  restored from: {history['restored_from']}")
    print()
    print("Top words: checkpointed state vs ground truth (str.split over every line produced)")
    for word, count in truth.most_common(8):
        print(f"  {word:<12} {counts.get(word, 0):>6} {count:>6}")
    ok = counts == dict(truth)
    print(
        f"lines produced: {produced}; words counted: {sum(counts.values())}; "
        f"ground truth: {sum(truth.values())}"
    )
    print(
        "RESULT: "
        + ("OK - every word's count equals the ground truth exactly" if ok else "MISMATCH")
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=600, help="lines before the savepoint")
    parser.add_argument("--more-lines", type=int, default=200, help="lines after it")
    parser.add_argument("--max-records", type=int, default=150, help="per partition per epoch")
    parser.add_argument(
        "--keep",
        action="store_true",
        default=os.environ.get("KEEP", "") not in ("", "0"),
        help="leave everything running at the end (make demo KEEP=1)",
    )
    parser.add_argument(
        "--spark",
        choices=("local", "cluster"),
        default=os.environ.get("SPARK") or "local",
        help="the Connect server's master: local[2], or a standalone cluster (make demo "
        "SPARK=cluster)",
    )
    args = parser.parse_args(argv)
    # A SIGTERM (a `timeout`, a CI job cancelled) unwinds like Ctrl-C, so every service
    # this demo started is stopped by its `finally`, none left orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run(args.lines, args.more_lines, args.max_records, args.keep, args.spark)


if __name__ == "__main__":
    sys.exit(main())
