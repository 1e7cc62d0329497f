"""The restore marker re-bases the chain of barriers."""

from __future__ import annotations

from microcheckpoint.protocol import savepoints
from tests.unit.protocol.helpers import (
    C1,
    C2,
    C3,
    C4,
    TASKS,
    TP0,
    ack_all,
    barrier_json,
    complete_one,
    expire_one,
    read,
)

# ---- restore ----------------------------------------------------------------------------


def test_restore_marker_rebases_the_next_trigger(h) -> None:
    coord = h.coordinator(retained=2)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    marker = savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM).to_json()
    assert marker["offsets"] == {"events:0": 10}
    assert marker["after_id"] == 2
    third = coord.trigger(TASKS, {TP0: 30})
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [10, 30]}
    assert read(h, h.layout.pending(C3))["base"] is None
    ack_all(h, coord, C3)
    coord.complete(C3)
    assert coord.trigger(TASKS, {TP0: 33}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [30, 33]}
    assert read(h, h.layout.pending(C4))["base"] == 3


def test_restore_marker_survives_an_aborted_first_trigger(h) -> None:
    coord = h.coordinator(retained=2, tolerable_failures=3)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.CLAIM)
    expire_one(h, coord, {TP0: 30})
    assert coord.trigger(TASKS, {TP0: 30}).checkpoint_id == C4
    assert barrier_json(h, C4) == {"events:0": [10, 30]}


def test_a_restore_past_a_corrupt_head_lets_the_next_trigger_start(h) -> None:
    """The head's ``_metadata`` is read ahead for its offsets; a restore written after it
    re-bases the chain, so a corrupt head must not fail the trigger."""
    coord = h.coordinator(retained=2)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    h.store.put(h.layout.metadata(C2), b"{ not json")
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM)
    third = h.coordinator(retained=2).trigger(TASKS, {TP0: 30})
    assert third.checkpoint_id == C3
    assert barrier_json(h, C3) == {"events:0": [10, 30]}
