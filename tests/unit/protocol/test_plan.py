"""The epoch plan: one immutable answer to what an attempt processes and restores."""

from __future__ import annotations

import pytest

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.errors import CheckpointNotFound, InvalidValue
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.barrier import Barrier, OffsetRange
from microcheckpoint.protocol.schemes import BLAKE2B, SCHEME_FIELD, SPARK_HASH, scheme_of
from microcheckpoint.state.handles import StateHandle
from tests.unit.protocol.helpers import AGG, C1, C2, SRC, TASKS, TP0, TP1, ack_all, start


def test_the_first_plan_is_attempt_2_of_the_barrier_with_nothing_to_restore(h) -> None:
    coord = h.coordinator(max_parallelism=16)
    start(h, coord, {TP0: 10, TP1: 4})
    plan = coord.plan(C1)
    assert plan.checkpoint_id == C1
    assert plan.attempt == 2
    assert plan.barrier == Barrier({TP0: OffsetRange(0, 10), TP1: OffsetRange(0, 4)})
    assert plan.trigger_time_ms == 1_000_000
    assert plan.expected == frozenset(TASKS)
    assert dict(plan.restore) == {}
    assert (plan.full_snapshot, plan.base) == (False, None)
    assert (plan.mode, plan.max_parallelism, plan.pipeline) == (
        CheckpointingMode.EXACTLY_ONCE,
        16,
        "pipe",
    )
    # A second plan (this coordinator's, or another task's) is a new attempt of the same
    # checkpoint.
    assert coord.plan(C1).attempt == 3
    assert h.coordinator(max_parallelism=16).plan(C1).attempt == 4


def test_the_plan_restores_the_state_of_the_completed_base(h) -> None:
    coord = h.coordinator()
    first = h.epoch(coord, {TP0: 10})
    start(h, coord, {TP0: 20})
    plan = coord.plan(C2)
    assert plan.base == C1
    assert plan.barrier.ranges[TP0] == OffsetRange(10, 20)
    assert dict(plan.restore) == {
        "agg": tuple(first.acks[AGG].handles),
        "source": tuple(first.acks[SRC].handles),
    }


def test_the_plan_restores_the_acks_of_a_pending_base(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 10})
    ack_all(h, coord, C1)
    coord.trigger(TASKS, {TP0: 20})
    plan = coord.plan(C2)
    assert plan.base == C1
    assert sorted(h.key for hs in plan.restore.values() for h in hs) == [
        "pipe/chk-0000000001/state/agg/00000-a00001/s.bin",
        "pipe/chk-0000000001/state/source/00000-a00001/s.bin",
    ]


def test_a_plan_after_a_savepoint_restore_resolves_its_relative_keys_and_is_full(h) -> None:
    coord = h.coordinator()
    h.epoch(coord, {TP0: 10})
    url = savepoints.create_savepoint(h.store, "pipe")
    prefix = url[len(h.store.url) + 1 :] + "/"
    point = savepoints.choose_restore(h.store, "pipe", savepoint=(h.store, prefix))
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM)
    start(h, coord, {TP0: 15})
    plan = coord.plan(C2)
    assert (plan.base, plan.full_snapshot) == (None, True)
    assert plan.barrier.ranges[TP0] == OffsetRange(10, 15)
    keys = [h.key for hs in plan.restore.values() for h in hs]
    assert keys and all(k.startswith(prefix + "files/") for k in keys)
    assert all(h.store.exists(k) for k in keys)


def test_without_incremental_snapshots_every_plan_is_full(h) -> None:
    coord = h.coordinator(incremental=False)
    h.epoch(coord, {TP0: 10})
    start(h, coord, {TP0: 20})
    assert coord.plan(C2).full_snapshot is True


def test_a_plan_whose_base_is_gone_is_refused(h) -> None:
    coord = h.coordinator(max_concurrent=2)
    start(h, coord, {TP0: 10})
    coord.trigger(TASKS, {TP0: 20})
    for key in h.keys(h.layout.chk(C1)):
        h.store.delete(key)
    # The process task plans what the trigger task allocated: it lists, and finds 1 gone.
    with pytest.raises(CheckpointNotFound, match="checkpoint 2 continues from 1, which is gone"):
        h.coordinator(max_concurrent=2).plan(C2)


def test_parallelism_counts_the_subtasks_of_the_given_operators(h) -> None:
    coord = h.coordinator()
    tasks = [SRC, *(AGG.of("agg", i) for i in range(3)), *(AGG.of("out", i) for i in range(2))]
    coord.trigger(tasks, {TP0: 1}, h.startup({TP0: 0}))
    plan = coord.plan(C1)
    assert plan.subtasks("agg") == 3
    assert plan.subtasks("source") == 1
    assert plan.subtasks("nope") == 0
    assert plan.parallelism("agg", "out") == 3
    assert plan.parallelism() == 1


def test_a_handle_keeps_its_key_groups(h) -> None:
    handle = StateHandle("k", 3, (1, 2))
    assert StateHandle.from_json(handle.to_json()) == handle
    assert StateHandle.from_json(StateHandle("k", 3).to_json()).key_groups == ()


def test_the_plan_names_each_operator_s_key_group_scheme_from_its_acks(h) -> None:
    # An ack without the field is the blake2b scheme (every ack stored before it existed);
    # an operator with no stored state keeps none.
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    agg_state = h.write_state(C1, AGG, "s.bin", b"agg")
    src_state = h.write_state(C1, SRC, "w.bin", b"src")
    h.ack(coord, C1, AGG, 1, [agg_state], {SCHEME_FIELD: SPARK_HASH})
    h.ack(coord, C1, SRC, 1, [src_state], {str(TP0): 10})
    coord.complete(C1)
    start(h, coord, {TP0: 20})
    assert dict(coord.plan(C2).key_groups) == {"agg": SPARK_HASH, "source": BLAKE2B}


def test_an_operator_without_stored_state_keeps_no_scheme(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    h.ack(coord, C1, AGG, 1, (), {SCHEME_FIELD: SPARK_HASH})
    h.ack(coord, C1, SRC, 1, (), {str(TP0): 10})
    coord.complete(C1)
    start(h, coord, {TP0: 20})
    assert dict(coord.plan(C2).key_groups) == {}


def test_the_first_plan_names_no_scheme(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    assert dict(coord.plan(C1).key_groups) == {}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], BLAKE2B),
        ([{}, {"x": 1}], BLAKE2B),
        ([{SCHEME_FIELD: SPARK_HASH}] * 3, SPARK_HASH),
    ],
)
def test_scheme_of_reads_the_acks(states, expected) -> None:
    assert scheme_of(states) == expected


@pytest.mark.parametrize(
    ("states", "message"),
    [
        ([{SCHEME_FIELD: SPARK_HASH}, {}], "different key group schemes"),
        ([{SCHEME_FIELD: "md5"}], "key group scheme 'md5' is unknown to this version"),
    ],
)
def test_scheme_of_refuses_mixed_or_unknown_schemes(states, message) -> None:
    with pytest.raises(InvalidValue, match=message):
        scheme_of(states)
