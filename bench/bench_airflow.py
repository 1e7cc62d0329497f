"""One checkpoint end to end through Airflow's scheduler, with the Connect server and in-process.

For each Spark mode (``connect``: the DAG's epoch task is a client of one warm Spark Connect
server; ``local``: the task starts Spark in its own process), starts the local services and
Airflow (PostgreSQL metadata database, LocalExecutor), then ``--runs`` times: produces 300
lines of the word count example, triggers ``wordcount_pipeline`` through the REST API and
waits for the run. Measured per checkpoint, from storage: trigger → completed (the global
ack) and trigger → notified (sinks published, offsets committed); and from Airflow: the DAG
run's wall time, the run's end after its epoch task's (the scheduler's part), the time spent
inside its tasks (the rest is scheduling and task start), and each task's timeline (queued,
started, ended: seconds after the trigger request). The run's state is asked once a second.
The first run of each mode is a warm-up and is left out. Before Airflow starts, the Connect
server runs ``--warm-epochs`` epochs of the word count for this process (a pipeline and a
topic of their own): its JVM compiles the code an epoch runs while it runs it, for minutes
(``_warm_server``), and a server in service has run thousands of epochs.

Run: ``.venv/bin/python -m bench.bench_airflow``; ``run`` returns the figures for
``bench.run_all``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import services
from harness.airflow_stack import start_airflow

BUCKET = "microcheckpoint-bench"
LINES = 300
WARM_EPOCHS = 60


def _seconds(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def _inside_tasks(api: Any, run_id: str) -> float:
    """Seconds the run's tasks ran (their own start to end, summed)."""
    path = f"/api/v2/dags/wordcount_pipeline/dagRuns/{urllib.parse.quote(run_id)}/taskInstances"
    total = 0.0
    for ti in api.get(path)["task_instances"]:
        start, end = _seconds(ti.get("start_date")), _seconds(ti.get("end_date"))
        if start is not None and end is not None and ti["state"] == "success":
            total += end - start
    return total


def _timeline(api: Any, run_id: str, t0: float) -> dict[str, list[float | None]]:
    """Each task's [queued, started, ended], seconds after ``t0`` (the trigger request)."""
    path = f"/api/v2/dags/wordcount_pipeline/dagRuns/{urllib.parse.quote(run_id)}/taskInstances"
    out: dict[str, list[float | None]] = {}
    for ti in api.get(path)["task_instances"]:
        marks = [_seconds(ti.get(k)) for k in ("queued_when", "start_date", "end_date")]
        out[ti["task_id"]] = [None if m is None else round(m - t0, 2) for m in marks]
    return out


def _checkpoint_times(store: Any, cid: int) -> tuple[float, float]:
    """(trigger → completed, trigger → notified) of checkpoint ``cid``, in seconds."""
    from microcheckpoint.ids import CheckpointId
    from microcheckpoint.protocol.layout import Layout
    from microcheckpoint.protocol.records import NotifiedRecord, read
    from microcheckpoint.protocol.view import scan

    view = scan(store, Layout("wordcount"))
    pending = view.pending_record(CheckpointId(cid))
    meta = view.metadata(CheckpointId(cid))
    notified = read(store, Layout("wordcount").notified(CheckpointId(cid)), NotifiedRecord)
    if notified is None:
        raise SystemExit(f"checkpoint {cid} was not notified")
    trigger = pending.trigger_time_ms
    return (meta.completed_time_ms - trigger) / 1000, (notified.at_ms - trigger) / 1000


def _warm_server(address: str, stack: Any, root: Path, epochs: int) -> None:
    """``epochs`` epochs of the word count (300 lines each, its file sink, checkpoints in
    the bench's bucket under ``warm-up``) run by this process against the Connect server at
    ``address``. A new server's JVM compiles Spark's code as the epochs run it: a job of
    two no-op Arrow tasks cost it 320 ms of CPU in its first 20 runs and 100 ms after 200
    (docs/engine.md), and on 2 cores the epoch waits for that CPU."""
    from examples import wordcount
    from microcheckpoint.adapters.s3 import S3Store, make_client
    from microcheckpoint.config import CheckpointConfig
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.engine.spark import connect_spark

    options = stack.s3.store_options()
    store = S3Store(make_client(**options), BUCKET, "warm-up")
    pipeline = wordcount.build("warm-lines", name="warm-up", sink_target=(root / "warm").as_uri())
    config = CheckpointConfig.from_mapping({"pipeline": "warm-up", "storage": store.url})
    # A Connect session marks this process's environment as Connect's (pyspark sets
    # SPARK_CONNECT_MODE_ENABLED), and the Airflow of the next mode inherits it: its tasks'
    # in-process Spark then asked for a Connect URL. The environment is put back after.
    environment = dict(os.environ)
    spark = connect_spark(address)
    try:
        for i in range(epochs):
            lines = wordcount.lines_for(LINES, seed=1000 + i)
            wordcount.produce(stack.kafka_bootstrap, "warm-lines", lines, create=i == 0)
            run_cycle(
                spark,
                pipeline,
                config,
                store,
                bootstrap=stack.kafka_bootstrap,
                parallelism=2,
                store_options=options,
            )
    finally:
        spark.stop()
        os.environ.clear()
        os.environ.update(environment)


def measure(
    mode: str, runs: int, idle_sleep: float = 0.25, warm_epochs: int = WARM_EPOCHS
) -> dict[str, Any]:
    """``runs`` checkpoints (plus a warm-up) through Airflow in Spark mode ``mode``, the
    scheduler sleeping ``idle_sleep`` seconds after a loop that found nothing to do; with the
    Connect server, after ``warm_epochs`` epochs of its own (``_warm_server``)."""
    from examples import wordcount
    from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client
    from microcheckpoint.protocol.history import checkpoint_history

    root = Path(tempfile.mkdtemp(prefix=f"bench-airflow-{mode}-"))
    with services.local_stack(root / "service-logs") as stack:
        connect = None
        if mode == "connect":
            connect = services.start_spark_connect(root / "service-logs")
            stack.started.append(connect)
        client = make_client(
            stack.s3.url, stack.s3.region, stack.s3.access_key, stack.s3.secret_key
        )
        ensure_bucket(client, BUCKET)
        store = S3Store(client, BUCKET, "checkpoints")
        if connect is not None and warm_epochs:
            started = time.monotonic()
            _warm_server(connect.address, stack, root, warm_epochs)
            print(f"  {mode}: {warm_epochs} warm-up epochs in {time.monotonic() - started:.0f} s")
        env = {
            "MICROCHECKPOINT_STORAGE": f"s3://{BUCKET}/checkpoints",
            "WORDCOUNT_TOPIC": "lines",
            "WORDCOUNT_SINK": (root / "published").as_uri(),
            "WORDCOUNT_INTERVAL": "1h",  # runs are triggered here, one at a time
            "WORDCOUNT_RETAINED": "3",
            "MICROCHECKPOINT_SPARK_MODE": mode,
            # docs/airflow.md's setting for short epochs (Airflow's default is 1 s): a task
            # after another, and the run's end, within a quarter second.
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(idle_sleep),
        }
        airflow = start_airflow(
            root / "airflow",
            stack.kafka_bootstrap,
            stack.s3,
            env,
            spark_connect=None if connect is None else connect.address,
        )
        try:
            api = airflow.client
            api.wait_dags(["wordcount_pipeline"])
            wordcount.produce(stack.kafka_bootstrap, "lines", wordcount.lines_for(LINES, seed=1))
            api.set_paused("wordcount_pipeline", False)
            # Unpausing starts the scheduled run of the latest interval: the warm-up.
            _wait_idle(api)
            rows = []
            for i in range(runs):
                lines = wordcount.lines_for(LINES, seed=100 + i)
                wordcount.produce(stack.kafka_bootstrap, "lines", lines, create=False)
                t0 = time.time()
                run_id = api.trigger("wordcount_pipeline")
                # Asked once a second, as a person or a sensor would: asked five times a
                # second, Airflow's API server spent 0.15 s of CPU a run answering, on the two
                # cores the run itself needs (docs/airflow.md, "The bench's own load"). The
                # figures are Airflow's and the checkpoint's own times, not the poll's.
                state = api.wait_run("wordcount_pipeline", run_id, 600, poll=1.0)
                # From the trigger request to the run's end as Airflow recorded it.
                wall = _seconds(api.run("wordcount_pipeline", run_id)["end_date"]) - t0
                if state != "success":
                    raise SystemExit(f"{mode}: run {run_id} ended {state}; logs in {root}")
                cid = checkpoint_history(store, "wordcount")["latest_completed"]
                completed, notified = _checkpoint_times(store, cid)
                tasks = _timeline(api, run_id, t0)
                rows.append(
                    {
                        "checkpoint": cid,
                        "trigger_to_completed_s": round(completed, 2),
                        "trigger_to_notified_s": round(notified, 2),
                        "dag_run_wall_s": round(wall, 2),
                        # The scheduler's part after the epoch: the run's end after its
                        # epoch task's.
                        "run_end_after_epoch_task_s": round(wall - tasks["process_epoch"][2], 2),
                        "inside_tasks_s": round(_inside_tasks(api, run_id), 2),
                        "tasks": tasks,
                    }
                )
                print(f"  {mode}: {rows[-1]}", flush=True)
        finally:
            airflow.stop()
    return {
        "warm_up_epochs": warm_epochs if connect is not None else 0,
        "runs": rows,
        "p50": {
            key: round(statistics.median(r[key] for r in rows), 2)
            for key in rows[0]
            if key not in ("checkpoint", "tasks")
        },
    }


def _wait_idle(api: Any, timeout: float = 600) -> None:
    """Until the pipeline DAG has a run and none of its runs is queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = api.runs("wordcount_pipeline")
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            return
        time.sleep(1)
    raise SystemExit("the warm-up run of wordcount_pipeline did not end")


def run(
    runs: int, modes: list[str], idle_sleep: float = 0.25, warm_epochs: int = WARM_EPOCHS
) -> dict[str, Any]:
    return {mode: measure(mode, runs, idle_sleep, warm_epochs) for mode in modes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["connect", "local"])
    parser.add_argument(
        "--idle-sleep", type=float, default=0.25, help="[scheduler] scheduler_idle_sleep_time"
    )
    parser.add_argument(
        "--warm-epochs",
        type=int,
        default=WARM_EPOCHS,
        help="epochs the Connect server runs before Airflow starts (0: none)",
    )
    args = parser.parse_args(argv)
    print(run(args.runs, args.modes, args.idle_sleep, args.warm_epochs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
