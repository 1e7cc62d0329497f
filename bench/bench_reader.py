"""The Kafka source against a bare kafka-python consumer loop, on the same records.

Starts Tansu (the local broker) with ``harness.services``, produces ``--records`` JSON
records of ``--size`` bytes round-robin to a topic of ``--partitions`` partitions, then
alternates:

- **bare**: ``--partitions`` reader processes (started before the clock), each a
  ``KafkaConsumer`` assigned one partition, polling from offset 0 to its end and counting;
- **bare_confluent**: the same loop with confluent-kafka (librdkafka), the client our source
  reads with, so the cost of Spark and Arrow on top of the client shows too;
- **ours**: the engine's Kafka source (``KafkaSplitReader`` in ``mapInArrow``, its default
  split size) over the same ranges in Spark ``local[N]`` with N = ``--partitions`` (as many
  readers), counting the rows Spark receives as Arrow batches;
- **bare_confluent_json** and **ours_json**: the same two with the values decoded, the bare
  loop calling ``json.loads`` per value, ours a ``value_format="json"`` source with the
  values' schema (``key string, seq long, pad string``), counting rows with ``seq`` set.

Prints medians and the ratios (bare seconds ÷ ours: 1.0 means as fast as the bare loop;
``ratio`` is against kafka-python, the issue's baseline, ``ratio_vs_confluent`` against the
same client) and ``json_vs_confluent`` (ours ÷ bare with decoding, lower is better: issue
28's ``reader_vs_confluent_json``); ``run`` returns them for ``bench.run_all``.
Run: ``.venv/bin/python -m bench.bench_reader``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench._common import JSON_SCHEMA, produce
from harness import services


def consume_partition(bootstrap: str, topic: str, partition: int, end: int) -> int:
    """One bare reader: assign one partition, seek to 0, poll until its end; records seen."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = KTP(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen = 0
        while consumer.position(tp) < end:
            for batch in consumer.poll(timeout_ms=100).values():
                seen += len(batch)
        return seen
    finally:
        consumer.close(autocommit=False)


def consume_partition_confluent(
    bootstrap: str, topic: str, partition: int, end: int, decode: bool = False
) -> int:
    """The bare loop with confluent-kafka: assign one partition at 0, consume to its end;
    with ``decode``, ``json.loads`` of each value too (the rows a JSON source gives)."""
    import json

    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        consumer.assign([CTP(topic, partition, 0)])
        seen, last = 0, -1
        while last < end - 1:
            for message in consumer.consume(num_messages=10_000, timeout=0.1):
                if message.error() is None:
                    if decode:
                        json.loads(message.value())
                    seen, last = seen + 1, message.offset()
        return seen
    finally:
        consumer.close()


def _warm(_: int) -> int:
    import confluent_kafka  # noqa: F401  (the imports are part of the start, not the reading)
    import kafka  # noqa: F401

    return 0


def run(records: int, size: int, partitions: int, rounds: int) -> dict[str, Any]:
    """Both readers, alternating, ``rounds`` times after a warm-up; medians and the ratio."""
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine.api import KafkaSource
    from microcheckpoint.engine.runner import RangeChecks, _kafka_frame
    from microcheckpoint.engine.spark import local_spark
    from microcheckpoint.faults import Faults
    from microcheckpoint.protocol.barrier import Barrier, OffsetRange

    tansu = services.start_tansu(Path(tempfile.mkdtemp(prefix="bench-reader-")))
    spark = local_spark(f"local[{partitions}]", app="bench-reader")
    pool = multiprocessing.get_context("spawn").Pool(partitions)
    try:
        bootstrap, topic = tansu.address, "bench-reader"
        produce(bootstrap, topic, partitions, records, size)
        with KafkaOffsets(bootstrap) as kafka:
            ends = kafka.end_offsets(kafka.partitions(topic))
        if sum(ends.values()) != records:
            raise SystemExit(f"end offsets {ends} do not add up to {records}")
        pool.map(_warm, range(partitions))
        barrier = Barrier({tp: OffsetRange(0, end) for tp, end in ends.items()})
        plan = SimpleNamespace(barrier=barrier, files={})
        source = KafkaSource("bench-source", [topic], value_format="bytes")
        decoding = KafkaSource("bench-json", [topic], value_format="json", schema=JSON_SCHEMA)

        def bare() -> int:
            jobs = [(bootstrap, tp.topic, tp.partition, end) for tp, end in ends.items()]
            return sum(pool.starmap(consume_partition, jobs))

        def bare_confluent() -> int:
            jobs = [(bootstrap, tp.topic, tp.partition, end) for tp, end in ends.items()]
            return sum(pool.starmap(consume_partition_confluent, jobs))

        def bare_confluent_json() -> int:
            jobs = [(bootstrap, tp.topic, tp.partition, end, True) for tp, end in ends.items()]
            return sum(pool.starmap(consume_partition_confluent, jobs))

        def checked(kafka: KafkaSource) -> Any:
            checks = RangeChecks()  # the ranges checked before the job, as an epoch does
            frame = _kafka_frame(spark, kafka, plan, bootstrap, Faults(), checks)
            checks.passed()
            return frame

        def ours() -> int:
            return checked(source).count()

        def ours_json() -> int:
            # every column decoded: the count of a frame with all of them
            frame = checked(decoding)
            return frame.where(frame["seq"].isNotNull()).count()

        order = [
            ("bare_kafka_python", bare),
            ("ours", ours),
            ("bare_confluent", bare_confluent),
            ("ours_json", ours_json),
            ("bare_confluent_json", bare_confluent_json),
        ]
        seconds: dict[str, list[float]] = {name: [] for name, _ in order}
        for round_no in range(rounds + 1):
            for name, read in order if round_no % 2 else reversed(order):
                start = time.perf_counter()
                seen = read()
                took = time.perf_counter() - start
                if seen != records:
                    raise SystemExit(f"{name} read {seen} records, expected {records}")
                if round_no:
                    seconds[name].append(took)
    finally:
        pool.terminate()
        spark.stop()
        tansu.stop()
    median = {k: round(statistics.median(v), 3) for k, v in seconds.items()}
    return {
        "records": records,
        "record_bytes": size,
        "readers": partitions,
        "rounds": rounds,
        "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
        "median": median,
        "records_per_s": {k: round(records / v) for k, v in median.items()},
        "ratio": round(median["bare_kafka_python"] / median["ours"], 3),
        "ratio_vs_confluent": round(median["bare_confluent"] / median["ours"], 3),
        # the other way round (ours ÷ bare, lower is better), as issue 28 states its target
        "json_vs_confluent": round(median["ours_json"] / median["bare_confluent_json"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.records, args.size, args.partitions, args.rounds)
    print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
