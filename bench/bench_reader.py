"""How fast the source reads Kafka, against a bare kafka-python consumer on the same records.

Starts Tansu (memory storage) via ``harness.services``, produces ``--records`` records of
``--size`` bytes to a 1-partition topic and a 4-partition topic, then per topic measures:

(a) a bare kafka-python consumer: assign every partition, seek to 0, poll until every
    position reaches its end offset;
(b) ``read_split`` over ``split_ranges(barrier, max_records_per_split)``, sequentially in
    this process;
(c) the same splits through Spark ``local[2]``:
    ``sc.parallelize(splits).flatMap(read_split).count()`` (as ``run_epoch`` reads);
(d) as (c) but with the runner's own row building and a DataFrame count (value_format
    ``bytes``), i.e. what an epoch of a real pipeline pays before its first stage.

Prints records/s and the ratios to (a); writes ``bench/results/bench_reader.json``.
Run: ``.venv/bin/python -m bench.bench_reader``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import produce, table, write_results
from harness import services
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.kafka_reader import read_split, split_ranges
from microcheckpoint.protocol.barrier import Barrier, OffsetRange


def bare_consumer(bootstrap: str, ends: dict[Any, int]) -> int:
    """(a): one KafkaConsumer over every partition from 0 to its end; returns records seen."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = {KTP(tp.topic, tp.partition): end for tp, end in ends.items()}
        consumer.assign(list(parts))
        for ktp in parts:
            consumer.seek(ktp, 0)
        seen = 0
        while any(consumer.position(k) < end for k, end in parts.items()):
            for batch in consumer.poll(timeout_ms=100).values():
                seen += len(batch)
        return seen
    finally:
        consumer.close(autocommit=False)


def sequential_splits(bootstrap: str, splits: list) -> int:
    """(b): every split read with ``read_split``, one after another."""
    return sum(sum(1 for _ in read_split(bootstrap, s)) for s in splits)


def spark_splits(spark: Any, bootstrap: str, splits: list) -> int:
    """(c): the splits read in Spark tasks, one task per split."""
    rdd = spark.sparkContext.parallelize(splits, len(splits))
    return rdd.flatMap(lambda s: read_split(bootstrap, s)).count()


def spark_rows(spark: Any, bootstrap: str, splits: list) -> int:
    """(d): the runner's row building (private ``_source_rows``) and a DataFrame count."""
    from microcheckpoint.engine.api import KafkaSource
    from microcheckpoint.engine.runner import _source_rows, source_schema

    source = KafkaSource("bench-source", [splits[0].tp.topic], value_format="bytes")
    rdd = spark.sparkContext.parallelize(splits, len(splits))
    rows = rdd.flatMap(_source_rows(bootstrap, source, None, 0))
    return spark.createDataFrame(rows, source_schema(source)).count()


def timed(fn, *args) -> tuple[int, float]:
    start = time.perf_counter()
    n = fn(*args)
    return n, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-records-per-split", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs per method; best is kept")
    args = parser.parse_args(argv)

    from microcheckpoint.engine.spark import local_spark

    log_dir = Path(tempfile.mkdtemp(prefix="bench-reader-"))
    tansu = services.start_tansu(log_dir)
    spark = local_spark("local[2]")
    runs: list[dict[str, Any]] = []
    try:
        bootstrap = tansu.address
        spark.sparkContext.parallelize(range(4), 2).count()  # warm up the JVM and workers
        for partitions in args.partitions:
            topic = f"bench-{partitions}p"
            start = time.perf_counter()
            produce(bootstrap, topic, partitions, args.records, args.size)
            produce_s = time.perf_counter() - start
            with KafkaOffsets(bootstrap) as kafka:
                ends = kafka.end_offsets(kafka.partitions(topic))
            total = sum(ends.values())
            assert total == args.records, f"end offsets {ends} do not add up to {args.records}"
            barrier = Barrier({tp: OffsetRange(0, end) for tp, end in ends.items()})
            splits = split_ranges(barrier, args.max_records_per_split)
            methods = {
                "a_bare_consumer": lambda ends=ends: bare_consumer(bootstrap, ends),
                "b_read_split_sequential": lambda splits=splits: sequential_splits(
                    bootstrap, splits
                ),
                "c_spark_read_split": lambda splits=splits: spark_splits(spark, bootstrap, splits),
                "d_spark_source_rows_df": lambda splits=splits: spark_rows(
                    spark, bootstrap, splits
                ),
            }
            result: dict[str, Any] = {
                "partitions": partitions,
                "records": total,
                "record_bytes": args.size,
                "splits": len(splits),
                "produce_records_per_s": round(total / produce_s),
                "methods": {},
            }
            for name, method in methods.items():
                seconds = []
                for _ in range(args.repeat):
                    n, s = timed(method)
                    assert n == total, f"{name} read {n} records, expected {total}"
                    seconds.append(s)
                result["methods"][name] = {
                    "seconds": [round(s, 3) for s in seconds],
                    "records_per_s": round(total / min(seconds)),
                }
            base = result["methods"]["a_bare_consumer"]["records_per_s"]
            for m in result["methods"].values():
                m["ratio_to_a"] = round(m["records_per_s"] / base, 3)
            runs.append(result)
    finally:
        spark.stop()
        tansu.stop()

    path = write_results("bench_reader", {"runs": runs})
    rows = [
        [r["partitions"], r["splits"], name, m["records_per_s"], m["ratio_to_a"]]
        for r in runs
        for name, m in r["methods"].items()
    ]
    print(
        f"{args.records:,} records of {args.size} bytes, Tansu memory storage, best of {args.repeat}"
    )
    print(table(rows, ["partitions", "splits", "method", "records/s", "vs (a)"]))
    print(
        "produce records/s: "
        + ", ".join(f"{r['partitions']}p {r['produce_records_per_s']:,}" for r in runs)
    )
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
