"""The checkpoint history: what the UI page, its JSON and the demo show, read from storage."""

from __future__ import annotations

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.savepoints import ClaimMode, choose_restore, create_savepoint, restore
from tests.unit.conftest import AGG, SRC, TP0, TP1


def test_rows_for_completed_aborted_and_pending_checkpoints(h) -> None:
    coord = h.coordinator(retained=5, timeout=30, tolerable_failures=1)
    h.epoch(coord, {TP0: 10, TP1: 4})  # 1: completed at t=1000
    h.t[0] = 1010.0
    p2 = coord.trigger((SRC, AGG), {TP0: 15, TP1: 4}, labels={"run_id": "r2"})
    h.t[0] = 1050.0
    assert coord.abort_expired() == [p2.checkpoint_id]  # 2: EXPIRED at t=1050
    h.t[0] = 1060.0
    coord.trigger(
        (SRC, AGG), {TP0: 20, TP1: 6}, labels={"run_id": "r3", "data_interval": ["a", "b"]}
    )

    history = checkpoint_history(h.store, "pipe")
    rows = history["checkpoints"]
    assert [r["id"] for r in rows] == [3, 2, 1]  # newest first
    third, second, first = rows
    assert first["status"] == "COMPLETED"
    assert first["ranges"] == {"events:0": [0, 10], "events:1": [0, 4]}
    assert first["records"] == 14
    assert first["notified"] is True
    assert first["duration_ms"] == first["end_time_ms"] - first["trigger_time_ms"] == 0
    assert first["state_bytes"] == len(b"source#0@1") + len(b"agg#0@1")
    assert second["status"] == "ABORTED"
    assert second["reason"] == AbortReason.EXPIRED.value
    assert second["labels"] == {"run_id": "r2"}
    assert (second["trigger_time_ms"], second["end_time_ms"]) == (1_010_000, 1_050_000)
    assert second["duration_ms"] == 40_000
    assert second["ranges"] == {"events:0": [10, 15], "events:1": [4, 4]}
    assert third["status"] == "PENDING"
    assert third["ranges"] == {"events:0": [10, 20], "events:1": [4, 6]}  # re-reads 2's range
    assert third["labels"]["data_interval"] == ["a", "b"]
    assert "end_time_ms" not in third and "duration_ms" not in third
    assert history["latest_completed"] == 1
    assert history["stopped"] is None
    assert history["savepoints"] == []
    assert history["restored_from"] is None


def test_attempts_count_processing_runs_from_one(h) -> None:
    coord = h.coordinator(timeout=600)
    cid = coord.trigger((SRC, AGG), {TP0: 10}, h.startup({TP0: 0})).checkpoint_id
    row = lambda: checkpoint_history(h.store, "pipe")["checkpoints"][0]  # noqa: E731
    assert row()["attempt"] == 1  # triggered, not yet processed
    assert coord.begin_attempt(cid) == 2  # the first processing run (stored as 2)
    assert row()["attempt"] == 1
    assert coord.begin_attempt(cid) == 3  # a retry
    assert row()["attempt"] == 2
    for task in (SRC, AGG):
        h.ack(coord, cid, task, attempt=3)
    coord.complete(cid)
    assert row()["status"] == "COMPLETED" and row()["attempt"] == 2


def test_savepoints_restore_marker_and_stop_state(h) -> None:
    coord = h.coordinator(retained=3)
    h.epoch(coord, {TP0: 3, TP1: 3})
    url = create_savepoint(h.store, "pipe")
    point = choose_restore(h.store, "pipe", checkpoint=CheckpointId(1))
    restore(h.store, "pipe", point, ClaimMode.NO_CLAIM)
    coord.suspend("stop with savepoint")
    history = checkpoint_history(h.store, "pipe")
    assert history["savepoints"] == [url]
    assert history["restored_from"] == f"{h.store.url}/pipe/chk-0000000001"
    assert history["stopped"]["reason"] == "stop with savepoint"
    coord.resume()
    assert checkpoint_history(h.store, "pipe")["stopped"] is None
