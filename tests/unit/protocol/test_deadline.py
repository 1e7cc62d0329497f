"""The checkpoint timeout in the epoch's own process (``DeadlineWatch``): aborted as EXPIRED
at its deadline while the epoch still runs, never once it is decided or the watch is left."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from microcheckpoint.errors import CheckpointExpired
from microcheckpoint.protocol import deadline as deadline_module
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.deadline import DeadlineWatch
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.recovery import complete_checkpoint
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.storage.file import FileStore
from tests.unit.conftest import PIPELINE
from tests.unit.protocol.helpers import AGG, C1, SRC, TP0, ack_all, read, start, status


@pytest.fixture(autouse=True)
def quick_recheck(monkeypatch) -> None:
    """The hand-moved clock is looked at every 20 ms rather than every second."""
    monkeypatch.setattr(deadline_module, "RECHECK_S", 0.02)


def eventually(what: str, check: Callable[[], bool], limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while not check():
        assert time.monotonic() < end, f"not within {limit} s: {what}"
        time.sleep(0.01)


def test_aborts_at_the_deadline_while_the_epoch_runs_and_later_acks_are_discarded(h) -> None:
    coord = h.coordinator()  # timeout 600 s, triggered at t = 1000 s
    start(h, coord, {TP0: 10})
    plan = coord.plan(C1)
    ack_all(h, coord, C1, plan.attempt, tasks=(SRC,))
    with DeadlineWatch(coord, C1, plan.trigger_time_ms) as watch:
        h.t[0] += 599.0  # a second before the deadline: nothing happens
        time.sleep(0.2)
        assert status(coord, C1) is CheckpointStatus.PENDING and watch.expired is None
        h.t[0] += 2.0
        eventually("the abort", lambda: watch.expired is not None)
        # The epoch goes on: its last ack comes after the abort and counts for nothing.
        handle = h.write_state(C1, AGG, "s.bin", b"late", plan.attempt)
        assert h.ack(coord, C1, AGG, plan.attempt, [handle]) is AckResult.DISCARDED
        # The complete step names the expiry.
        with pytest.raises(CheckpointExpired) as raised:
            complete_checkpoint(coord, C1)
    outcome = read(h, h.layout.outcome(C1))
    assert (outcome["outcome"], outcome["reason"]) == ("ABORTED", AbortReason.EXPIRED.value)
    assert outcome["at_ms"] == 1601_000
    assert str(raised.value) == str(watch.expired)
    assert str(watch.expired).startswith(f"checkpoint 1 of {PIPELINE!r} expired: not complete")
    assert status(h.coordinator(), C1) is CheckpointStatus.ABORTED


def test_a_checkpoint_completed_in_time_is_never_expired(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    plan = coord.plan(C1)
    with DeadlineWatch(coord, C1, plan.trigger_time_ms) as watch:
        ack_all(h, coord, C1, plan.attempt)
        h.t[0] += 10.0
        complete_checkpoint(coord, C1)
        # Decided before its deadline: a look after the deadline leaves it completed.
        h.t[0] += 1000.0
        time.sleep(0.2)
    assert watch.expired is None
    assert status(h.coordinator(), C1) is CheckpointStatus.COMPLETED
    assert read(h, h.layout.outcome(C1))["outcome"] == "COMPLETED"


def test_leaving_the_watch_stops_it(h) -> None:
    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    began = time.monotonic()
    with DeadlineWatch(coord, C1, coord.plan(C1).trigger_time_ms) as watch:
        pass
    assert time.monotonic() - began < 1.0
    assert not watch._thread.is_alive()
    h.t[0] += 1000.0  # past the deadline, with no watch left: nothing aborts it here
    time.sleep(0.1)
    assert status(h.coordinator(), C1) is CheckpointStatus.PENDING


def test_a_watch_that_fails_to_read_leaves_the_complete_step_to_expire_it(h) -> None:
    class Down(FileStore):
        def list(self, prefix: str = "") -> list[str]:
            raise OSError("store down")

    coord = h.coordinator()
    start(h, coord, {TP0: 10})
    plan = coord.plan(C1)
    ack_all(h, coord, C1, plan.attempt)
    broken = CheckpointCoordinator(Down(h.store.url), coord.config, clock=coord.clock)
    with DeadlineWatch(broken, C1, plan.trigger_time_ms) as watch:
        h.t[0] += 601.0
        eventually("the watch ends", lambda: not watch._thread.is_alive())
    assert watch.expired is None
    with pytest.raises(CheckpointExpired):
        complete_checkpoint(coord, C1)


def test_on_the_wall_clock_it_aborts_within_a_moment_of_the_deadline(tmp_path) -> None:
    from microcheckpoint.config import CheckpointConfig

    store = FileStore((tmp_path / "store").as_uri())
    config = CheckpointConfig.from_mapping(
        {"pipeline": PIPELINE, "storage": store.url, "timeout": 0.3}
    )
    coord = CheckpointCoordinator(store, config)
    pending = coord.trigger((SRC, AGG), {TP0: 10}, lambda tps: dict.fromkeys(tps, 0))
    trigger_ms = coord.plan(pending.checkpoint_id).trigger_time_ms
    with DeadlineWatch(coord, C1, trigger_ms) as watch:
        eventually("the abort", lambda: watch.expired is not None, limit=5.0)
    at_ms = json.loads(store.get(coord.layout.outcome(C1)).data)["at_ms"]
    assert trigger_ms + 300 < at_ms <= trigger_ms + 300 + 500, at_ms - trigger_ms
