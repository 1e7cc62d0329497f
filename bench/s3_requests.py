"""The S3 request budget of an epoch: requests by kind and on the critical path.

Runs the word count (``examples/wordcount.py``: keyed state with incremental snapshots,
an exactly-once ``FileSink`` on S3) epoch by epoch with ``run_cycle`` and in-process Spark
``local[2]``, with every S3 request of the driver and the executors going through the
fault proxy (``harness/s3_proxy.py``, no rule: it only logs) in front of SeaweedFS. For
1, 8 and 64 source partitions at parallelism 2 and 8 it counts the last epoch's requests
(a steady-state epoch: retention drops one checkpoint per epoch from the second one on)
by kind, by purpose (``bench/_s3_budget.py``) and on the critical path. The driver's
client talks to the proxy as ``localhost``, the executors' as ``127.0.0.1``: the ``Host``
header tells whose request it was.

Writes ``bench/results/s3_requests.json``. Not a speed target: it prints counts.
Run: ``make bench`` or ``.venv/bin/python -m bench.s3_requests [--epochs N]``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench._common import table, write_results
from bench._s3_budget import (
    KINDS,
    dependency_path,
    kind_of,
    longest_sequence,
    prefix_of,
    purpose_of,
)
from harness.s3_proxy import RequestRecord, S3FaultProxy

__all__ = ["CONFIGS", "EpochRequests", "count_epochs", "main", "report", "run"]

CONFIGS = [(p, n) for p in (1, 8, 64) for n in (2, 8)]  # (source partitions, parallelism)
LINES_PER_EPOCH = 128
DRIVER_HOST = "localhost"  # the driver's endpoint host; the executors' is 127.0.0.1


@dataclass(frozen=True)
class EpochRequests:
    """The S3 requests of one epoch (one ``run_cycle``) of one configuration."""

    partitions: int
    parallelism: int
    checkpoint_id: int
    records: tuple[RequestRecord, ...]
    seconds: float

    def kinds(self) -> Counter[str]:
        """Requests per kind (``KINDS``)."""
        return Counter(kind_of(r) for r in self.records)

    def purposes(self) -> Counter[tuple[str, str]]:
        """Requests per (purpose, kind)."""
        return Counter((purpose_of(r), kind_of(r)) for r in self.records)

    def prefixes(self) -> Counter[str]:
        """Requests per folder (``prefix_of``)."""
        return Counter(prefix_of(r, self.checkpoint_id) for r in self.records)

    def purpose_bytes(self) -> dict[str, list[int]]:
        """Per purpose: bytes uploaded and bytes downloaded."""
        sizes: dict[str, list[int]] = {}
        for r in self.records:
            both = sizes.setdefault(purpose_of(r), [0, 0])
            both[0] += r.body_bytes
            both[1] += r.answer_bytes
        return dict(sorted(sizes.items()))

    def driver(self) -> int:
        """Requests the driver made (the coordinator's steps and the sink's commit)."""
        return sum(1 for r in self.records if r.host.startswith(DRIVER_HOST))

    def sequential(self) -> int:
        """The longest chain of requests that did not overlap in time (observed)."""
        return longest_sequence(self.records)

    def critical(self) -> int:
        """Driver requests plus, per Spark stage, its longest task's (by dependency)."""
        return dependency_path(self.records, DRIVER_HOST)

    def summary(self) -> dict[str, Any]:
        """The JSON-able figures of ``bench/results/s3_requests.json``."""
        return {
            "partitions": self.partitions,
            "parallelism": self.parallelism,
            "checkpoint_id": self.checkpoint_id,
            "total": len(self.records),
            "kinds": {k: self.kinds()[k] for k in KINDS},
            "driver": self.driver(),
            "sequential_observed": self.sequential(),
            "critical_by_dependency": self.critical(),
            "purposes": {f"{p} / {k}": n for (p, k), n in sorted(self.purposes().items())},
            "prefixes": dict(sorted(self.prefixes().items())),
            "put_bytes": sum(r.body_bytes for r in self.records),
            "get_bytes": sum(r.answer_bytes for r in self.records),
            "bytes_by_purpose": self.purpose_bytes(),
            "seconds": round(self.seconds, 2),
        }


def _options(s3: Any, url: str) -> dict[str, Any]:
    return {
        "endpoint_url": url,
        "region": s3.region,
        "access_key": s3.access_key,
        "secret_key": s3.secret_key,
    }


def count_epochs(
    spark: Any, s3: Any, bootstrap: str, bucket: str, partitions: int, parallelism: int, epochs: int
) -> list[EpochRequests]:
    """Run ``epochs`` epochs of a fresh word count through a logging proxy; the requests of each.

    Steps: 1. a topic of ``partitions`` partitions and a pipeline of its own (its sink
    publishes to ``s3://<bucket>/output``); 2. per epoch: produce ``LINES_PER_EPOCH`` lines,
    run one cycle, keep the requests logged meanwhile (every request of a cycle ends before
    ``run_cycle`` returns: Spark's tasks finish first).

    Args:
        spark: a SparkSession (the executors must reach ``127.0.0.1``).
        s3: the store's ``S3Endpoint`` (url, region, keys).
        bootstrap: the Kafka bootstrap address.
        bucket: an existing bucket.
        partitions: the source topic's partitions.
        parallelism: the keyed operator's and the sink's subtasks.
        epochs: how many cycles to run (the first writes the first checkpoint).
    """
    from examples.wordcount import build, lines_for, produce
    from microcheckpoint.adapters.s3 import S3Store, make_client
    from microcheckpoint.config import CheckpointConfig
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.sinks.files import FileSink

    keys = (s3.access_key, s3.secret_key, s3.region)
    with S3FaultProxy(s3.url, credentials=keys) as proxy:
        port = proxy.url.rsplit(":", 1)[1]
        driver = _options(s3, f"http://{DRIVER_HOST}:{port}")
        executors = _options(s3, proxy.url)
        # Step 1: a topic and a pipeline of their own.
        name = f"budget-{partitions}x{parallelism}-{uuid.uuid4().hex[:6]}"
        pipeline = build(topic=name, name=name)
        pipeline.then(FileSink("word-totals", f"s3://{bucket}/output", store_options=driver))
        store = S3Store(make_client(**driver), bucket, "checkpoints")
        config = CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url})
        lines = lines_for(LINES_PER_EPOCH * epochs, seed=partitions * 100 + parallelism)
        found = []
        for epoch in range(epochs):
            # Step 2: one epoch's input, one cycle, its requests.
            batch = lines[epoch * LINES_PER_EPOCH : (epoch + 1) * LINES_PER_EPOCH]
            produce(bootstrap, name, batch, partitions, create=epoch == 0)
            first, began = len(proxy.log), time.monotonic()
            result = run_cycle(
                spark,
                pipeline,
                config,
                store,
                bootstrap=bootstrap,
                parallelism=parallelism,
                store_options=executors,
            )
            seconds = time.monotonic() - began
            records = tuple(proxy.log[first:])
            cid = result.checkpoint_id.value
            found.append(EpochRequests(partitions, parallelism, cid, records, seconds))
    return found


def run(epochs: int, configs: list[tuple[int, int]] = CONFIGS) -> list[list[EpochRequests]]:
    """Start SeaweedFS and Tansu (``harness.services.local_stack``) and Spark; the requests
    of every epoch of every configuration (the last epoch is the one counted)."""
    from harness import services
    from microcheckpoint.adapters.s3 import ensure_bucket, make_client
    from microcheckpoint.engine.spark import local_spark

    with services.local_stack() as stack:
        s3 = stack.s3
        bucket = f"budget-{uuid.uuid4().hex[:8]}"
        ensure_bucket(make_client(s3.url, s3.region, s3.access_key, s3.secret_key), bucket)
        spark = local_spark("local[2]")
        try:
            runs = []
            for p, n in configs:
                print(f"{p} partition(s) at parallelism {n}: {epochs} epochs ...", flush=True)
                runs.append(count_epochs(spark, s3, stack.kafka_bootstrap, bucket, p, n, epochs))
            return runs
        finally:
            spark.stop()


def report(results: list[EpochRequests]) -> str:
    """The table: one row per configuration."""
    header = ["partitions", "parallelism", *KINDS, "total", "driver", "sequential", "critical"]
    rows = []
    for r in results:
        kinds = [r.kinds()[k] for k in KINDS]
        paths = [r.driver(), r.sequential(), r.critical()]
        rows.append([r.partitions, r.parallelism, *kinds, len(r.records), *paths])
    return table(rows, header)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=int, default=4, help="epochs per configuration; the last is counted"
    )
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: the counted epoch must not be the first; use >= 2")
    began = time.monotonic()
    runs = run(args.epochs)
    counted = [epochs[-1] for epochs in runs]
    print(report(counted))
    for last in counted:
        print(f"\nby purpose, {last.partitions} partitions at parallelism {last.parallelism}:")
        rows = [[p, k, n] for (p, k), n in sorted(last.purposes().items())]
        print(table(rows, ["purpose", "kind", "requests"]))
        rows = [[p, n] for p, n in sorted(last.prefixes().items())]
        print(table(rows, ["folder", "requests"]))
    seconds = time.monotonic() - began
    results = {
        "epochs": args.epochs,
        "seconds": round(seconds, 1),
        "results": [r.summary() for r in counted],
        "every_epoch": [
            {
                "partitions": e.partitions,
                "parallelism": e.parallelism,
                "checkpoint_id": e.checkpoint_id,
            }
            | {k: e.kinds()[k] for k in KINDS}
            for epochs in runs
            for e in epochs
        ],
    }
    path = write_results("s3_requests", results)
    print(f"\n{seconds:.0f} s in all; written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
