"""Key group schemes (state/keygroups.py) in Spark: a new operator's key groups are Spark's
hash; a built-in aggregation's subtasks run in its own shuffle's partitions and a function's
in the partitions of one repartition by the key; rescales stay exact, and an operator whose
state was grouped by blake2b keeps blake2b."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.sql import functions as F

from examples.wordcount import build
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import (
    KafkaSource,
    KeyedOperator,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    running_sum,
    value_state,
)
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.runner import EpochResult
from microcheckpoint.protocol.savepoints import (
    ClaimMode,
    choose_restore,
    list_savepoints,
    restore,
)
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.bootstrap import bootstrap_savepoint
from microcheckpoint.state.keygroups import (
    BLAKE2B,
    SCHEME_FIELD,
    SPARK_HASH,
    key_group_for,
    owned_key_groups,
    spark_hash,
    spark_key_group,
)
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

MAX_P = 128
UID = "counts"
ROOT = Path(__file__).resolve().parents[2]


def test_spark_hash_is_spark_sql_hash_for_strings_ints_and_longs(spark) -> None:
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(32, 127)] + ["å", "ß", "日", "本", "😀", "\u0000"]
    strings = ["", "a", "ab", "abc", "abcd", "abcde"]
    strings += ["".join(rng.choices(alphabet, k=rng.randrange(30))) for _ in range(300)]
    longs = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]
    longs += [rng.randrange(-(2**63), 2**63) for _ in range(200)]
    ints = [0, 1, -1, 2**31 - 1, -(2**31)] + [rng.randrange(-(2**31), 2**31) for _ in range(200)]
    for values, kind in ((strings, "string"), (longs, "long"), (ints, "int")):
        frame = spark.createDataFrame([(v,) for v in values], f"v {kind}")
        hashed = frame.select("v", F.hash("v").alias("h")).collect()
        assert len(hashed) == len(values)
        wrong = [(r.v, r.h, spark_hash(r.v, kind)) for r in hashed if r.h != spark_hash(r.v, kind)]
        assert wrong == [], kind


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _topic(bootstrap: str) -> str:
    topic = _name("kgs")
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, 2)
    return topic


def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    """Send ``values`` alternately to the topic's 2 partitions."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, value in enumerate(values):
            producer.send(topic, value=value.encode(), partition=i % 2)
        producer.flush()
    finally:
        producer.close()


def _counting(name: str, topic: str) -> Pipeline:
    """Each record's text counted per value: a built-in aggregation, uid ``UID``."""
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    return Pipeline(name, source).then(running_sum(UID, key="value"))


def _count_rows(key, rows, state):  # type: ignore[no-untyped-def]
    total = (state or 0) + len(rows)
    return [{"key": key, "total": total}], total


def _counting_fn(name: str, topic: str) -> Pipeline:
    """The same counts by a user's function (``fn(key, rows, state)``), uid ``UID``."""
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    op = KeyedOperator(UID, "value", _count_rows, "key string, total long")
    return Pipeline(name, source).then(op)


class _Recount(KeyedProcessFunction):
    """Counts each key's rows; a processing-time timer reports the count one epoch later."""

    states = (value_state("count", default=0),)

    def process(self, key, rows, ctx):  # type: ignore[no-untyped-def]
        count = ctx.state("count")
        count.update(count.value() + len(rows))
        ctx.timers.register_processing_time(ctx.processing_time + 1)
        return []

    def on_timer(self, key, timestamp, ctx):  # type: ignore[no-untyped-def]
        return [{"key": key, "total": ctx.state("count").value()}]


def _words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"w{rng.randrange(60)}" for _ in range(n)]


def _epoch(
    spark, pipeline, store, bootstrap, parallelism, collect=False
) -> tuple[EpochResult, list[list[int]]]:
    """One cycle; also, for each Spark job it ran, the task count of each of its stages."""
    group = uuid.uuid4().hex
    spark.sparkContext.setJobGroup(group, "key group scheme test")
    try:
        config = CheckpointConfig.from_mapping(
            {"pipeline": pipeline.name, "storage": store.url, "retained": 5}
        )
        result = run_cycle(
            spark,
            pipeline,
            config,
            store,
            bootstrap=bootstrap,
            parallelism=parallelism,
            collect=collect,
        )
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    jobs = sorted(tracker.getJobIdsForGroup(group))
    stages = [sorted(tracker.getJobInfo(j).stageIds) for j in jobs]
    return result, [[tracker.getStageInfo(s).numTasks for s in job] for job in stages]


def _most_stages(jobs: list[list[int]]) -> int:
    return max(len(job) for job in jobs)


def _acks(result: EpochResult) -> dict[int, Any]:
    assert result.metadata is not None
    return {t.subtask: a for t, a in result.metadata.acks.items() if t.uid.value == UID}


def _check_placement(result: EpochResult, parallelism: int, scheme: str) -> None:
    """Every subtask acked, naming ``scheme``; the files it wrote hold only key groups it
    owns, and a file it references from before (a rescale shares them) some of them."""
    acks = _acks(result)
    assert result.metadata is not None
    folder = f"/{result.metadata.checkpoint_id.dirname}/"
    assert sorted(acks) == list(range(parallelism))
    for subtask, ack in acks.items():
        named = ack.operator_state.get(SCHEME_FIELD, BLAKE2B)
        assert named == scheme
        owned = set(owned_key_groups(MAX_P, parallelism, subtask, scheme))
        for handle in ack.handles:
            if folder in handle.key:
                assert set(handle.key_groups) <= owned, (subtask, handle.key)
            else:
                assert set(handle.key_groups) & owned, (subtask, handle.key)


def _state_key_groups(store: Any, result: EpochResult) -> dict[str, int]:
    """Every stored key and the key group whose rows hold it (read from the state files)."""
    from microcheckpoint.state.chains import key_group_chains, load_key_group
    from microcheckpoint.state.files import read_rows

    assert result.metadata is not None
    handles = [h for t, a in result.metadata.acks.items() if t.uid.value == UID for h in a.handles]
    out: dict[str, int] = {}
    for kg, chain in key_group_chains(handles).items():
        for ck in load_key_group(chain, kg, lambda h: read_rows(store, h)):
            out[json.loads(ck)] = kg
    return out


# Per operator kind: the pipeline, and what each rescale's epoch job looks like, as
# ``shape(jobs)`` (``_epoch``'s task counts) for parallelism 2, 3, 4 and 2 again.
RESCALES = {
    # The one job: read and partial counts; the shuffle by key into the final counts and
    # the subtasks; the count of the outputs (its own stage). That takes as many subtasks
    # as the session's shuffle partitions (2), dividing 128; with 3 or 4, the rows go to
    # the subtasks in a shuffle of their own: one stage more.
    "aggregation": (_counting, _most_stages, [3, 4, 4, 3]),
    # The one job: read and key groups; the repartition by key into one task per subtask;
    # the count of the outputs. With 3 subtasks (not dividing 128) the rows go to the
    # subtasks by the placement shuffle, over the session's 2 shuffle partitions.
    "function": (
        _counting_fn,
        lambda jobs: [job[1:] for job in jobs],
        [[[n, 1]] for n in (2, 2, 4, 2)],
    ),
}


@pytest.mark.parametrize("kind", list(RESCALES))
def test_a_new_operator_groups_by_spark_hash_in_one_shuffle_and_rescales_exactly(
    spark, kafka_bootstrap, tmp_path, kind: str
) -> None:
    counting, shape, shapes = RESCALES[kind]
    topic = _topic(kafka_bootstrap)
    name = _name("kgs")
    store = FileStore(f"file://{tmp_path}")
    pipeline = counting(name, topic)
    produced: list[str] = []
    for epoch, (parallelism, expected) in enumerate(zip([2, 3, 4, 2], shapes, strict=True)):
        words = _words(200, epoch)
        _produce(kafka_bootstrap, topic, words)
        produced += words
        result, jobs = _epoch(spark, pipeline, store, kafka_bootstrap, parallelism)
        assert result.records == 200
        assert shape(jobs) == expected, (parallelism, jobs)
        _check_placement(result, parallelism, SPARK_HASH)
        assert read_keyed_state(store, name, UID) == dict(Counter(produced))  # the fold
        where = _state_key_groups(store, result)
        assert where == {w: spark_key_group(w, MAX_P) for w in set(produced)}


def test_a_process_function_s_empty_partitions_run_their_timers(
    spark, kafka_bootstrap, tmp_path
) -> None:
    # An epoch with no records still runs every subtask of a process function (its
    # partition of the repartition is empty): the timers set one epoch before fire.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-timer")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    op = KeyedProcess(UID, key="value", function=_Recount(), output_schema="key string, total long")
    pipeline = Pipeline(name, source).then(op)
    words = _words(120, 77)
    assert {spark_key_group(w, MAX_P) % 4 for w in words} == {0, 1, 2, 3}  # all hold keys
    _produce(kafka_bootstrap, topic, words)
    first, _ = _epoch(spark, pipeline, store, kafka_bootstrap, 4, collect=True)
    assert first.records == 120 and first.outputs == []
    empty, jobs = _epoch(spark, pipeline, store, kafka_bootstrap, 4, collect=True)
    assert empty.records == 0
    # One task per subtask (the placement would have had 2).
    (job,) = jobs
    assert len(job) == 2 and job[1] == 4, jobs
    _check_placement(empty, 4, SPARK_HASH)
    assert empty.outputs is not None
    fired = {r["key"]: r["total"] for r in empty.outputs}
    assert len(empty.outputs) == len(fired) and fired == dict(Counter(words))


def _connect_epochs(url: str, bootstrap: str, topic: str, store_url: str) -> None:
    """Run two epochs of a function and a process function as a Spark Connect client (a
    process of its own: this one has a classic session); print each one's records, acks
    and outputs as a line of JSON."""
    from microcheckpoint.engine.spark import connect_spark

    remote = connect_spark(url)
    store = FileStore(store_url)
    source = KafkaSource(f"{topic}-source", [topic], value_format="text")
    counts = KeyedOperator(UID, "value", _count_rows, "key string, total long")
    timers = KeyedProcess(
        "timers", key="key", function=_Recount(), output_schema="key string, total long"
    )
    pipeline = Pipeline(topic, source).then(counts).then(lambda df: df.select("key"))
    pipeline = pipeline.then(timers)
    config = CheckpointConfig.from_mapping({"pipeline": topic, "storage": store.url})
    for _ in range(2):
        result = run_cycle(
            remote, pipeline, config, store, bootstrap=bootstrap, parallelism=2, collect=True
        )
        assert result.metadata is not None
        acks = sorted(str(t) for t in result.metadata.acks)
        print(json.dumps({"records": result.records, "acks": acks, "outputs": result.outputs}))


def test_an_epoch_with_no_input_over_connect_runs_every_subtask(
    spark_connect_url, kafka_bootstrap, tmp_path
) -> None:
    # Connect sends an epoch with no split as an empty local relation, which Spark plans
    # with no partitions at all: the repartition still runs each subtask once (found by
    # the stress test: a savepoint's epoch with no records went unacknowledged).
    topic = _topic(kafka_bootstrap)
    words = _words(80, 5)
    _produce(kafka_bootstrap, topic, words)
    store = FileStore(f"file://{tmp_path}")
    code = (
        "import sys; from tests.integration.test_key_group_schemes import _connect_epochs; "
        "_connect_epochs(*sys.argv[1:])"
    )
    argv = [sys.executable, "-c", code, spark_connect_url, kafka_bootstrap, topic, store.url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["records"] for e in epochs] == [80, 0]
    tasks = {f"{uid}#{i}" for uid in (UID, "timers") for i in (0, 1)} | {f"{topic}-source#0"}
    assert [e["acks"] for e in epochs] == [sorted(tasks), sorted(tasks)]
    assert epochs[0]["outputs"] == []
    assert sorted(r["key"] for r in epochs[1]["outputs"]) == sorted(set(words))
    assert read_keyed_state(store, topic, UID) == dict(Counter(words))


# Settings the Connect client itself reads, once per process or session: not the engine's.
_CLIENT_OWN = ("spark.connect.session.planCompression.", "spark.python.sql.dataFrameDebugging.")


def _connect_requests(url: str, bootstrap: str, topic: str, store_url: str) -> None:
    """Three epochs each of a built-in count with its file sink and of a user's function, as
    an Airflow task runs them: a new Connect session an epoch. Prints, per epoch, the
    analysis requests and the configuration requests (by operation) its client sent."""
    from collections import defaultdict

    from pyspark.sql.connect.client.core import SparkConnectClient

    from microcheckpoint.engine.spark import connect_spark

    sent: dict[str, int] = defaultdict(int)
    analyze, config = SparkConnectClient._analyze, SparkConnectClient.config

    def counted_analyze(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent["analyze"] += 1
        return analyze(self, *args, **kwargs)

    def counted_config(self, operation, *args, **kwargs):  # type: ignore[no-untyped-def]
        kind = operation.WhichOneof("op_type")
        asked = getattr(operation, kind)
        keys = [*getattr(asked, "keys", ()), *(p.key for p in getattr(asked, "pairs", ()))]
        if not keys or not all(k.startswith(_CLIENT_OWN) for k in keys):
            sent[" ".join(["config", kind, *keys])] += 1
        return config(self, operation, *args, **kwargs)

    SparkConnectClient._analyze = counted_analyze  # type: ignore[method-assign]
    SparkConnectClient.config = counted_config  # type: ignore[method-assign]
    counts = build(topic, name=f"{topic}-agg", sink_target=f"{store_url}/out")
    function = _counting_fn(f"{topic}-fn", topic)
    for round_no in range(3):
        _produce(bootstrap, topic, _words(50, round_no))
        for pipeline in (counts, function):
            store = FileStore(f"{store_url}/{pipeline.name}")
            config_ = CheckpointConfig.from_mapping(
                {"pipeline": pipeline.name, "storage": store.url}
            )
            remote = connect_spark(url)
            sent.clear()
            result = run_cycle(remote, pipeline, config_, store, bootstrap=bootstrap, parallelism=2)
            print(json.dumps({"pipeline": pipeline.name, "records": result.records, **sent}))


def test_a_connect_epoch_asks_the_server_for_its_key_type_only(
    spark_connect_url, kafka_bootstrap, tmp_path
) -> None:
    # Each request is a round trip to the server that the epoch waits for (25-40 ms in an
    # Airflow task beside the scheduler, docs/engine.md). Left: the frame's schema for the
    # key's type, and the session's settings in one request.
    topic = _topic(kafka_bootstrap)
    store_url = f"file://{tmp_path}"
    code = (
        "import sys; from tests.integration.test_key_group_schemes import _connect_requests; "
        "_connect_requests(*sys.argv[1:])"
    )
    argv = [sys.executable, "-c", code, spark_connect_url, kafka_bootstrap, topic, store_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    epochs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["records"] for e in epochs] == [50] * 6
    # The count asks for its frame's schema (the words come from the user's functions); the
    # function's key is a column of the source's rows, whose schema the client knows.
    counted = {"analyze": 1, "config get_all": 1}
    function = {"config get_all": 1}
    sent = [{k: v for k, v in e.items() if k not in ("pipeline", "records")} for e in epochs]
    assert sent == [counted, function] * 3
    words = [w for round_no in range(3) for w in _words(50, round_no)]
    assert read_keyed_state(FileStore(f"{store_url}/{topic}-fn"), f"{topic}-fn", UID) == dict(
        Counter(words)
    )
    totals = read_keyed_state(FileStore(f"{store_url}/{topic}-agg"), f"{topic}-agg", "word-counts")
    assert totals == dict(Counter(words))
    latest = {}  # each epoch publishes its touched words' running totals
    for row in read_committed(f"{store_url}/out", f"{topic}-agg", "word-totals"):
        latest[row["key"]] = row["total"]
    assert latest == dict(Counter(words))


@pytest.mark.parametrize("counting", [_counting, _counting_fn], ids=["aggregation", "function"])
def test_an_operator_stored_by_blake2b_keeps_blake2b(
    spark, kafka_bootstrap, tmp_path, counting
) -> None:
    # State imported with `state import` is grouped by blake2b: after the restore the
    # operator keeps that scheme (its subtasks route rows in Python), and counts stay exact.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-b2")
    store = FileStore(f"file://{tmp_path}")
    imported = {canonical_key(f"w{i}"): 1000 + i for i in range(10)}
    bootstrap_savepoint(store, name, UID, imported, parallelism=2, offsets="startup")
    (prefix,) = list_savepoints(store, name)
    point = choose_restore(store, name, savepoint=(store, prefix))
    assert point is not None
    restore(store, name, point, ClaimMode.NO_CLAIM)
    pipeline = counting(name, topic)
    expected = Counter({json.loads(k): v for k, v in imported.items()})
    for epoch, parallelism in enumerate([2, 4]):
        words = _words(100, 10 + epoch)
        _produce(kafka_bootstrap, topic, words)
        expected.update(words)
        result, _ = _epoch(spark, pipeline, store, kafka_bootstrap, parallelism)
        _check_placement(result, parallelism, BLAKE2B)
        assert read_keyed_state(store, name, UID) == dict(expected)
        where = _state_key_groups(store, result)
        assert where == {w: key_group_for(canonical_key(w).encode(), MAX_P) for w in expected}


@pytest.mark.parametrize(("adaptive", "coalesce"), [("true", "true"), ("true", "false")])
def test_adaptive_execution_takes_the_rows_own_shuffle(
    spark, kafka_bootstrap, tmp_path, adaptive: str, coalesce: str
) -> None:
    # Coalesced partitions would hold several subtasks, and an empty shuffle planned as
    # none would run no subtask: with adaptive execution on, the rows take their own shuffle.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-aqe")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    kept = Pipeline(name, source).then(lambda df: df.where("value != 'skip'"))
    pipeline = kept.then(running_sum(UID, key="value"))
    words = _words(300, 99)
    keys = ("spark.sql.adaptive.enabled", "spark.sql.adaptive.coalescePartitions.enabled")
    before = {k: spark.conf.get(k, None) for k in keys}
    spark.conf.set(keys[0], adaptive)
    spark.conf.set(keys[1], coalesce)
    try:
        # Then an epoch whose every record the filter drops: its aggregation has no input.
        for batch in (words, ["skip"] * 10):
            _produce(kafka_bootstrap, topic, batch)
            result, _ = _epoch(spark, pipeline, store, kafka_bootstrap, 2)
            assert result.records == len(batch)
            _check_placement(result, 2, SPARK_HASH)
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    assert read_keyed_state(store, name, UID) == dict(Counter(words))


def test_a_sink_after_the_aggregation_stages_each_subtask_s_output_in_its_partition(
    spark, kafka_bootstrap, tmp_path
) -> None:
    # Word count with a file sink: one job of two stages (read and partial counts; final
    # counts, merge and the sink's parts), every epoch's totals published exactly once.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-sink")
    store = FileStore(f"file://{tmp_path}/chk")
    target = f"file://{tmp_path}/out"
    pipeline = build(topic, name, sink_target=target)
    produced: list[str] = []
    for epoch, (parallelism, stages) in enumerate([(2, 2), (3, 4), (2, 2)]):
        words = _words(150, 20 + epoch)
        _produce(kafka_bootstrap, topic, words)
        produced += words
        result, jobs = _epoch(spark, pipeline, store, kafka_bootstrap, parallelism)
        assert _most_stages(jobs) == stages, (parallelism, jobs)
        assert result.metadata is not None
        parts = {t.subtask for t in result.metadata.acks if t.uid.value == "word-totals"}
        assert parts == set(range(parallelism))
        assert read_keyed_state(store, name, "word-counts") == dict(Counter(produced))
        published = read_committed(target, name, "word-totals")
        rows = [(r["key"], r["total"]) for r in published]
        assert len(rows) == len(set(rows))  # nothing twice
        finals: dict[str, int] = {}
        for word, total in rows:
            finals[word] = max(finals.get(word, 0), total)
        assert finals == dict(Counter(produced))


@pytest.mark.parametrize("kind", ["aggregation", "function"])
def test_a_collated_string_key_counts_each_spelling_apart(
    spark, kafka_bootstrap, tmp_path, kind: str
) -> None:
    # A collated string's shuffle partitions by its collation, Spark SQL's hash does not:
    # an aggregation compares such a key byte by byte (Spark-hash groups), a function
    # keeps blake2b groups; "W1" and "w1" stay two keys, as in the state.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-collated")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    collated = lambda df: df.withColumn("value", F.collate("value", "UTF8_LCASE"))  # noqa: E731
    op = KeyedOperator(UID, "value", _count_rows, "key string, total long")
    op = running_sum(UID, key="value") if kind == "aggregation" else op
    pipeline = Pipeline(name, source).then(collated).then(op)
    words = [w.upper() if i % 3 == 0 else w for i, w in enumerate(_words(150, 8))]
    _produce(kafka_bootstrap, topic, words)
    result, _ = _epoch(spark, pipeline, store, kafka_bootstrap, 2)
    _check_placement(result, 2, SPARK_HASH if kind == "aggregation" else BLAKE2B)
    assert read_keyed_state(store, name, UID) == dict(Counter(words))


def test_a_key_column_that_changes_width_keeps_its_key_groups(
    spark, kafka_bootstrap, tmp_path
) -> None:
    # Spark's hash of 5 as an int differs from 5 as a long: the key is hashed as a long
    # whatever its integer width, so a pipeline whose code (or input) narrows or widens the
    # key keeps every key in its group, and the counts stay the fold of the input.
    topic = _topic(kafka_bootstrap)
    name = _name("kgs-width")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(f"{name}-source", [topic], value_format="json", schema={"n": "long"})

    def counting(width: str) -> Pipeline:
        narrow = lambda df: df.withColumn("n", F.col("n").cast(width))  # noqa: E731
        return Pipeline(name, source).then(narrow).then(running_sum(UID, key="n"))

    expected: Counter[int] = Counter()
    for epoch, width in enumerate(["int", "bigint", "smallint"]):
        numbers = [random.Random(epoch).randrange(40) for _ in range(120)]
        _produce(kafka_bootstrap, topic, [json.dumps({"n": n}) for n in numbers])
        expected.update(numbers)
        result, _ = _epoch(spark, counting(width), store, kafka_bootstrap, 2)
        _check_placement(result, 2, SPARK_HASH)
        assert read_keyed_state(store, name, UID) == dict(expected)
        where = _state_key_groups(store, result)
        assert where == {n: spark_key_group(n, MAX_P, "long") for n in expected}
