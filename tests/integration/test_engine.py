"""The engine end to end: real Tansu, local Spark, file and S3 checkpoint storage.

Every test produces its own topic and runs its own pipeline (unique names), then compares
the keyed state read back from checkpoint storage with a plain-Python fold of the exact
records produced (docs/protocol.md, docs/engine.md).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.sql import functions as F

from harness.faults import Hold
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import S3Store
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import KafkaSource, KeyedOperator, Pipeline, running_sum
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.runner import EpochResult, expected_tasks, read_columns, run_epoch
from microcheckpoint.errors import (
    CheckpointExpired,
    CheckpointNotFound,
    ConfigError,
    KafkaSourceError,
)
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records.checkpoint import AbortReason
from microcheckpoint.protocol.savepoints import (
    ClaimMode,
    choose_restore,
    create_savepoint,
    list_savepoints,
    restore,
)
from microcheckpoint.state.backends import MEMORY_LIMIT_BYTES
from microcheckpoint.state.keygroups import spark_key_group
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

MAX_P = 128
WORDS = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
]  # fmt: skip


# ---- helpers ------------------------------------------------------------------------


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _topic(bootstrap: str, partitions: int) -> str:
    topic = _name("engine")
    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, partitions)
    return topic


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes]]) -> list[tuple]:
    """Send ``(partition, value)`` records in order; returns ``(partition, offset, value)``."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_in_flight_requests_per_connection=1
    )
    try:
        futures = [(producer.send(topic, value=v, partition=p), v) for p, v in records]
        producer.flush()
        out = []
        for future, value in futures:
            meta = future.get(timeout=30)
            out.append((meta.partition, meta.offset, value))
        return out
    finally:
        producer.close()


def _config(store: Any, pipeline: str, **extra: Any) -> CheckpointConfig:
    return CheckpointConfig.from_mapping({"pipeline": pipeline, "storage": store.url, **extra})


def _cycles(spark, pipeline, config, store, bootstrap, parallelism, n, **kw) -> list[EpochResult]:
    return [
        run_cycle(
            spark, pipeline, config, store, bootstrap=bootstrap, parallelism=parallelism, **kw
        )
        for _ in range(n)
    ]


def _offsets(result: EpochResult) -> dict[int, int]:
    assert result.metadata is not None
    return {tp.partition: off for tp, off in result.metadata.offsets.items()}


def _upto(produced: list[tuple], offsets: dict[int, int]) -> list[tuple]:
    """The produced records below ``offsets`` (partition -> next offset), in partition order."""
    return sorted(r for r in produced if r[1] < offsets.get(r[0], 0))


def _state_files(store: Any, pipeline: str, cid: int) -> dict[str, int]:
    """Every state file stored under ``chk-<cid>/state/`` and its size in bytes."""
    prefix = Layout(pipeline).chk(CheckpointId(cid)) + "state/"
    sizes = {}
    for key in store.list(prefix):
        obj = store.get(key)
        assert obj is not None, key
        sizes[key] = len(obj.data)
    return sizes


def _kg(key: str | int) -> int:
    """A key's group in a new operator's state (Spark's hash; integers as bigint)."""
    return spark_key_group(key, MAX_P, "string" if isinstance(key, str) else "long")


# -- word count


def _lines(count: int) -> list[str]:
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 5))
        for i in range(count)
    ]


def _wordcount(name: str, topic: str, **options: Any) -> Pipeline:
    return (
        Pipeline(name, KafkaSource(f"{name}-source", [topic], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(running_sum("word-counts", key="word", **options))
    )


# -- per-key sequence numbers (Flink's end-to-end checker)


def _seq_fn():
    # A closure so cloudpickle ships it by value (executors cannot import the tests package).
    def fn(key, rows, state):
        last, count, gaps = (
            (0, 0, 0) if state is None else (state["last"], state["count"], state["gaps"])
        )
        for row in rows:
            if row["seq"] - last != 1:
                gaps += 1
            last, count = row["seq"], count + 1
        return [{"k": key, "last": last}], {"last": last, "count": count, "gaps": gaps}

    return fn


def _seq_pipeline(name: str, topic: str) -> Pipeline:
    source = KafkaSource(
        f"{name}-source", [topic], value_format="json", schema={"k": "string", "seq": "long"}
    )
    return Pipeline(name, source).then(
        KeyedOperator("seq-check", "k", _seq_fn(), "k string, last long")
    )


def _seq_records(keys: list[str], partitions: int, first: int, last: int) -> list[tuple]:
    """Seq ``first..last`` of every key, round robin; a key always goes to one partition."""
    return [
        (i % partitions, json.dumps({"k": k, "seq": s}).encode())
        for s in range(first, last + 1)
        for i, k in enumerate(keys)
    ]


def _seq_fold(records: list[tuple]) -> dict[str, dict[str, int]]:
    """What the sequence operator must hold after ``records`` (each once, in offset order)."""
    state: dict[str, dict[str, int]] = {}
    for _, _, value in sorted(records):
        row = json.loads(value)
        s = state.setdefault(row["k"], {"last": 0, "count": 0, "gaps": 0})
        if row["seq"] - s["last"] != 1:
            s["gaps"] += 1
        s["last"], s["count"] = row["seq"], s["count"] + 1
    return state


# ---- 1. N epochs == one batch computation ---------------------------------------------


def test_word_count_over_many_epochs_equals_one_batch_count_file_store(
    spark, kafka_bootstrap, tmp_path
):
    topic = _topic(kafka_bootstrap, 2)
    lines = _lines(300)
    produced = _produce(
        kafka_bootstrap, topic, [(i % 2, line.encode()) for i, line in enumerate(lines)]
    )
    name = _name("wc-file")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=40, retained=3)
    pipeline = _wordcount(name, topic)

    results = _cycles(spark, pipeline, config, store, kafka_bootstrap, 3, 4)

    # 150 records per partition at 40 per epoch: 4 epochs, the last one short.
    assert [r.records for r in results] == [80, 80, 80, 60]
    assert [r.checkpoint_id.value for r in results] == [1, 2, 3, 4]
    assert _offsets(results[-1]) == {0: 150, 1: 150}
    expected = Counter(w for line in lines for w in line.split())
    assert read_keyed_state(store, name, "word-counts") == dict(expected)
    # Every intermediate checkpoint holds the count of exactly the input up to its offsets.
    for result in results[1:3]:
        upto = _upto(produced, _offsets(result))
        partial = Counter(w for _, _, v in upto for w in v.decode().split())
        assert read_keyed_state(store, name, "word-counts", result.checkpoint_id) == dict(partial)


def test_word_count_over_many_epochs_equals_one_batch_count_s3(
    spark, kafka_bootstrap, s3_client, s3_bucket, s3_endpoint
):
    topic = _topic(kafka_bootstrap, 2)
    lines = _lines(300)
    _produce(kafka_bootstrap, topic, [(i % 2, line.encode()) for i, line in enumerate(lines)])
    name = _name("wc-s3")
    store = S3Store(s3_client, s3_bucket, "chk")
    options = {
        "endpoint_url": s3_endpoint.url,
        "region": s3_endpoint.region,
        "access_key": s3_endpoint.access_key,
        "secret_key": s3_endpoint.secret_key,
    }
    config = _config(store, name, max_records_per_epoch=40, retained=3)

    results = _cycles(
        spark, _wordcount(name, topic), config, store, kafka_bootstrap, 2, 4, store_options=options
    )

    assert [r.records for r in results] == [80, 80, 80, 60]
    expected = Counter(w for line in lines for w in line.split())
    assert read_keyed_state(store, name, "word-counts") == dict(expected)
    assert any(k.startswith(f"{name}/") for k in store.list(""))


# ---- 2. exactly-once keyed state: per-key sequence numbers ----------------------------


def test_per_key_sequence_numbers_have_no_gaps_and_exact_counts(spark, kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap, 3)
    keys = [f"key-{i:02d}" for i in range(30)]
    produced = _produce(kafka_bootstrap, topic, _seq_records(keys, 3, 1, 12))  # 120 / partition
    name = _name("seq")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=35, retained=2)

    results = _cycles(spark, _seq_pipeline(name, topic), config, store, kafka_bootstrap, 3, 5)

    # The fifth epoch finds nothing new: an empty epoch completes and changes no state.
    assert [r.records for r in results] == [105, 105, 105, 45, 0]
    assert [r.checkpoint_id.value for r in results] == [1, 2, 3, 4, 5]
    assert _offsets(results[-1]) == {0: 120, 1: 120, 2: 120}
    state = read_keyed_state(store, name, "seq-check")
    assert state == {k: {"last": 12, "count": 12, "gaps": 0} for k in keys}
    assert state == _seq_fold(produced)
    assert read_keyed_state(store, name, "seq-check", CheckpointId(4)) == state
    assert _state_files(store, name, 5) == {}


def test_a_local_cycle_expires_its_checkpoint_at_the_deadline_while_the_job_runs(
    spark, kafka_bootstrap, tmp_path, monkeypatch
):
    """``run_cycle`` enforces the checkpoint timeout while its job runs (``DeadlineWatch``):
    the checkpoint is aborted as EXPIRED while the job is still held mid-read, the cycle
    then fails naming the expiry, and the next cycle re-reads the range exactly once."""
    topic = _topic(kafka_bootstrap, 2)
    keys = [f"key-{i:02d}" for i in range(8)]
    produced = _produce(kafka_bootstrap, topic, _seq_records(keys, 2, 1, 5))
    name = _name("seq-timeout")
    store = FileStore(f"file://{tmp_path}/chk")
    pipeline = _seq_pipeline(name, topic)
    config = _config(store, name, timeout=600, tolerable_failures=1, retained=3)
    _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 1)
    produced += _produce(kafka_bootstrap, topic, _seq_records(keys, 2, 6, 9))
    hold = Hold(tmp_path / "hold", "reading")
    for env_name, value in hold.env.items():
        monkeypatch.setenv(env_name, value)
    short = _config(store, name, timeout=2, tolerable_failures=1, retained=3)
    coordinator = CheckpointCoordinator(store, short)
    failed: list[BaseException] = []

    def cycle() -> None:
        try:
            _cycles(spark, pipeline, short, store, kafka_bootstrap, 2, 1)
        except BaseException as exc:
            failed.append(exc)

    job = threading.Thread(target=cycle, daemon=True)
    job.start()
    try:
        hold.wait_reached(120, alive=job.is_alive)
        deadline = time.monotonic() + 60
        while (outcome := coordinator.view().records[CheckpointId(2)].outcome) is None:
            assert time.monotonic() < deadline, "checkpoint 2 was not aborted at its deadline"
            time.sleep(0.1)
        assert hold.reached, "the job went on before the abort"  # aborted while it ran
    finally:
        hold.release()
        monkeypatch.delenv(next(iter(hold.env)))
        job.join(120)
    assert outcome.reason is AbortReason.EXPIRED, outcome
    assert outcome.at_ms >= coordinator.view().trigger_time_ms(CheckpointId(2)) + 2000
    assert len(failed) == 1 and isinstance(failed[0], CheckpointExpired), failed
    assert str(failed[0]).startswith(f"checkpoint 2 of {name!r} expired: "), failed[0]
    # The acks sent after the abort changed nothing; the next cycle reads the range again.
    (result,) = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 1)
    assert (result.checkpoint_id.value, result.records) == (3, 32)
    assert [c.value for c in coordinator.view().completed] == [1, 3]
    assert _offsets(result) == {0: 36, 1: 36}
    assert read_keyed_state(store, name, "seq-check") == _seq_fold(produced)


def _max_fn():
    def fn(key, rows, state):
        best = max([state or 0, *(row["total"] for row in rows)])
        return [{"word": key, "best": best}], best

    return fn


def test_two_chained_keyed_operators_both_checkpoint_exact_state(spark, kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap, 2)
    lines = _lines(80)
    _produce(kafka_bootstrap, topic, [(i % 2, line.encode()) for i, line in enumerate(lines)])
    name = _name("chain")
    store = FileStore(f"file://{tmp_path}")
    pipeline = _wordcount(name, topic).then(
        KeyedOperator("best-total", "key", _max_fn(), "word string, best long")
    )
    config = _config(store, name, max_records_per_epoch=20)

    results = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 2, collect=True)

    expected = dict(Counter(w for line in lines for w in line.split()))
    assert read_keyed_state(store, name, "word-counts") == expected
    assert read_keyed_state(store, name, "best-total") == expected
    assert {str(t) for t in results[-1].metadata.acks} == {
        f"{name}-source#0", "word-counts#0", "word-counts#1", "best-total#0", "best-total#1",
    }  # fmt: skip
    # Epoch 2 read lines[40:] (offsets 20-39 of both partitions): its outputs are the words
    # it touched, with their final totals.
    touched = {w for line in lines[40:] for w in line.split()}
    assert sorted((o["word"], o["best"]) for o in results[-1].outputs) == sorted(
        (w, expected[w]) for w in touched
    )


# ---- 3. restore from an older checkpoint (I4) ------------------------------------------


def test_restore_older_checkpoint_reprocesses_the_rest_exactly_once(
    spark, kafka_bootstrap, tmp_path
):
    topic = _topic(kafka_bootstrap, 2)
    keys = [f"r{i}" for i in range(10)]
    produced = _produce(kafka_bootstrap, topic, _seq_records(keys, 2, 1, 12))  # 60 / partition
    name = _name("restore")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=10, retained=10)
    pipeline = _seq_pipeline(name, topic)

    first = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 5)
    assert [r.records for r in first] == [20] * 5
    assert _offsets(first[-1]) == {0: 50, 1: 50}
    # Every checkpoint's state is the fold of the input up to its own _metadata offsets.
    for result in first:
        assert read_keyed_state(store, name, "seq-check", result.checkpoint_id) == _seq_fold(
            _upto(produced, _offsets(result))
        )

    point = choose_restore(store, name, checkpoint=CheckpointId(2))
    assert point is not None and {tp.partition: o for tp, o in point.metadata.offsets.items()} == {
        0: 20,
        1: 20,
    }
    restore(store, name, point, ClaimMode.NO_CLAIM)
    produced += _produce(kafka_bootstrap, topic, _seq_records(keys, 2, 13, 14))  # 10 / partition

    # From offset 20 to 70 per partition: 5 epochs of 10.
    after = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 5)
    assert [r.checkpoint_id.value for r in after] == [6, 7, 8, 9, 10]
    assert [r.records for r in after] == [20] * 5
    assert after[0].metadata.barrier.starts == {
        TopicPartition(topic, 0): 20,
        TopicPartition(topic, 1): 20,
    }
    assert _offsets(after[-1]) == {0: 70, 1: 70}
    # NO_CLAIM: the first checkpoint after the restore is a full snapshot of its own files.
    own = Layout(name).chk(CheckpointId(6))
    assert after[0].metadata.handles and all(
        h.key.startswith(own) for h in after[0].metadata.handles
    )
    state = read_keyed_state(store, name, "seq-check")
    assert state == {k: {"last": 14, "count": 14, "gaps": 0} for k in keys}
    assert state == _seq_fold(produced)
    # The restored checkpoint is still readable and unchanged.
    assert read_keyed_state(store, name, "seq-check", CheckpointId(2)) == _seq_fold(
        _upto(produced, {0: 20, 1: 20})
    )


# ---- 4. rescale ------------------------------------------------------------------------


@pytest.mark.parametrize("before, after", [(2, 4), (4, 1)])
def test_rescaled_state_equals_state_at_parallelism_one(
    spark, kafka_bootstrap, tmp_path, before, after
):
    topic = _topic(kafka_bootstrap, 2)
    keys = [f"s{i}" for i in range(40)]
    hot = keys[:8]
    # Per partition: epochs 1-2 touch all 40 keys; epochs 3-4 only the 8 hot ones, so after
    # the rescale most key groups are untouched and restored by reference (incremental,
    # retained=1: their files outlive the checkpoints that wrote them).
    records = _seq_records(keys, 2, 1, 2) + _seq_records(hot, 2, 3, 12)  # 80 / partition
    produced = _produce(kafka_bootstrap, topic, records)
    store = FileStore(f"file://{tmp_path}")

    single = _name("p1")
    _cycles(
        spark, _seq_pipeline(single, topic), _config(store, single, max_records_per_epoch=20),
        store, kafka_bootstrap, 1, 4,
    )  # fmt: skip
    rescaled = _name(f"p{before}to{after}")
    pipeline = _seq_pipeline(rescaled, topic)
    config = _config(store, rescaled, max_records_per_epoch=20)
    first = _cycles(spark, pipeline, config, store, kafka_bootstrap, before, 2)
    second = _cycles(spark, pipeline, config, store, kafka_bootstrap, after, 2)

    expected = _seq_fold(produced)
    assert expected == {
        k: {"last": 12, "count": 12, "gaps": 0} if k in hot else {"last": 2, "count": 2, "gaps": 0}
        for k in keys
    }
    assert read_keyed_state(store, single, "seq-check") == expected
    assert read_keyed_state(store, rescaled, "seq-check") == expected
    assert [r.records for r in first + second] == [40, 40, 40, 40]
    assert _offsets(second[-1]) == {0: 80, 1: 80}
    subtasks = lambda r: {t.subtask for t in r.metadata.acks if t.uid.value == "seq-check"}  # noqa: E731
    assert subtasks(first[-1]) == set(range(before))
    assert subtasks(second[-1]) == set(range(after))
    # The last checkpoint still covers every key group that holds state.
    covered = {kg for h in second[-1].metadata.handles for kg in h.key_groups}
    assert covered == {_kg(k) for k in keys}


# ---- 5. incremental snapshots ------------------------------------------------------------


def _incremental_run(spark, bootstrap, tmp_path, incremental: bool, spread: bool = False):
    """Epoch 1 gives 20,000 keys state; epoch 2 touches 1% of them (200 keys), either
    clustered in the fewest key groups or spread over the key space."""
    topic = _topic(bootstrap, 1)
    keys = [f"user-{i:05d}" for i in range(20_000)]
    assert {_kg(k) for k in keys} == set(range(MAX_P))  # every key group holds state
    by_kg: dict[int, list[str]] = {}
    for k in keys:
        by_kg.setdefault(_kg(k), []).append(k)
    touched: list[str] = []
    for kg in sorted(by_kg):
        touched.extend(by_kg[kg][: 200 - len(touched)])
        if len(touched) == 200:
            break
    if spread:  # 1% of the keys, spread over many key groups
        touched = keys[::100]
    touched_kgs = {_kg(k) for k in touched}
    records = [(0, k.encode()) for k in keys] + [(0, k.encode()) for k in touched]
    _produce(bootstrap, topic, records)
    name = _name("incr")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=20_000, retained=3, incremental=incremental)
    pipeline = Pipeline(name, KafkaSource(f"{name}-source", [topic], value_format="text")).then(
        running_sum("user-counts", key="value")
    )
    results = _cycles(spark, pipeline, config, store, bootstrap, 2, 2)
    assert [r.records for r in results] == [20_000, 200]
    expected = Counter(keys) + Counter(touched)
    assert read_keyed_state(store, name, "user-counts") == dict(expected)
    return store, name, touched_kgs, results


def test_incremental_snapshot_writes_only_changed_key_groups(spark, kafka_bootstrap, tmp_path):
    store, name, touched_kgs, results = _incremental_run(spark, kafka_bootstrap, tmp_path, True)
    full = _state_files(store, name, 1)
    delta = _state_files(store, name, 2)

    assert len(touched_kgs) <= 3
    assert sum(delta.values()) <= 0.05 * sum(full.values())
    # chk-2 covers every key group; what it wrote covers only the touched ones, and the rest
    # is referenced from chk-1's files.
    handles = results[1].metadata.handles
    assert {kg for h in handles for kg in h.key_groups} == set(range(MAX_P))
    assert {kg for h in handles if h.key in delta for kg in h.key_groups} == touched_kgs
    assert {h.key for h in handles} == set(delta) | {h.key for h in handles if h.key in full}
    assert {h.key for h in handles if h.key in delta} == set(delta)


def test_incremental_snapshot_of_one_percent_of_keys_spread_over_key_groups(
    spark, kafka_bootstrap, tmp_path
):
    store, name, touched_kgs, results = _incremental_run(
        spark, kafka_bootstrap, tmp_path, True, spread=True
    )
    full = _state_files(store, name, 1)
    delta = _state_files(store, name, 2)

    assert len(touched_kgs) >= 100  # 200 keys in 100+ of 128 key groups
    assert sum(delta.values()) <= 0.05 * sum(full.values())
    handles = results[1].metadata.handles
    assert {kg for h in handles for kg in h.key_groups} == set(range(MAX_P))
    assert {kg for h in handles if h.key in delta for kg in h.key_groups} == touched_kgs


def test_non_incremental_snapshot_rewrites_every_key_group(spark, kafka_bootstrap, tmp_path):
    store, name, _, results = _incremental_run(spark, kafka_bootstrap, tmp_path, False)
    delta = _state_files(store, name, 2)

    handles = results[1].metadata.handles
    assert {h.key for h in handles} == set(delta)  # nothing referenced from chk-1
    assert {kg for h in handles for kg in h.key_groups} == set(range(MAX_P))


# ---- 6. memory backend -----------------------------------------------------------------


def test_memory_backend_counts_like_the_table_backend(spark, kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap, 2)
    lines = _lines(120)
    _produce(kafka_bootstrap, topic, [(i % 2, line.encode()) for i, line in enumerate(lines)])
    name = _name("wc-mem")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=25, retained=2)

    # Rescale 2 -> 3 midway: the memory snapshot is split by key group on restore.
    _cycles(
        spark, _wordcount(name, topic, state_backend="memory"), config, store, kafka_bootstrap, 2, 2
    )
    results = _cycles(
        spark, _wordcount(name, topic, state_backend="memory"), config, store, kafka_bootstrap, 3, 1
    )

    assert results[-1].records == 20
    assert _offsets(results[-1]) == {0: 60, 1: 60}
    expected = Counter(w for line in lines for w in line.split())
    assert read_keyed_state(store, name, "word-counts") == dict(expected)
    assert {k.rsplit("/", 1)[1] for k in _state_files(store, name, 3)} == {"state.json"}


def test_memory_backend_refuses_state_over_5_mb_naming_uid_size_and_table(
    spark, kafka_bootstrap, tmp_path
):
    topic = _topic(kafka_bootstrap, 1)
    _produce(kafka_bootstrap, topic, [(0, f"big-{i}".encode()) for i in range(60)])
    name = _name("mem-big")
    store = FileStore(f"file://{tmp_path}")

    def big(key, rows, state):
        return [], "x" * 100_000  # 60 keys x 100 kB = 6 MB in the one subtask

    pipeline = Pipeline(name, KafkaSource(f"{name}-source", [topic], value_format="text")).then(
        KeyedOperator("huge-state", "value", big, "k string", state_backend="memory")
    )
    with pytest.raises(Exception) as info:
        run_cycle(
            spark, pipeline, _config(store, name), store, bootstrap=kafka_bootstrap, parallelism=1
        )

    text = str(info.value)
    assert "huge-state" in text
    assert "table" in text
    size = re.search(r"snapshot of (\d+) bytes exceeds", text)
    assert size is not None, text
    assert int(size.group(1)) > MEMORY_LIMIT_BYTES
    with pytest.raises(CheckpointNotFound):
        read_keyed_state(store, name, "huge-state")


# ---- 7. state TTL -----------------------------------------------------------------------


def _count_fn():
    def fn(key, rows, state):
        count = (state or {"count": 0})["count"] + len(rows)
        return [{"k": key, "count": count}], {"count": count}

    return fn


def test_state_ttl_expires_untouched_keys_and_restarts_them_fresh(spark, kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap, 1)
    name = _name("ttl")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, retained=3)
    op = KeyedOperator("ttl-count", "value", _count_fn(), "k string, count long", state_ttl_s=2)
    pipeline = Pipeline(name, KafkaSource(f"{name}-source", [topic], value_format="text")).then(op)
    assert _kg("A") != _kg("B")  # A's key group stays untouched in epoch 2

    def cycle() -> EpochResult:
        return run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2)

    _produce(kafka_bootstrap, topic, [(0, b"A"), (0, b"A"), (0, b"A")])
    first = cycle()
    assert read_keyed_state(store, name, "ttl-count", ttl_s=2) == {"A": {"count": 3}}
    # Wait (with a deadline) until A's last update is older than the TTL.
    deadline = time.monotonic() + 10
    while time.time() * 1000 <= first.metadata.trigger_time_ms + 2_300:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    _produce(kafka_bootstrap, topic, [(0, b"B")])
    second = cycle()
    assert second.metadata.trigger_time_ms - first.metadata.trigger_time_ms > 2_000
    assert read_keyed_state(store, name, "ttl-count", ttl_s=2) == {"B": {"count": 1}}

    _produce(kafka_bootstrap, topic, [(0, b"A"), (0, b"A")])
    third = cycle()
    state = read_keyed_state(store, name, "ttl-count", third.checkpoint_id)
    assert state["A"] == {"count": 2}  # a fresh state, not 3 + 2
    assert read_keyed_state(store, name, "ttl-count", third.checkpoint_id, ttl_s=2)["A"] == {
        "count": 2
    }


# ---- 8. API errors -----------------------------------------------------------------------


def test_keyed_operator_without_uid_is_refused():
    for uid in ("", None):
        with pytest.raises(ConfigError) as info:
            KeyedOperator(uid, "k", _count_fn(), "k string, count long")  # type: ignore[arg-type]
        assert info.value.field == "uid"
        assert "uid" in str(info.value)


def test_two_operators_with_the_same_uid_are_refused_naming_the_uid():
    source = KafkaSource("dup-source", ["t"])
    first = KeyedOperator("dup-op", "k", _count_fn(), "k string, count long")
    second = running_sum("dup-op", key="k")
    pipeline = Pipeline("dup", source).then(first)
    with pytest.raises(ConfigError) as info:
        pipeline.then(second)
    assert "dup-op" in str(info.value)
    assert pipeline.uids == ["dup-source", "dup-op"]
    with pytest.raises(ConfigError, match="dup-op"):
        Pipeline("dup2", source, [first, second])
    # The source's uid counts too: state is matched by uid on restore.
    with pytest.raises(ConfigError, match="dup-source"):
        Pipeline("dup3", source).then(running_sum("dup-source", key="k"))


# ---- keys that are not strings ------------------------------------------------------------


def test_running_sum_by_a_long_key_column(spark, kafka_bootstrap, tmp_path):
    topic = _topic(kafka_bootstrap, 1)
    values = [{"n": i % 3, "v": i} for i in range(12)]
    _produce(kafka_bootstrap, topic, [(0, json.dumps(v).encode()) for v in values])
    name = _name("long-key")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(
        f"{name}-source", [topic], value_format="json", schema={"n": "long", "v": "long"}
    )
    pipeline = Pipeline(name, source).then(running_sum("sum-by-n", key="n", value="v"))

    run_cycle(
        spark, pipeline, _config(store, name), store, bootstrap=kafka_bootstrap, parallelism=2
    )

    assert read_keyed_state(store, name, "sum-by-n") == {
        0: 0 + 3 + 6 + 9,
        1: 1 + 4 + 7 + 10,
        2: 2 + 5 + 8 + 11,
    }


def test_an_aggregate_reads_only_its_columns_and_every_value_is_still_checked(
    spark, kafka_bootstrap, tmp_path
):
    # A built-in aggregation first: the reader builds only the key and value columns
    # (read_columns); the state is the fold all the same, and a record whose unread field
    # does not decode still fails the epoch, naming it, with nothing acked.
    topic = _topic(kafka_bootstrap, 2)
    values = [{"n": i % 4, "v": i, "note": f"r{i}", "seq": i} for i in range(40)]
    _produce(
        kafka_bootstrap, topic, [(i % 2, json.dumps(v).encode()) for i, v in enumerate(values)]
    )
    name = _name("columns")
    store = FileStore(f"file://{tmp_path}")
    source = KafkaSource(
        f"{name}-source", [topic], value_format="json",
        schema={"note": "string", "seq": "long", "n": "long", "v": "long"},
    )  # fmt: skip
    pipeline = Pipeline(name, source).then(running_sum("sum-by-n", key="n", value="v"))
    assert read_columns(pipeline) == ("n", "v")
    config = _config(store, name)
    run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2)
    truth = {n: sum(v["v"] for v in values if v["n"] == n) for n in range(4)}
    assert read_keyed_state(store, name, "sum-by-n") == truth

    # valid (the last "note" counts; an array for a string field is its JSON text), then not
    _produce(kafka_bootstrap, topic, [(1, b'{"n": 1, "v": 5, "note": "x", "note": [1]}')])
    bad = _produce(kafka_bootstrap, topic, [(1, b'{"n": 1, "v": 5, "seq": "x1"}')])
    before = sorted(store.list(f"{name}/"))
    with pytest.raises(Exception, match=f"offset {bad[0][1]} of topic '{topic}' partition 1"):
        run_cycle(spark, pipeline, config, store, bootstrap=kafka_bootstrap, parallelism=2)
    assert read_keyed_state(store, name, "sum-by-n") == truth
    # No task that reads acked (the source's ack, sent when the job starts, may be there).
    acked = [k for k in set(store.list(f"{name}/")) - set(before) if "/acks/" in k]
    assert [k for k in acked if not k.endswith(f"{name}-source#0.json")] == []


# ---- restore from a savepoint ----------------------------------------------------------------


def _savepoint_run(spark, bootstrap, tmp_path, reopen_store: bool):
    """An epoch, a savepoint of it, two more epochs, restore the savepoint, two more epochs."""
    topic = _topic(bootstrap, 2)
    keys = [f"v{i}" for i in range(6)]
    produced = _produce(bootstrap, topic, _seq_records(keys, 2, 1, 6))  # 18 / partition
    name = _name("savepoint")
    store = FileStore(f"file://{tmp_path}")
    config = _config(store, name, max_records_per_epoch=6)  # retained=1
    pipeline = _seq_pipeline(name, topic)
    first = _cycles(spark, pipeline, config, store, bootstrap, 2, 1)
    create_savepoint(store, name, CheckpointId(1))
    _cycles(spark, pipeline, config, store, bootstrap, 2, 2)  # retention drops checkpoint 1
    assert not store.exists(Layout(name).metadata(CheckpointId(1)))
    (prefix,) = list_savepoints(store, name)
    # The same storage root, opened again (as a restore DAG run would do).
    holder = FileStore(store.url) if reopen_store else store
    point = choose_restore(store, name, savepoint=(holder, prefix))
    assert point is not None
    assert {tp.partition: o for tp, o in point.metadata.offsets.items()} == _offsets(first[0])
    restore(store, name, point, ClaimMode.NO_CLAIM)
    after = _cycles(spark, pipeline, config, store, bootstrap, 2, 2)
    # Offsets 6..18 of each partition are read again, once, on top of checkpoint 1's state.
    assert [r.records for r in after] == [12, 12]
    state = read_keyed_state(store, name, "seq-check")
    assert state == {k: {"last": 6, "count": 6, "gaps": 0} for k in keys}
    assert state == _seq_fold(produced)


def test_restore_from_a_savepoint_reprocesses_the_rest_exactly_once(
    spark, kafka_bootstrap, tmp_path
):
    _savepoint_run(spark, kafka_bootstrap, tmp_path, reopen_store=False)


def test_restore_from_a_savepoint_opened_through_another_store_object(
    spark, kafka_bootstrap, tmp_path
):
    _savepoint_run(spark, kafka_bootstrap, tmp_path, reopen_store=True)


def test_keyed_state_is_readable_as_a_dataframe(spark, kafka_bootstrap, tmp_path):
    from microcheckpoint.state.reader import state_dataframe

    topic = _topic(kafka_bootstrap, 1)
    _produce(kafka_bootstrap, topic, [(0, w.encode()) for w in ["a b", "b c", "c"]])
    name = _name("df")
    store = FileStore(f"file://{tmp_path}")
    pipeline = _wordcount(name, topic)
    _cycles(
        spark,
        pipeline,
        _config(store, name, max_records_per_epoch=10),
        store,
        kafka_bootstrap,
        2,
        1,
    )
    rows = state_dataframe(spark, store, name, "word-counts").collect()
    assert [(r.key, r.state) for r in rows] == [("a", "1"), ("b", "2"), ("c", "2")]


def test_a_range_above_the_high_watermark_is_refused_before_the_executors_read(
    spark, kafka_bootstrap, tmp_path
):
    # A barrier whose end is past the partition's records (the topic was re-created): the
    # driver checks every split once and refuses the epoch; nothing acks, the state stays.
    topic = _topic(kafka_bootstrap, 2)
    _produce(kafka_bootstrap, topic, _seq_records(["a", "b"], 2, 1, 5))
    name = _name("hw")
    pipeline = _seq_pipeline(name, topic)
    store = FileStore((tmp_path / "chk").as_uri())
    coordinator = CheckpointCoordinator(store, _config(store, name))
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    ends, earliest = {p0: 5, p1: 8}, lambda tps: dict.fromkeys(tps, 0)
    pending = coordinator.trigger(expected_tasks(pipeline, 2), ends, earliest)
    plan = coordinator.plan(pending.checkpoint_id)
    with pytest.raises(KafkaSourceError) as info:
        run_epoch(spark, pipeline, plan, store, bootstrap=kafka_bootstrap)
    assert f"split {topic}:1[0, 8): end offset 8 is above the high watermark 5" in str(info.value)
    assert not [k for k in store.list(f"{name}/") if "/acks/" in k or "/state/" in k]
