"""Where a 100k-record epoch's time goes: the driver's steps and the Spark job's parts.

Runs the ``100k`` epochs of ``bench_engine`` (100,000 records over 10,000 keys, a keyed count,
checkpoints on local disk, ``local[2]``) from Parquet files and from Kafka (JSON values on
Tansu, started here), alternating, and times each step of ``run_cycle`` as it runs:
``start_epoch`` (recovery, the trigger: for Kafka, the end offsets), ``plan``, the source's
frame (for Kafka, the driver's check of the ranges), the keyed stage's planning (its Arrow
functions pickled and registered), the Spark job (what is left of ``run_epoch``),
``complete`` and ``notify``. Then, in the same session, the Spark job's parts on the same
records: an empty job, the source read alone, the read and ``groupBy(key).count()``; and
one keyed subtask's Python (a built-in merge and a user's function) in this process.

Prints a table of medians. Run: ``.venv/bin/python -m bench.epoch_breakdown [--rounds N]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench import bench_engine as be
from bench._common import table

RECORDS, KEYS = be.WORKLOADS["100k"][:2]


class Steps:
    """Wraps named functions of modules (and methods) to add up their time per epoch."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, label: str | None = None) -> None:
        original = getattr(owner, name)
        label = label or name

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)


def epochs(spark: Any, rounds: int, bootstrap: str, root: Path) -> dict[str, dict[str, float]]:
    """Median seconds of each step, for the file and the Kafka epochs."""
    import microcheckpoint.engine.cycle as cycle
    import microcheckpoint.engine.runner as runner
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine import KafkaSource
    from microcheckpoint.protocol.coordinator import CheckpointCoordinator

    steps = Steps()
    for owner, name, label in (
        (cycle, "start_epoch", "trigger (start_epoch)"),
        (CheckpointCoordinator, "plan", "plan"),
        (runner, "_source", "source frame (Kafka: check ranges)"),
        (runner, "_keyed", "keyed stage planning"),
        (cycle, "run_epoch", "run_epoch"),
        (CheckpointCoordinator, "complete", "complete (global ack)"),
        (CheckpointCoordinator, "notify", "notify"),
    ):
        steps.wrap(owner, name, label)
    topic = "breakdown"
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, be.PARALLELISM)
    send = be.json_producer(bootstrap)
    folder = be.Folder(root)
    source = KafkaSource(
        "kafka", [topic], value_format="json", schema={"key": "string", "seq": "long"}
    )
    systems = {
        "file": be.Engine(spark, folder, root, "bd-file"),
        "kafka": be.Engine(spark, folder, root, "bd-kafka", source=source, bootstrap=bootstrap),
    }
    found: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for round_no in range(rounds + 1):
        keys = be.keys_for(round_no, RECORDS, KEYS, 0)
        send(topic, keys)
        folder.write(keys)
        order = list(systems.items())
        for name, system in order if round_no % 2 else reversed(order):
            steps.seconds.clear()
            took = be.timed(system.epoch)
            if round_no:
                got = dict(steps.seconds)
                job = got.pop("run_epoch") - got["source frame (Kafka: check ranges)"]
                got["Spark job"] = job - got["keyed stage planning"]
                got["epoch"] = took
                found[name].append(got)
    for name, system in systems.items():
        if system.state() != dict(folder.truth):
            raise SystemExit(f"the {name} pipeline's state is wrong")
    return {
        name: {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
        for name, rows in found.items()
    }


def job_parts(spark: Any, rounds: int, bootstrap: str, root: Path) -> dict[str, float]:
    """Median seconds of parts of the Spark job on the same 100k records."""
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine import KafkaSource
    from microcheckpoint.engine.runner import RangeChecks, _kafka_frame
    from microcheckpoint.faults import Faults
    from microcheckpoint.protocol.barrier import Barrier, OffsetRange

    topic = "breakdown-parts"
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, be.PARALLELISM)
        send = be.json_producer(bootstrap)
        folder = be.Folder(root / "parts")
        keys = be.keys_for(99, RECORDS, KEYS, 0)
        send(topic, keys)
        folder.write(keys)
        ends = kafka.end_offsets(kafka.partitions(topic))
    plan = SimpleNamespace(
        barrier=Barrier({tp: OffsetRange(0, end) for tp, end in ends.items()}), files={}
    )
    source = KafkaSource(
        "kafka", [topic], value_format="json", schema={"key": "string", "seq": "long"}
    )

    def kafka_frame() -> Any:
        checks = RangeChecks()  # the ranges checked before the job, as an epoch does
        frame = _kafka_frame(spark, source, plan, bootstrap, Faults(), checks, ("key",))
        checks.passed()
        return frame

    parts: dict[str, Callable[[], Any]] = {
        "an empty Spark job (2 tasks)": lambda: spark.range(0, 2, 1, 2).count(),
        "Parquet read + groupBy(key).count()": lambda: (
            spark.read.parquet(str(folder.path)).groupBy("key").count().collect()
        ),
        "Kafka read (2 splits, JSON decoded)": lambda: kafka_frame().count(),
        "Kafka read + groupBy(key).count()": lambda: kafka_frame().groupBy("key").count().collect(),
    }
    seconds: dict[str, list[float]] = {name: [] for name in parts}
    for round_no in range(2 * rounds + 1):
        order = list(parts.items())
        for name, part in order if round_no % 2 else reversed(order):
            took = be.timed(part)
            if round_no:
                seconds[name].append(took)
    return {name: round(statistics.median(v), 3) for name, v in seconds.items()}


def subtask_python(rounds: int, root: Path) -> dict[str, float]:
    """One keyed subtask's Python on half the epoch (50k rows, its share at parallelism 2):
    the built-in merge (one aggregated row per key) and a user's function (every row)."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.compute as pc

    from microcheckpoint.engine.keyed import (
        AGGREGATE,
        OperatorContext,
        merge_aggregate,
        process_subtask,
    )
    from microcheckpoint.engine.routing import route
    from microcheckpoint.storage import FileStore

    rng = random.Random(7)
    n = RECORDS // be.PARALLELISM
    keys = [f"k{rng.randrange(KEYS)}" for _ in range(n)]
    rows = pa.table(
        {
            "key": keys,
            "seq": pa.array(range(n), pa.int64()),
            "source_file": ["part-00001.parquet"] * n,
            "source_row": pa.array(range(n), pa.int64()),
        }
    )
    counts = rows.group_by("key").aggregate([("seq", "count")])
    counts = counts.rename_columns(["key", AGGREGATE]).select(["key", AGGREGATE])
    counts = counts.set_column(1, AGGREGATE, pc.cast(counts.column(AGGREGATE), pa.int64()))

    def routed(t: pa.Table) -> pa.Table:
        return pa.Table.from_batches(list(route(iter(t.to_batches()), "key", 128, 1)))

    store = FileStore((root / "subtask").as_uri())
    base = OperatorContext(
        store_url=store.url, store_options={}, pipeline="p", checkpoint_id=1, attempt=1,
        uid="counts", key="key", max_parallelism=128, parallelism=1, backend="table",
        trigger_time_ms=0, output_schema=pa.schema([("key", pa.string()), ("total", pa.int64())]),
    )  # fmt: skip
    tables = {"merge": routed(counts), "udf": routed(rows)}
    seconds: dict[str, list[float]] = {"merge": [], "udf": []}
    for round_no in range(rounds + 1):
        for name in seconds:
            ctx = dataclasses.replace(
                base,
                uid=f"counts-{name}",
                checkpoint_id=round_no + 1,
                aggregate="count" if name == "merge" else None,
            )
            start = time.perf_counter()
            if name == "merge":
                merge_aggregate(ctx, 0, tables[name])
            else:
                process_subtask(ctx, be.count_rows, 0, tables[name])
            if round_no:
                seconds[name].append(time.perf_counter() - start)
    return {
        "built-in merge, 50k rows -> 1 row per key": round(statistics.median(seconds["merge"]), 3),
        "user's function, 50k rows": round(statistics.median(seconds["udf"]), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    from harness.services import start_tansu

    root = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    tansu = start_tansu(root)
    spark = be.session()
    try:
        steps = epochs(spark, args.rounds, tansu.address, root)
        parts = job_parts(spark, args.rounds, tansu.address, root)
    finally:
        spark.stop()
        tansu.stop()
    python = subtask_python(args.rounds, root)
    labels = list(steps["file"])
    print(table([[k, steps["file"][k], steps["kafka"][k]] for k in labels],
                ["step of a 100k epoch (median s)", "file", "kafka"]))  # fmt: skip
    print()
    print(table([[k, v] for k, v in parts.items()], ["part of the Spark job", "median s"]))
    print()
    print(table([[k, v] for k, v in python.items()], ["one subtask's Python", "median s"]))
    print(json.dumps({"steps": steps, "job_parts": parts, "subtask_python": python}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
