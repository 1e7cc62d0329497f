"""Bytes written per checkpoint: a full snapshot vs an incremental epoch touching 1% of keys.

A keyed running count over ``--keys`` keys (default 20k), run through the real engine
(Tansu via ``harness.services``, Spark ``local[2]``, ``run_cycle``, file checkpoint storage):

1. epoch 1: one record per key, so every key gets state (the full snapshot);
2. epoch 2: 1% of the keys, drawn at random;
3. epoch 3: 1% of the keys, chosen from the fewest key groups (clustered).

For each epoch it sums the sizes of the state files *written* by that checkpoint (handles
under ``chk-<n>/``; the rest are references to older files) and prints the ratio to epoch 1,
with the number of key groups that changed. Runs the ``table`` backend (incremental per key
group) and, for contrast, the ``memory`` backend (rewrites everything). The state read back
is checked against a plain Counter. Writes ``bench/results/bench_checkpoint_bytes.json``.
Run: ``.venv/bin/python -m bench.bench_checkpoint_bytes``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench._common import table, write_results
from harness import services
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.keygroups import spark_key_group
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

UID = "key-counts"
MAX_PARALLELISM = 128


def pipeline_for(topic: str, backend: str):
    from pyspark.sql import functions as F

    from microcheckpoint.engine import KafkaSource, Pipeline, running_sum

    return (
        Pipeline(f"bytes-{backend}", KafkaSource("keys-source", [topic], value_format="text"))
        .then(lambda df: df.select(F.col("value").alias("k")))
        .then(running_sum(UID, key="k", state_backend=backend))
    )


def send(bootstrap: str, topic: str, keys: list[str]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    try:
        for k in keys:
            producer.send(topic, value=k.encode(), partition=0)
        producer.flush()
    finally:
        producer.close()


def key_group(k: str) -> int:
    """A key's group in the built-in aggregation's state (``spark-murmur3``)."""
    return spark_key_group(k, MAX_PARALLELISM)


def written_bytes(meta: Any, layout: Layout) -> tuple[int, int, int]:
    """(bytes of state files new in this checkpoint, their count, bytes of all referenced files)."""
    prefix = layout.chk(meta.checkpoint_id)
    new = files = total = 0
    seen: set[str] = set()
    for task, ack in meta.acks.items():
        if task.uid.value != UID:
            continue
        for h in ack.handles:
            if h.key in seen:
                continue
            seen.add(h.key)
            total += h.size
            if h.key.startswith(prefix):
                new += h.size
                files += 1
    return new, files, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--touch", type=float, default=0.01, help="share of keys per later epoch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)

    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.engine.spark import local_spark

    rng = random.Random(args.seed)
    keys = [f"key-{i:06d}" for i in range(args.keys)]
    touched = max(1, round(args.keys * args.touch))
    random_keys = rng.sample(keys, touched)
    clustered_keys = sorted(keys, key=lambda k: (key_group(k), k))[:touched]
    epochs = [("full", keys), ("random 1%", random_keys), ("clustered 1%", clustered_keys)]

    log_dir = Path(tempfile.mkdtemp(prefix="bench-bytes-"))
    tansu = services.start_tansu(log_dir)
    spark = local_spark("local[2]")
    results: dict[str, Any] = {"keys": args.keys, "touched_per_epoch": touched, "backends": {}}
    try:
        bootstrap = tansu.address
        topic = "bench-keys"
        with KafkaOffsets(bootstrap) as kafka:
            kafka.create_topic(topic, 1)
        pipelines = {b: pipeline_for(topic, b) for b in ("table", "memory")}
        stores = {b: FileStore("file://" + str(log_dir / f"chk-{b}")) for b in pipelines}
        configs = {
            b: CheckpointConfig.from_mapping(
                {"pipeline": p.name, "storage": stores[b].url, "retained": 3}
            )
            for b, p in pipelines.items()
        }
        truth: Counter[str] = Counter()
        rows: dict[str, list[dict[str, Any]]] = {b: [] for b in pipelines}
        for label, epoch_keys in epochs:
            send(bootstrap, topic, epoch_keys)
            truth.update(epoch_keys)
            for backend, pipeline in pipelines.items():
                r = run_cycle(
                    spark,
                    pipeline,
                    configs[backend],
                    stores[backend],
                    bootstrap=bootstrap,
                    parallelism=args.parallelism,
                )
                assert r.records == len(epoch_keys), (label, backend, r.records)
                new, files, total = written_bytes(r.metadata, Layout(pipeline.name))
                rows[backend].append(
                    {
                        "epoch": label,
                        "checkpoint": r.checkpoint_id.value,
                        "keys_touched": len(epoch_keys),
                        "key_groups_touched": len({key_group(k) for k in epoch_keys}),
                        "new_state_files": files,
                        "new_state_bytes": new,
                        "referenced_state_bytes": total,
                    }
                )
        for backend, pipeline in pipelines.items():
            state = read_keyed_state(stores[backend], pipeline.name, UID)
            assert state == dict(truth), f"{backend}: state differs from the ground truth"
            full = rows[backend][0]["new_state_bytes"]
            for row in rows[backend]:
                row["ratio_to_full"] = round(row["new_state_bytes"] / full, 4)
            results["backends"][backend] = rows[backend]
    finally:
        spark.stop()
        tansu.stop()

    path = write_results("bench_checkpoint_bytes", results)
    out = [
        [
            backend,
            r["epoch"],
            r["keys_touched"],
            f"{r['key_groups_touched']}/{MAX_PARALLELISM}",
            r["new_state_files"],
            r["new_state_bytes"],
            r["ratio_to_full"],
        ]
        for backend, rs in results["backends"].items()
        for r in rs
    ]
    print(f"running count over {args.keys:,} keys, max_parallelism {MAX_PARALLELISM}")
    print(
        table(out, ["backend", "epoch", "keys", "key groups", "new files", "new bytes", "vs full"])
    )
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
