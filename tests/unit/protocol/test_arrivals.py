"""``processed_offsets``: what an event-driven pipeline has processed, by partition."""

from __future__ import annotations

from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.arrivals import processed_offsets
from tests.unit.protocol.helpers import C1, TASKS, TP0, TP1, ack_all, complete_one


def test_nothing_is_processed_before_the_first_completed_checkpoint(h) -> None:
    coord = h.coordinator()
    assert processed_offsets(coord.view()) == {}
    pending = coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0})).checkpoint_id
    # A checkpoint in flight may abort: its records do not count yet.
    assert processed_offsets(coord.view()) == {}
    ack_all(h, coord, pending)
    coord.complete(pending)
    assert processed_offsets(coord.view()) == {TP0: 10}


def test_the_latest_completed_checkpoint_counts_not_the_one_in_flight(h) -> None:
    coord = h.coordinator(retained=2, max_concurrent=2)
    complete_one(h, coord, {TP0: 10, TP1: 4})
    coord.trigger(TASKS, {TP0: 30, TP1: 9})
    assert processed_offsets(coord.view()) == {TP0: 10, TP1: 4}


def test_a_restore_since_the_latest_checkpoint_counts_its_offsets(h) -> None:
    coord = h.coordinator(retained=2)
    complete_one(h, coord, {TP0: 10})
    complete_one(h, coord, {TP0: 25})
    point = savepoints.choose_restore(h.store, "pipe", checkpoint=C1)
    savepoints.restore(h.store, "pipe", point, savepoints.ClaimMode.NO_CLAIM)
    # Records 10..24 are processed again after the restore: they count as not processed.
    assert processed_offsets(coord.view()) == {TP0: 10}
    third = coord.trigger(TASKS, {TP0: 30}).checkpoint_id
    ack_all(h, coord, third)
    coord.complete(third)
    assert processed_offsets(coord.view()) == {TP0: 30}
