"""Operator (non-keyed) state through the engine: real Tansu, local Spark, file and S3 storage.

A buffering operator keeps every row it saw in its list state and a log of its epochs in
union-list state; across rescales (in a Spark job and in an idle epoch on the driver) and a
restore of an older checkpoint, the lists together hold every input row exactly once, split
and concatenated as docs/engine.md ("Operator state") says. A broadcast "rules" input
changes the output of every subtask.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from microcheckpoint.adapters.s3 import S3Store
from microcheckpoint.engine import (
    KafkaSource,
    PartitionFunction,
    PartitionOperator,
    Pipeline,
    UnionSource,
    broadcast_state,
    operator_list_state,
    union_list_state,
)
from microcheckpoint.engine.runner import expected_tasks, run_epoch
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.savepoints import ClaimMode, choose_restore, restore
from microcheckpoint.state.operator_files import even_split, read_operator_state
from microcheckpoint.state.verify import verify_point
from microcheckpoint.storage import FileStore
from tests.integration.test_engine import _config, _cycles, _name, _offsets, _produce, _topic

pytestmark = pytest.mark.integration


def _buffer_fn() -> PartitionFunction:
    # A class made in a function, so cloudpickle ships it by value to the executors.
    class Buffer(PartitionFunction):
        states = (operator_list_state("rows"), union_list_state("epochs"))

        def process(self, rows, ctx):
            buffered = ctx.list_state("rows")
            buffered.add_all(f"{r['partition']}:{r['offset']}" for r in rows)
            ctx.union_list_state("epochs").add([ctx.parallelism, ctx.subtask, len(rows)])
            return [{"subtask": ctx.subtask, "rows": len(rows), "buffered": len(buffered.get())}]

    return Buffer()


def _buffer_pipeline(name: str, topic: str) -> Pipeline:
    source = KafkaSource(f"{name}-source", [topic], value_format="json", schema={"v": "long"})
    return Pipeline(name, source).then(
        PartitionOperator("buffer", _buffer_fn(), "subtask int, rows long, buffered long")
    )


def _records(first: int, last: int) -> list[tuple[int, bytes]]:
    return [(v % 2, json.dumps({"v": v}).encode()) for v in range(first, last + 1)]


def _ids(produced: list[tuple], offsets: dict[int, int]) -> list[str]:
    """``partition:offset`` of every produced record below ``offsets``, sorted."""
    return sorted(f"{p}:{o}" for p, o, _ in produced if o < offsets.get(p, 0))


def _state(store: Any, name: str, cid: int) -> dict[int, dict[str, Any]]:
    return read_operator_state(store, name, "buffer", CheckpointId(cid))


def _lists(state: dict[int, dict[str, Any]], kind: str = "rows") -> list[list[Any]]:
    return [state[i][kind] for i in sorted(state)]


def _handles(result: Any) -> list[str]:
    return sorted(h.key for t, a in result.metadata.acks.items() if str(t.uid) == "buffer"
                  for h in a.handles)  # fmt: skip


def test_list_state_survives_rescale_2_to_3_to_1_holding_every_row_once(
    spark, kafka_bootstrap, tmp_path
):
    topic = _topic(kafka_bootstrap, 2)
    produced = _produce(kafka_bootstrap, topic, _records(1, 60))  # 30 per partition
    name = _name("opstate")
    store = FileStore(tmp_path.as_uri())
    config = _config(store, name, max_records_per_epoch=10, retained=10)
    pipeline = _buffer_pipeline(name, topic)
    run = lambda p, n: _cycles(spark, pipeline, config, store, kafka_bootstrap, p, n, collect=True)  # noqa: E731

    # Epochs 1-2 at parallelism 2, epoch 3 at 3 (a Spark job), 4 at 3 with no records.
    results = run(2, 2) + run(3, 2)
    assert [r.records for r in results] == [20, 20, 20, 0]
    for r in results:
        state = _state(store, name, r.checkpoint_id.value)
        assert sorted(x for xs in _lists(state) for x in xs) == _ids(produced, _offsets(r))
    for r in results[:3]:
        assert sum(o["rows"] for o in r.outputs) == 20
    two, three = _state(store, name, 2), _state(store, name, 3)
    assert sorted(two) == [0, 1] and sorted(three) == [0, 1, 2]
    # 2 -> 3: each subtask starts with its even part of the old lists, in old-subtask order.
    old = [x for xs in _lists(two) for x in xs]
    parts = [even_split(old, 3, i) for i in range(3)]
    assert [len(p) for p in parts] == [14, 13, 13]
    assert [xs[: len(p)] for xs, p in zip(_lists(three), parts, strict=True)] == parts
    epoch3 = sorted(x for xs, p in zip(_lists(three), parts, strict=True) for x in xs[len(p) :])
    assert epoch3 == sorted(set(_ids(produced, _offsets(results[2]))) - set(old))
    # The union: every subtask gets both old logs whole, then adds its own entry.
    old_log = [e for log in _lists(two, "epochs") for e in log]
    assert [log[:-1] for log in _lists(three, "epochs")] == [old_log] * 3
    assert [log[-1][:2] for log in _lists(three, "epochs")] == [[3, 0], [3, 1], [3, 2]]
    # The idle epoch at the same parallelism acks the same files (nothing written).
    assert _handles(results[3]) == _handles(results[2])
    assert _state(store, name, 4) == three

    # Epoch 5 at parallelism 1 with no records: the driver concatenates the 3 lists.
    (idle,) = run(1, 1)
    one = _state(store, name, 5)
    assert idle.records == 0 and _lists(one) == [[x for xs in _lists(three) for x in xs]]
    assert _lists(one, "epochs") == [[e for log in _lists(three, "epochs") for e in log]]
    assert all(k.startswith(Layout(name).chk(CheckpointId(5))) for k in _handles(idle))
    # Epoch 6 at parallelism 1: the new rows after the old ones, in source order.
    produced += _produce(kafka_bootstrap, topic, _records(61, 64))
    (last,) = run(1, 1)
    new = sorted((p, o) for p, o, _ in produced if o >= 30)
    assert _lists(_state(store, name, 6)) == [_lists(one)[0] + [f"{p}:{o}" for p, o in new]]
    assert last.outputs == [{"subtask": 0, "rows": 4, "buffered": 64}]
    # verify reads every operator.json as state rows (one row per state).
    checks = verify_point(choose_restore(store, name, checkpoint=CheckpointId(6)))
    files = [c for c in checks if c.check.endswith("/operator.json")]
    assert (
        len(files) == 1
        and files[0].ok
        and files[0].detail.endswith(" bytes, sha256 matches, 2 rows")
    )


def test_a_re_run_attempt_gives_every_subtask_the_same_rows_and_state(
    spark, kafka_bootstrap, tmp_path
):
    # Attempt 2 of checkpoint 1 runs and acks, then "crashes" before completing; the next
    # cycle re-runs it as attempt 3, which must write the very same files.
    topic = _topic(kafka_bootstrap, 2)
    produced = _produce(kafka_bootstrap, topic, _records(1, 40))
    name = _name("oprerun")
    store = FileStore(tmp_path.as_uri())
    config = _config(store, name, max_records_per_epoch=10, retained=10)
    pipeline = _buffer_pipeline(name, topic)
    coordinator = CheckpointCoordinator(store, config)
    ends = {TopicPartition(topic, 0): 10, TopicPartition(topic, 1): 10}
    pending = coordinator.trigger(
        expected_tasks(pipeline, 2), ends, lambda tps: dict.fromkeys(tps, 0)
    )
    crashed = run_epoch(spark, pipeline, coordinator.plan(pending.checkpoint_id), store,
                        bootstrap=kafka_bootstrap)  # fmt: skip
    assert (crashed.checkpoint_id.value, crashed.attempt, crashed.records) == (1, 2, 20)
    prefix = Layout(name).chk(CheckpointId(1)) + "state/buffer/"
    files = lambda: {k[len(prefix) :]: store.get(k).data for k in store.list(prefix)}  # noqa: E731
    first = files()
    assert sorted(first) == ["00000-a00002/operator.json", "00001-a00002/operator.json"]

    results = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 2)
    assert [(r.checkpoint_id.value, r.attempt, r.records) for r in results] == [
        (1, 3, 20),
        (2, 2, 20),
    ]
    # The re-run's files are byte for byte the crashed attempt's: the same rows per subtask.
    again = files()
    assert sorted(again) == ["00000-a00003/operator.json", "00001-a00003/operator.json"]
    assert [again[k.replace("a00002", "a00003")] for k in sorted(first)] == [
        first[k] for k in sorted(first)
    ]
    state = _state(store, name, 2)
    assert sorted(x for xs in _lists(state) for x in xs) == _ids(produced, {0: 20, 1: 20})


def test_restore_of_an_older_checkpoint_at_another_parallelism_s3(
    spark, kafka_bootstrap, s3_client, s3_bucket, s3_endpoint
):
    topic = _topic(kafka_bootstrap, 2)
    produced = _produce(kafka_bootstrap, topic, _records(1, 60))
    name = _name("oprestore")
    store = S3Store(s3_client, s3_bucket, "chk")
    options = {
        "endpoint_url": s3_endpoint.url, "region": s3_endpoint.region,
        "access_key": s3_endpoint.access_key, "secret_key": s3_endpoint.secret_key,
    }  # fmt: skip
    config = _config(store, name, max_records_per_epoch=10, retained=10)
    pipeline = _buffer_pipeline(name, topic)
    kw = {"store_options": options}
    first = _cycles(spark, pipeline, config, store, kafka_bootstrap, 2, 3, **kw)
    assert _offsets(first[-1]) == {0: 30, 1: 30}
    before = _state(store, name, 1)

    point = choose_restore(store, name, checkpoint=CheckpointId(1))
    restore(store, name, point, ClaimMode.NO_CLAIM)
    after = _cycles(spark, pipeline, config, store, kafka_bootstrap, 3, 2, **kw)
    assert [r.records for r in after] == [20, 20]
    # Every row exactly once: checkpoint 1's 20 rows, then offsets 10..30 read again once.
    state = _state(store, name, after[-1].checkpoint_id.value)
    assert sorted(x for xs in _lists(state) for x in xs) == _ids(produced, {0: 30, 1: 30})
    assert sorted(state) == [0, 1, 2]
    # NO_CLAIM: the first checkpoint after the restore writes files of its own.
    own = Layout(name).chk(after[0].checkpoint_id)
    assert len(_handles(after[0])) == 3 and all(k.startswith(own) for k in _handles(after[0]))
    # The restored checkpoint is unchanged.
    assert _state(store, name, 1) == before
    assert sorted(x for xs in _lists(before) for x in xs) == _ids(produced, {0: 10, 1: 10})


def _scale_fn() -> PartitionFunction:
    class Scale(PartitionFunction):
        states = (broadcast_state("rules"),)

        def process_broadcast(self, rows, ctx):
            for row in rows:  # in source order: a later rule overwrites an earlier one
                ctx.broadcast_state("rules").put(row["name"], row["factor"])

        def process(self, rows, ctx):
            factor = ctx.broadcast_state("rules").get("factor", 1)
            return [{"subtask": ctx.subtask, "v": r["v"], "scaled": r["v"] * factor} for r in rows]

    return Scale()


def test_a_broadcast_rules_input_changes_every_subtasks_output(spark, kafka_bootstrap, tmp_path):
    main_topic, rules_topic = _topic(kafka_bootstrap, 1), _topic(kafka_bootstrap, 1)
    name = _name("opbcast")
    source = UnionSource(
        f"{name}-source",
        [
            KafkaSource("main", [main_topic], value_format="json", schema={"v": "long"}),
            KafkaSource(
                "rules", [rules_topic], value_format="json",
                schema={"name": "string", "factor": "long"},
            ),
        ],
    )  # fmt: skip
    op = PartitionOperator("scale", _scale_fn(), "subtask int, v long, scaled long", "rules")
    pipeline = Pipeline(name, source).then(op)
    store = FileStore(tmp_path.as_uri())
    config = _config(store, name)

    def epoch(parallelism: int, values: range, rules: list[int]) -> list[dict]:
        _produce(kafka_bootstrap, main_topic, [(0, json.dumps({"v": v}).encode()) for v in values])
        rows = [(0, json.dumps({"name": "factor", "factor": f}).encode()) for f in rules]
        _produce(kafka_bootstrap, rules_topic, rows)
        (result,) = _cycles(spark, pipeline, config, store, kafka_bootstrap, parallelism, 1,
                            collect=True)  # fmt: skip
        assert result.records == len(values) + len(rules)
        by_v = {o["v"]: o["scaled"] for o in result.outputs}
        assert len(result.outputs) == len(values)
        assert {o["subtask"] for o in result.outputs} == set(range(parallelism))
        rules_state = read_operator_state(store, name, "scale", result.checkpoint_id)
        assert rules_state == {i: {"rules": {"factor": by_v[values[0]] // values[0]}}
                               for i in range(parallelism)}  # fmt: skip
        return by_v

    assert epoch(2, range(1, 21), [2, 5]) == {v: 5 * v for v in range(1, 21)}
    assert epoch(2, range(21, 41), [3]) == {v: 3 * v for v in range(21, 41)}
    # Rescaled to 3 with no rule in the epoch: subtask 0's map reaches the new subtask too.
    assert epoch(3, range(41, 71), []) == {v: 3 * v for v in range(41, 71)}
