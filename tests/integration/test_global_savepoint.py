"""A global savepoint of two stages, restored with other parallelisms, on the real broker,
Spark and file stores: the final result equals a failure-free run's.

Stage 1 counts the words of LINES into an internal topic; stage 2 follows every word's
running total and counts the rows that did not raise it (a row read twice, or a replayed
epoch's). After the global savepoint both stages go on (epochs the restore abandons), then
both are restored at the savepoint's cut with other parallelisms and run to the end.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import KeyedOperator
from microcheckpoint.engine.cycle import run_cycle, stage_runtime
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.global_savepoints import (
    StageInput,
    create_global_savepoint,
    read_global_savepoint,
    restore_global,
)
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records.alignment import InputAlignment
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore
from tests.integration.test_stages import _word_stages

# Produced round-robin to 2 partitions; with at most CAP records per partition per epoch,
# stage-1 epoch k (1-based, in a failure-free run) holds lines [LINES_PER_EPOCH*(k-1), ...).
LINES = [f"w{i % 7} w{i % 4} z" for i in range(28)]
TRUTH = Counter(w for line in LINES for w in line.split())
CAP = 2
LINES_PER_EPOCH = 2 * CAP
EPOCHS = len(LINES) // LINES_PER_EPOCH  # 7
CUT = 3  # the global savepoint's cut, in both stages


def _seq(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict[str, Any]], Any]:
    """Per key: the highest total seen, the rows seen, and the rows that did not raise it."""
    state = dict(state or {"last": 0, "seen": 0, "bad": 0})
    for row in rows:
        state["seen"] += 1
        if row["total"] <= state["last"]:
            state["bad"] += 1
        state["last"] = max(state["last"], row["total"])
    return [{"key": key, **state}], state


def _stages(bootstrap: str):
    operator = KeyedOperator("seq", "key", _seq, "key string, last long, seen long, bad long")
    s1, s2, first, second, sink, internal, source_topic = _word_stages(
        bootstrap, "gsp", LINES, operator
    )
    return s1, s2, first, second, sink, source_topic, internal


def _expected(epochs: int) -> dict[str, dict[str, int]]:
    """Stage 2's state in a failure-free run after stage-1 epochs 1..``epochs``: per word
    its total, one row per epoch that held the word, none that did not raise the total."""
    lines = LINES[: epochs * LINES_PER_EPOCH]
    totals = Counter(w for line in lines for w in line.split())
    held = Counter(
        w
        for k in range(0, len(lines), LINES_PER_EPOCH)
        for w in {w for line in lines[k : k + LINES_PER_EPOCH] for w in line.split()}
    )
    return {w: {"last": totals[w], "seen": held[w], "bad": 0} for w in totals}


def _config(store: FileStore, name: str, cap: int | None) -> CheckpointConfig:
    values: dict[str, Any] = {"pipeline": name, "storage": store.url, "retained": 20}
    if cap is not None:
        values["max_records_per_epoch"] = cap
    return CheckpointConfig.from_mapping(values)


def _files(store: FileStore, name: str) -> dict[str, bytes]:
    """Every stored object of pipeline ``name`` with its content."""
    return {k: store.get(k).data for k in store.list(Layout(name).root)}  # type: ignore[union-attr]


def _ends(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    with KafkaOffsets(bootstrap) as kafka:
        return kafka.end_offsets([TopicPartition(topic, p) for p in range(2)])


def _subtasks(store: FileStore, name: str, uid: str) -> list[int]:
    """The subtasks of operator ``uid`` that acked the latest completed checkpoint."""
    view = scan(store, Layout(name))
    acks = view.metadata(view.latest_completed).acks  # type: ignore[arg-type]
    return sorted(task.subtask for task in acks if task.uid.value == uid)


def test_a_global_restore_with_other_parallelisms_equals_a_failure_free_run(
    spark, kafka_bootstrap, tmp_path
) -> None:
    s1, s2, first, second, sink, source_topic, internal = _stages(kafka_bootstrap)
    store1, store2 = FileStore(f"file://{tmp_path}/s1"), FileStore(f"file://{tmp_path}/s2")
    target = FileStore(f"file://{tmp_path}/savepoints")
    config1, config2 = _config(store1, s1, CAP), _config(store2, s2, None)
    sink.open()

    def cycle(stage: int) -> int:
        pipeline, config, store = (
            (first, config1, store1) if stage == 1 else (second, config2, store2)
        )
        done = run_cycle(
            spark,
            pipeline,
            config,
            store,
            bootstrap=kafka_bootstrap,
            parallelism=2,
            collect=True,
        )
        return done.checkpoint_id.value

    def alignment_epoch(cid: int) -> int:
        view = scan(store2, Layout(s2))
        alignment = view.pending_record(CheckpointId(cid)).alignment
        assert isinstance(alignment, InputAlignment)
        return alignment.epoch or 0

    # Before the savepoint: stage 1 runs ahead of stage 2 by one epoch.
    assert [cycle(1) for _ in range(CUT)] == [1, 2, 3]
    assert [cycle(2) for _ in range(CUT)] == [1, 2, 3]
    assert [alignment_epoch(c) for c in (1, 2, 3)] == [1, 2, 3]
    assert cycle(1) == 4
    cut_offsets = scan(store1, Layout(s1)).metadata(CheckpointId(CUT)).offsets
    assert cut_offsets == {TopicPartition(source_topic, p): CUT * CAP for p in range(2)}

    # The global savepoint: the newest aligned cut is stage 2 at 3 on stage 1 at 3 (stage
    # 1's checkpoint 4 has no stage-2 checkpoint aligned on it); stored checkpoints stay.
    before = {s1: _files(store1, s1), s2: _files(store2, s2)}
    assert all(any("/chk-0000000003/" in k for k in files) for files in before.values())
    point = create_global_savepoint({s1: store1, s2: store2}, target, "global")
    assert [(p.pipeline, p.checkpoint_id) for p in point.stages] == [(s1, CUT), (s2, CUT)]
    assert point.stage(s1).inputs == ()
    assert point.stage(s2).inputs == (StageInput(s1, CUT, (internal,)),)
    assert {s1: _files(store1, s1), s2: _files(store2, s2)} == before
    assert read_global_savepoint(target, point.prefix).stages == point.stages

    # Both stages go on: epochs the restore abandons (their rows stay in the internal topic).
    assert [cycle(1) for _ in range(2)] == [5, 6]
    assert [cycle(2) for _ in range(3)] == [4, 5, 6]
    assert [alignment_epoch(c) for c in (4, 5, 6)] == [4, 5, 6]
    assert read_keyed_state(store2, s2, "seq") == _expected(6)

    # The global restore: stage 1 with 3 subtasks, stage 2 with 1 (both ran with 2).
    with KafkaOffsets(kafka_bootstrap) as kafka:
        runtimes = {
            name: stage_runtime(pipeline, config, store, kafka)
            for name, pipeline, store, config in (
                (s1, first, store1, config1),
                (s2, second, store2, config2),
            )
        }
        markers = restore_global(point, runtimes, parallelism={s1: 3, s2: 1})
    internal_ends = _ends(kafka_bootstrap, internal)
    assert dict(markers[s2].offsets) == internal_ends
    assert dict(markers[s1].offsets) == cut_offsets
    assert (markers[s1].parallelism, markers[s2].parallelism) == (3, 1)
    assert (markers[s1].after_id, markers[s2].after_id) == (6, 6)

    # Stage 1 reads the rest of its input again from its cut, then stage 2 takes one
    # stage-1 epoch per checkpoint; the parallelism passed to run_cycle is overridden.
    after = EPOCHS - CUT
    assert [cycle(1) for _ in range(after)] == list(range(7, 7 + after))
    view1 = scan(store1, Layout(s1))
    assert view1.metadata(view1.latest_completed).offsets == _ends(  # type: ignore[arg-type]
        kafka_bootstrap, source_topic
    )
    assert [cycle(2) for _ in range(after)] == list(range(7, 7 + after))
    assert [alignment_epoch(c) for c in range(7, 7 + after)] == list(range(7, 7 + after))
    assert _subtasks(store1, s1, "counts") == [0, 1, 2]
    assert _subtasks(store2, s2, "seq") == [0]

    # Exactly a failure-free run's result: every word's final total, no row read twice,
    # and one row per stage-1 epoch that held the word (the epochs after the restore hold
    # the same lines as a failure-free run's: same start offsets, same cap).
    state2 = read_keyed_state(store2, s2, "seq")
    assert set(state2) == set(TRUTH)
    assert state2 == _expected(EPOCHS)
    assert {w: s["last"] for w, s in state2.items()} == dict(TRUTH)
    assert read_keyed_state(store1, s1, "counts") == dict(TRUTH)
