"""The checkpoint history: what the UI page, its JSON and the demo show, read from storage."""

from __future__ import annotations

from datetime import UTC, datetime

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.records import AbortReason
from microcheckpoint.protocol.records.interval import DataInterval
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
    interval = DataInterval(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
    coord.trigger((SRC, AGG), {TP0: 20, TP1: 6}, labels={"run_id": "r3"}, data_interval=interval)

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
    assert third["labels"]["data_interval"] == [
        "2026-01-01T00:00:00+00:00",
        "2026-01-02T00:00:00+00:00",
    ]
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


def test_overview_acks_latest_ack_and_summary(h) -> None:
    coord = h.coordinator(retained=10, timeout=30, tolerable_failures=5)
    h.epoch(coord, {TP0: 10, TP1: 4})  # 1: 14 records, duration 0
    h.t[0] = 1100.0
    p2 = coord.trigger((SRC, AGG), {TP0: 20, TP1: 4}, labels={"run_id": "r2", "dag_id": "d"})
    h.t[0] = 1102.0
    h.ack(coord, p2.checkpoint_id, SRC)
    h.t[0] = 1103.5
    h.ack(
        coord, p2.checkpoint_id, AGG, handles=[h.write_state(p2.checkpoint_id, AGG, "s", b"x" * 90)]
    )
    h.t[0] = 1104.0
    coord.complete(p2.checkpoint_id)  # 2: 10 records, 4 s
    h.t[0] = 1110.0
    p3 = coord.trigger((SRC, AGG), {TP0: 25, TP1: 4})
    h.t[0] = 1111.0
    h.ack(coord, p3.checkpoint_id, SRC)
    h.t[0] = 1150.0
    assert coord.abort_expired() == [p3.checkpoint_id]  # 3: EXPIRED, one of two acks
    h.t[0] = 1160.0
    coord.trigger((SRC, AGG), {TP0: 30, TP1: 4})  # 4: in progress, no ack yet

    history = checkpoint_history(h.store, "pipe")
    rows = {r["id"]: r for r in history["checkpoints"]}
    assert history["counts"] == {
        "triggered": 4,
        "in_progress": 1,
        "completed": 2,
        "failed": 1,
        "restored": 0,
        "unreadable": 0,
        "retained": 4,
    }
    assert (rows[2]["acknowledged"], rows[2]["total"]) == (2, 2)
    assert rows[2]["latest_ack_ms"] == 1_103_500
    # An abort deletes the acks with the files: the count is not known any more.
    assert (rows[3]["acknowledged"], rows[3]["total"], rows[3]["latest_ack_ms"]) == (None, 2, None)
    assert (rows[4]["acknowledged"], rows[4]["latest_ack_ms"]) == (0, None)
    assert rows[2]["full_size"] == 90 and rows[2]["checkpointed_size"] == 90
    assert history["latest"]["completed"] == {
        "id": 2,
        "labels": {"run_id": "r2", "dag_id": "d"},
        "time_ms": 1_104_000,
    }
    assert history["latest"]["failed"]["id"] == 3
    assert history["latest"]["failed"]["reason"] == AbortReason.EXPIRED.value
    summary = history["summary"]
    assert summary["duration_ms"] == {"count": 2, "min": 0, "avg": 2000, "max": 4000, "p99": 4000}
    assert summary["records"] == {"count": 2, "min": 10, "avg": 12, "max": 14, "p99": 14}
    assert history["config"]["retained"] == 10 and history["config"]["pipeline"] == "pipe"


def test_a_corrupt_metadata_is_one_row_with_its_error(h) -> None:
    coord = h.coordinator(retained=5)
    h.epoch(coord, {TP0: 3})
    h.epoch(coord, {TP0: 6})
    before = h.contents()
    h.store.put(h.layout.metadata(CheckpointId(1)), b"{not json")
    history = checkpoint_history(h.store, "pipe")
    rows = {r["id"]: r for r in history["checkpoints"]}
    assert rows[1]["status"] == "COMPLETED"
    assert "_metadata is corrupt (not JSON" in rows[1]["error"]
    assert "error" not in rows[2] and rows[2]["records"] == 3
    assert history["counts"]["unreadable"] == 1
    assert history["summary"]["records"]["count"] == 1  # the unreadable one is left out
    assert {k for k, v in h.contents().items() if before.get(k) != v} == {
        h.layout.metadata(CheckpointId(1))
    }  # reading changed nothing


def test_restores_are_counted_and_the_latest_restore_and_savepoint_carry_their_runs(h) -> None:
    coord = h.coordinator(retained=5)
    h.epoch(coord, {TP0: 3})
    h.t[0] = 1200.0
    url = create_savepoint(h.store, "pipe", labels={"dag_id": "pipe_savepoint", "run_id": "s1"})
    point = choose_restore(h.store, "pipe", checkpoint=CheckpointId(1))
    restore(h.store, "pipe", point, ClaimMode.NO_CLAIM, labels={"run_id": "x1"})
    h.epoch(coord, {TP0: 5})  # 2: the first checkpoint after the restore
    h.epoch(coord, {TP0: 7})  # 3
    history = checkpoint_history(h.store, "pipe")
    assert history["counts"]["restored"] == 1
    rows = {r["id"]: r for r in history["checkpoints"]}
    assert rows[2]["labels"]["restored_from"] == f"{h.store.url}/pipe/chk-0000000001"
    assert "restored_from" not in rows[3]["labels"]
    latest = history["latest"]
    assert latest["restore"]["labels"] == {"run_id": "x1"}
    assert latest["restore"]["source"].endswith("/pipe/chk-0000000001")
    assert latest["savepoint"]["url"] == url
    assert latest["savepoint"]["labels"]["run_id"] == "s1"
    assert latest["savepoint"]["checkpoint_id"] == 1
