"""``make demo-engine``: the word count as checkpointed Spark epochs (no Airflow), a kill -9, exact recovery.

1. Starts Tansu (Kafka-compatible broker) and SeaweedFS (S3) on loopback ports.
2. Produces lines of text between epochs to a 3-partition topic.
3. Runs the word count (examples/wordcount.py) epoch by epoch with local Spark: each epoch
   is a checkpoint with a barrier of real end offsets; keyed state (a count per word, in
   128 key groups) goes to S3 as incremental Parquet snapshots.
4. Runs one epoch as a separate ``spark_jobs/run_epoch.py`` process that is killed with
   SIGKILL after the state snapshot and before its ack; the next run re-runs that epoch
   from the previous checkpoint's state.
5. Prints the checkpoint history, then compares the counts in the latest checkpoint with a
   ground truth computed independently (``str.split`` over the lines produced).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from harness import services
from harness.faults import crash_env
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.history import run_attempt
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import CheckpointStatus, scan

TOPIC = "lines"
PARTITIONS = 3
BUCKET = "microcheckpoint-demo"
ROOT = Path(__file__).resolve().parent.parent


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _produce(bootstrap: str, lines: list[str], first: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    try:
        for i, line in enumerate(lines, start=first):
            producer.send(TOPIC, value=line.encode(), partition=i % PARTITIONS)
        producer.flush()
    finally:
        producer.close()


def _killed_run(stack: services.Stack, storage: str, config: dict, parallelism: int) -> int:
    """One cycle as its own Spark job process, killed -9 after the snapshot, before the ack."""
    env = {
        **os.environ,
        **stack.s3.environment(),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        **crash_env("after_snapshot"),
        "WORDCOUNT_SINK": os.environ.get("WORDCOUNT_SINK", ""),
    }
    argv = [
        sys.executable,
        str(ROOT / "spark_jobs" / "run_epoch.py"),
        "--pipeline",
        "examples.wordcount:pipeline",
        "--storage",
        storage,
        "--bootstrap",
        stack.kafka_bootstrap,
        "--parallelism",
        str(parallelism),
        "--s3-endpoint",
        stack.s3.url,
        "--config",
        json.dumps(config),
    ]
    process = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, start_new_session=True)
    return process.returncode


def run(epochs: int, lines_per_epoch: int, crash_epoch: int, parallelism: int) -> int:
    from examples.wordcount import build, lines_for
    from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client
    from microcheckpoint.config import CheckpointConfig
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.engine.spark import local_spark
    from microcheckpoint.sinks.files import read_committed
    from microcheckpoint.state.reader import read_keyed_state

    _say("starting the local broker (Tansu) and S3 store (SeaweedFS) ...")
    services.quick_jvms()
    with services.local_stack() as stack:
        _say(f"Kafka at {stack.kafka_bootstrap}, S3 at {stack.s3.url}")
        client = make_client(
            stack.s3.url, stack.s3.region, stack.s3.access_key, stack.s3.secret_key
        )
        ensure_bucket(client, BUCKET)
        storage = f"s3://{BUCKET}/checkpoints"
        store = S3Store(client, BUCKET, "checkpoints")
        options = stack.s3.store_options()
        output = ROOT / "demo-output"
        if output.exists():
            shutil.rmtree(output)
        sink_target = f"file://{output}"
        os.environ["WORDCOUNT_SINK"] = sink_target  # the killed job process builds the same
        pipeline = build(sink_target=sink_target)
        settings = {"max_records_per_epoch": 60, "retained": 3}
        config = CheckpointConfig.from_mapping(
            {"pipeline": pipeline.name, "storage": storage, **settings}
        )
        from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

        with KafkaOffsets(stack.kafka_bootstrap) as kafka:
            kafka.create_topic(TOPIC, PARTITIONS)
        all_lines = lines_for(epochs * lines_per_epoch, seed=7)
        _say("starting Spark (local[2]) ...")
        from pyspark.sql import SparkSession

        # A session already running in this process (a test's) is shared: leave it running.
        ours = SparkSession.getActiveSession() is None
        spark = local_spark()
        started_at: dict[int, float] = {}

        def cycle():
            """One run_cycle, timed for the history table."""
            t0 = time.monotonic()
            result = run_cycle(
                spark,
                pipeline,
                config,
                store,
                bootstrap=stack.kafka_bootstrap,
                parallelism=parallelism,
                store_options=options,
            )
            started_at[result.checkpoint_id.value] = time.monotonic() - t0
            return result

        try:
            for epoch in range(1, epochs + 1):
                batch = all_lines[(epoch - 1) * lines_per_epoch : epoch * lines_per_epoch]
                _produce(stack.kafka_bootstrap, batch, (epoch - 1) * lines_per_epoch)
                if epoch == crash_epoch:
                    _say(
                        f"epoch {epoch}: running the Spark job as its own process, "
                        "to be killed -9 after its state snapshot, before its ack ..."
                    )
                    code = _killed_run(stack, storage, settings, parallelism)
                    view = scan(store, Layout(pipeline.name))
                    pending = view.pending
                    _say(
                        f"  the job died with exit code {code}; checkpoint(s) "
                        f"{[c.value for c in pending]} PENDING, nothing committed"
                    )
                    _say(
                        "  recovering: the next run re-runs that epoch from the last "
                        "completed checkpoint's state"
                    )
                result = cycle()
                _say(
                    f"epoch {epoch}: checkpoint {result.checkpoint_id} completed "
                    f"(attempt {run_attempt(result.attempt)}, {result.records} lines)"
                )
            # Catch up: drain what the per-epoch cap left behind.
            with KafkaOffsets(stack.kafka_bootstrap) as kafka:
                tps = kafka.partitions(TOPIC)
                while True:
                    latest = scan(store, Layout(pipeline.name)).latest_completed
                    offsets = _offsets(store, pipeline.name, latest)
                    if sum(offsets.values()) >= sum(kafka.end_offsets(tps).values()):
                        break
                    result = cycle()
                    _say(
                        f"catching up: checkpoint {result.checkpoint_id} completed "
                        f"({result.records} lines)"
                    )
        finally:
            if ours:
                spark.stop()
        counts = read_keyed_state(store, pipeline.name, "word-counts")
        truth = Counter(w for line in all_lines for w in line.split())
        published = read_committed(sink_target, pipeline.name, "word-totals")
        code = report(store, pipeline.name, started_at, counts, truth, len(all_lines))
        return code or show_output(output, published, truth)


def show_output(output: Path, published: list[dict], truth: Counter) -> int:
    """The sink's files a person can open, and a check of what they hold."""
    manifests = sorted((output / "wordcount" / "word-totals" / "_manifests").glob("*.json"))
    print()
    print(f"Published output (FileSink, exactly once): {output}/wordcount/word-totals/")
    print(
        f"  {len(manifests)} epoch manifests, e.g. {manifests[-1].name if manifests else '-'}; "
        f"each epoch's files hold the words it updated with their new totals"
    )
    finals: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    duplicates = 0
    for row in published:
        pair = (row["key"], row["total"])
        duplicates += pair in seen
        seen.add(pair)
        finals[row["key"]] = max(finals.get(row["key"], 0), row["total"])
    ok = finals == dict(truth) and duplicates == 0
    print(
        f"  rows published: {len(published)}, duplicates: {duplicates}; latest total per word "
        f"{'equals' if finals == dict(truth) else 'DIFFERS FROM'} the ground truth"
    )
    print(
        "OUTPUT: "
        + ("OK - published files match the ground truth, nothing twice" if ok else "MISMATCH")
    )
    return 0 if ok else 1


def _offsets(store, name: str, cid: CheckpointId | None) -> dict:
    if cid is None:
        return {}
    return scan(store, Layout(name)).metadata(cid).offsets


def report(store, name, durations, counts, truth, produced) -> int:
    view = scan(store, Layout(name))
    print()
    print(f"Checkpoint history (storage: {store.url}; retained=3, older ones dropped)")
    header = (
        f"{'id':>3}  {'status':<10} {'attempt':>7}  {'offsets (p0, p1, p2)':<22} "
        f"{'new files':>15} {'reused':>6} {'bytes':>7} {'s':>5}"
    )
    print(header)
    print("-" * len(header))
    for cid in view.ids():
        record = view.records[cid]
        if record.status is not CheckpointStatus.COMPLETED:
            print(f"{cid.value:>3}  {record.status.value:<10}")
            continue
        meta = view.metadata(cid)
        own = view.layout.chk(cid)
        handles = [h for a in meta.acks.values() for h in a.handles]
        new = [h for h in handles if h.key.startswith(own)]
        offsets = ", ".join(str(o) for _, o in sorted(meta.offsets.items()))
        print(
            f"{cid.value:>3}  {'COMPLETED':<10} {run_attempt(meta.attempt):>7}  {offsets:<22} "
            f"{len(new):>15} {len(handles) - len(new):>6} {sum(h.size for h in new):>7} "
            f"{durations.get(cid.value, 0):>5.1f}"
        )
    print()
    print("Top words: checkpointed state vs ground truth (str.split over every line produced)")
    for word, count in truth.most_common(8):
        print(f"  {word:<12} {counts.get(word, 0):>6} {count:>6}")
    ok = counts == dict(truth)
    print()
    print(
        f"lines produced: {produced}; words counted: {sum(counts.values())}; "
        f"ground truth: {sum(truth.values())}; distinct words: {len(counts)} vs {len(truth)}"
    )
    print(
        "RESULT: "
        + (
            "OK - every word's count equals the ground truth exactly "
            "(the killed epoch was counted once)"
            if ok
            else "MISMATCH"
        )
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lines-per-epoch", type=int, default=150)
    parser.add_argument(
        "--crash-epoch", type=int, default=3, help="epoch whose Spark job is killed (0: none)"
    )
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    saved = os.environ.get("WORDCOUNT_SINK")
    try:
        return run(args.epochs, args.lines_per_epoch, args.crash_epoch, args.parallelism)
    finally:
        if saved is None:
            os.environ.pop("WORDCOUNT_SINK", None)
        else:
            os.environ["WORDCOUNT_SINK"] = saved


if __name__ == "__main__":
    sys.exit(main())
