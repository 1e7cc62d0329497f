"""The engine against Spark Structured Streaming, on the same Parquet files, in one warm session.

Workloads (a keyed count merged into state, ``groupBy(key).count()``):

- ``100k``: epochs of 100,000 records over 10,000 keys;
- ``1m``: epochs of 1,000,000 records over 10,000 keys;
- ``1m_keys``: a state of 1,000,000 keys (primed by one untimed epoch), then epochs of
  100,000 records touching 10,000 of them (1%);
- ``udf_100k``: the ``100k`` epochs twice in this engine, alternating: the built-in
  ``running_sum`` (a Spark SQL aggregate merged with the state) against the same count as
  a user's ``KeyedOperator(fn=...)`` (Python per key): ``ratios.udf_vs_builtin_100k``;
- ``kafka_100k``: the ``100k`` epochs read from Kafka (JSON values on Tansu, started here)
  against the same records read from Parquet files: ``ratios.kafka_vs_file_100k``;
- ``empty``: an epoch with no new file;
- ``s3_empty``: the same with the engine's checkpoints on S3 (SeaweedFS, started here): the
  protocol's requests are all an empty epoch does (``seconds.s3_empty_epoch``).

Spark Structured Streaming (SS) runs ``readStream.parquet(folder).groupBy("key").count()``
with ``Trigger.AvailableNow``, the RocksDB state store with changelog checkpointing and a
checkpoint location on local disk, output mode ``update`` into the ``noop`` sink: one query
start per epoch, as a scheduled batch job runs it. The engine runs ``run_cycle`` of a
``FileSource`` + ``running_sum`` pipeline (storage on local disk). Both read the same
folder and the same session (``local[2]``, 2 shuffle partitions / 2 subtasks).

Each round writes one new file, then runs both systems on it, alternating which goes first
(A B, B A, ...); the figures are medians over the rounds, after one untimed warm-up round.
Before the first workload both systems run ``WARM_UP_ROUNDS`` rounds of the ``100k`` epochs
untimed (``warm_up``): in a new session the JVM is still compiling the hot paths, and the
first workload measured there ran 1.4-1.6 times slower for both than the same workload
measured again later in that session. The engine's state is checked against the input's true
counts at the end of each workload.

``--memory`` instead runs each system alone in a fresh process (the ``1m`` workload) and
samples the resident memory of its driver, JVM and Python workers (peak of each, and of
their sum).

Run: ``.venv/bin/python -m bench.bench_engine`` (``make bench`` runs every benchmark).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PARALLELISM = 2

# name: (records per epoch, keys drawn from, keys primed before the timed epochs)
WORKLOADS = {
    "100k": (100_000, 10_000, 0),
    "1m": (1_000_000, 10_000, 0),
    "1m_keys": (100_000, 10_000, 1_000_000),
}


def session() -> Any:
    """The warm session both systems share."""
    from microcheckpoint.engine.spark import local_spark

    spark = local_spark("local[2]", app="bench-engine", shuffle_partitions=PARALLELISM)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    return spark


class Folder:
    """The input folder: one Parquet file of ``key string, seq long`` per round."""

    def __init__(self, root: Path) -> None:
        self.path = root / "input"
        self.path.mkdir(parents=True)
        self.truth: Counter[str] = Counter()
        self.files = 0

    def write(self, keys: list[str]) -> None:
        self.truth.update(keys)
        table = pa.table({"key": keys, "seq": pa.array(range(len(keys)), pa.int64())})
        pq.write_table(table, self.path / f"part-{self.files:05d}.parquet")
        self.files += 1


def keys_for(round_no: int, records: int, key_space: int, primed: int) -> list[str]:
    """``records`` keys of one round: uniform over ``key_space`` keys, which for a primed
    workload are a random 1% subset of the primed keys."""
    rng = random.Random(round_no)
    if primed:
        space = rng.sample(range(primed), key_space)
        return [f"k{space[rng.randrange(key_space)]}" for _ in range(records)]
    return [f"k{rng.randrange(key_space)}" for _ in range(records)]


class StructuredStreaming:
    """Spark Structured Streaming's keyed count over the folder, one AvailableNow run each."""

    name = "spark_ss"

    def __init__(self, spark: Any, folder: Folder, root: Path) -> None:
        self.spark, self.folder, self.checkpoint = spark, folder, root / "ss-checkpoint"

    def epoch(self) -> None:
        query = (
            self.spark.readStream.schema("key string, seq long")
            .parquet(str(self.folder.path))
            .groupBy("key")
            .count()
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()


class Engine:
    """This engine: a file source and ``running_sum`` (a count), one ``run_cycle`` each."""

    name = "ours"

    def __init__(
        self,
        spark: Any,
        folder: Folder,
        root: Path,
        name: str,
        store: Any = None,
        store_options: dict[str, Any] | None = None,
        user_fn: bool = False,
        source: Any = None,
        bootstrap: str = "",
    ) -> None:
        from microcheckpoint.config import CheckpointConfig
        from microcheckpoint.engine import FileSource, KeyedOperator, Pipeline, running_sum
        from microcheckpoint.storage import FileStore

        self.spark, self.bootstrap = spark, bootstrap
        self.store = store or FileStore((root / f"checkpoints-{name}").as_uri())
        self.store_options = store_options
        counts = running_sum("counts", key="key")
        if user_fn:
            # The same count as a user writes it: the function, no Spark SQL aggregate.
            counts = KeyedOperator("counts", "key", count_rows, "key string, total long")
        source = source or FileSource("files", folder.path.as_uri())
        self.pipeline = Pipeline(name, source).then(counts)
        self.config = CheckpointConfig.from_mapping({"pipeline": name, "storage": self.store.url})

    def epoch(self) -> None:
        from microcheckpoint.engine.cycle import run_cycle

        run_cycle(
            self.spark,
            self.pipeline,
            self.config,
            self.store,
            bootstrap=self.bootstrap,
            parallelism=PARALLELISM,
            store_options=self.store_options,
        )

    def state(self) -> dict[str, int]:
        from microcheckpoint.state.reader import read_keyed_state

        return read_keyed_state(self.store, self.pipeline.name, "counts")


def count_rows(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict], Any]:
    """A user's keyed function: the key's running count."""
    total = (state or 0) + len(rows)
    return [{"key": key, "total": total}], total


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(systems: list[Any], rounds: int, before: Callable[[int], None]) -> dict[str, list]:
    """``rounds`` timed rounds (after one warm-up round): ``before(round)``, then every system
    once, the order reversed every round."""
    seconds: dict[str, list[float]] = {s.name: [] for s in systems}
    for round_no in range(rounds + 1):
        before(round_no)
        order = systems if round_no % 2 else list(reversed(systems))
        for system in order:
            took = timed(system.epoch)
            if round_no:
                seconds[system.name].append(took)
    return seconds


def workload(spark: Any, name: str, rounds: int) -> dict[str, Any]:
    """One workload: both systems on the same new file each round; medians and the check."""
    records, key_space, primed = WORKLOADS[name]
    root = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        folder = Folder(root)
        ss, ours = StructuredStreaming(spark, folder, root), Engine(spark, folder, root, name)
        prime_s = {}
        if primed:
            folder.write([f"k{i}" for i in range(primed)])
            prime_s = {s.name: round(timed(s.epoch), 3) for s in (ss, ours)}
        base = 1_000 * (primed > 0)
        seconds = alternate(
            [ss, ours],
            rounds,
            lambda r: folder.write(keys_for(base + r, records, key_space, primed)),
        )
        state = ours.state()
        if state != dict(folder.truth):
            wrong = {k for k in folder.truth if state.get(k) != folder.truth[k]}
            raise SystemExit(f"{name}: the engine's state differs on {len(wrong)} keys")
        return {
            "records": records,
            "keys": key_space,
            "primed_keys": primed,
            "rounds": rounds,
            "prime_seconds": prime_s,
            "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
            "median": {k: round(statistics.median(v), 3) for k, v in seconds.items()},
            "state_keys_checked": len(state),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def udf_workload(spark: Any, rounds: int) -> dict[str, Any]:
    """The ``100k`` epochs through the built-in count and through a user's function, both
    checked against the input's true counts."""
    records, key_space, _ = WORKLOADS["100k"]
    root = Path(tempfile.mkdtemp(prefix="bench-udf-"))
    try:
        folder = Folder(root)
        builtin = Engine(spark, folder, root, "builtin")
        user = Engine(spark, folder, root, "udf", user_fn=True)
        builtin.name, user.name = "builtin", "udf"
        seconds = alternate(
            [builtin, user], rounds, lambda r: folder.write(keys_for(r, records, key_space, 0))
        )
        return checked_pair("udf_100k", builtin, user, seconds, folder, rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def checked_pair(
    workload: str,
    base: Engine,
    other: Engine,
    seconds: dict[str, list],
    folder: Folder,
    rounds: int,
) -> dict[str, Any]:
    """The result of two engines run alternately on ``folder``'s records: both states checked
    against the true counts, the medians and ``other``'s ÷ ``base``'s."""
    for system in (base, other):
        if system.state() != dict(folder.truth):
            raise SystemExit(f"{workload}: the {system.name} pipeline's state is wrong")
    records, key_space, _ = WORKLOADS["100k"]
    median = {k: round(statistics.median(v), 3) for k, v in seconds.items()}
    return {
        "records": records,
        "keys": key_space,
        "rounds": rounds,
        "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
        "median": median,
        "ratio": round(median[other.name] / median[base.name], 3),
    }


def json_producer(bootstrap: str) -> Callable[[str, list[str]], None]:
    """``send(topic, keys)``: ``{"key": k, "seq": i}`` for the ``i``-th key, round-robin over
    ``PARALLELISM`` partitions, all delivered when it returns."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})

    def send(topic: str, keys: list[str]) -> None:
        for seq, key in enumerate(keys):
            value = json.dumps({"key": key, "seq": seq}).encode()
            while True:
                try:
                    producer.produce(topic, value, partition=seq % PARALLELISM)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(60):
            raise SystemExit(f"records to {topic} not delivered in 60 s")

    return send


def kafka_workload(spark: Any, rounds: int) -> dict[str, Any]:
    """The ``100k`` epochs read from Kafka (JSON values, ``{"key": ..., "seq": ...}``, two
    partitions on Tansu, started here) against the same records read from Parquet files,
    both into the built-in count: ``ratios.kafka_vs_file_100k``. Each round produces the
    records to the topic and writes them to a file before the clock; both states are checked
    against the input's true counts."""
    from harness.services import start_tansu
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine import KafkaSource

    records, key_space, _ = WORKLOADS["100k"]
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    tansu = start_tansu(root)
    try:
        topic = "bench-kafka"
        with KafkaOffsets(tansu.address) as kafka:
            kafka.create_topic(topic, PARALLELISM)
        send = json_producer(tansu.address)
        folder = Folder(root)
        source = KafkaSource(
            "kafka", [topic], value_format="json", schema={"key": "string", "seq": "long"}
        )
        file = Engine(spark, folder, root, "from-files")
        kafka = Engine(spark, folder, root, "from-kafka", source=source, bootstrap=tansu.address)
        file.name, kafka.name = "file", "kafka"

        def before(round_no: int) -> None:
            keys = keys_for(round_no, records, key_space, 0)
            send(topic, keys)
            folder.write(keys)

        seconds = alternate([file, kafka], rounds, before)
        return checked_pair("kafka_100k", file, kafka, seconds, folder, rounds)
    finally:
        tansu.stop()
        shutil.rmtree(root, ignore_errors=True)


def empty_epochs(spark: Any, rounds: int) -> dict[str, Any]:
    """Epochs with nothing new, after one file was read."""
    root = Path(tempfile.mkdtemp(prefix="bench-empty-"))
    try:
        folder = Folder(root)
        folder.write(keys_for(0, 1_000, 100, 0))
        systems = [StructuredStreaming(spark, folder, root), Engine(spark, folder, root, "empty")]
        for system in systems:
            system.epoch()
        seconds = alternate(systems, rounds, lambda r: None)
        return {"median": {k: round(statistics.median(v), 3) for k, v in seconds.items()}}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def s3_empty_epochs(spark: Any, epochs: int) -> dict[str, Any]:
    """Empty epochs of the engine with its checkpoints on SeaweedFS (``make demo``'s S3
    server, on loopback), after one file was read and a few untimed empty ones."""
    from harness.services import start_seaweedfs
    from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client

    root = Path(tempfile.mkdtemp(prefix="bench-s3-empty-"))
    service, s3 = start_seaweedfs(root)
    try:
        client = make_client(s3.url, s3.region, s3.access_key, s3.secret_key)
        ensure_bucket(client, "bench-empty")
        options = s3.store_options()
        folder = Folder(root)
        folder.write(keys_for(0, 1_000, 100, 0))
        store = S3Store(client, "bench-empty", "checkpoints")
        engine = Engine(spark, folder, root, "s3-empty", store, options)
        for _ in range(4):
            engine.epoch()
        seconds = [timed(engine.epoch) for _ in range(epochs)]
        return {"epochs": epochs, "seconds": [round(x, 3) for x in seconds],
                "median": round(statistics.median(seconds), 3)}  # fmt: skip
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- memory ---------------------------------------------------------------------------------


def _kind(proc: Any, driver: int) -> str:
    if proc.pid == driver:
        return "driver"
    try:
        return "jvm" if "java" in proc.name() else "workers"
    except Exception:
        return "workers"


class PeakMemory:
    """Samples the memory of this process and its descendants every 50 ms: resident (RSS)
    and proportional (PSS, Linux: a page shared by k processes counts 1/k in each).

    Summed over processes, RSS counts shared pages once per process: the Python workers
    forked by ``pyspark.daemon`` share the pages of pyarrow's libraries. PSS sums to what
    the machine spends; both are reported.
    """

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        kinds = ("driver", "jvm", "workers", "total")
        self.peak = {"rss": dict.fromkeys(kinds, 0), "pss": dict.fromkeys(kinds, 0)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = {m: {"driver": 0, "jvm": 0, "workers": 0} for m in self.peak}
            for proc in [self.me, *self.me.children(recursive=True)]:
                try:
                    info = proc.memory_full_info()
                    kind = _kind(proc, self.me.pid)
                except Exception:
                    continue  # the process ended while sampled
                now["rss"][kind] += info.rss
                now["pss"][kind] += getattr(info, "pss", info.rss)
            for measure, sample in now.items():
                sample["total"] = sum(sample.values())
                for key, value in sample.items():
                    self.peak[measure][key] = max(self.peak[measure][key], value)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def megabytes(self) -> dict[str, dict[str, int]]:
        return {m: {k: round(v / 2**20) for k, v in p.items()} for m, p in self.peak.items()}


def memory_of(system: str, epochs: int) -> dict[str, dict[str, int]]:
    """Peak memory of one system alone in this process: the ``1m`` workload."""
    records, key_space, _ = WORKLOADS["1m"]
    root = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        with PeakMemory() as peak:
            spark = session()
            folder = Folder(root)
            runner = (
                StructuredStreaming(spark, folder, root)
                if system == "spark_ss"
                else Engine(spark, folder, root, "memory")
            )
            for epoch in range(epochs):
                folder.write(keys_for(epoch, records, key_space, 0))
                runner.epoch()
        return peak.megabytes()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def memory(rounds: int, epochs: int) -> dict[str, Any]:
    """Each system in a fresh process, alternating; the median of each peak."""
    peaks: dict[str, list[dict[str, dict[str, int]]]] = {"spark_ss": [], "ours": []}
    for round_no in range(rounds):
        order = ["spark_ss", "ours"] if round_no % 2 == 0 else ["ours", "spark_ss"]
        for system in order:
            out = subprocess.run(
                [sys.executable, "-m", "bench.bench_engine", "--memory-of", system],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            peaks[system].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        measure: {
            system: {
                k: round(statistics.median(p[measure][k] for p in runs)) for k in runs[0][measure]
            }
            for system, runs in peaks.items()
        }
        for measure in ("rss", "pss")
    }


# The measurements beside the workloads against SS: name -> run(spark, rounds).
EXTRAS: dict[str, Callable[[Any, int], dict[str, Any]]] = {
    "udf_100k": udf_workload,
    "kafka_100k": kafka_workload,
    "empty": empty_epochs,
    "s3_empty": lambda spark, rounds: s3_empty_epochs(spark, max(15, 3 * rounds)),
}


WARM_UP_ROUNDS = 8


def warm_up(spark: Any, rounds: int = WARM_UP_ROUNDS) -> dict[str, float]:
    """The ``100k`` workload, untimed: the JVM's compiled code settles before the timed
    workloads. Returns its medians (for the record, not for any ratio)."""
    return workload(spark, "100k", rounds)["median"] if rounds else {}


def run(
    rounds: int, memory_rounds: int, only: list[str], extras: list[str] | None = None
) -> dict[str, Any]:
    """The workloads ``only``, the ``extras`` (all by default) and (unless ``memory_rounds``
    is 0) peak memory, after ``warm_up``."""
    spark = session()
    try:
        results: dict[str, Any] = {"warm_up": warm_up(spark)}
        results.update({name: workload(spark, name, rounds) for name in only})
        for name in EXTRAS if extras is None else extras:
            results[name] = EXTRAS[name](spark, rounds)
    finally:
        spark.stop()
    if memory_rounds:
        peaks = memory(memory_rounds, epochs=2)
        results["peak_rss_mb"], results["peak_pss_mb"] = peaks["rss"], peaks["pss"]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-rounds", type=int, default=2)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--extras", nargs="*", default=list(EXTRAS), choices=EXTRAS)
    parser.add_argument("--memory-of", choices=["spark_ss", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of, epochs=2)))
        return 0
    result = run(args.rounds, args.memory_rounds, args.workloads, args.extras)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
