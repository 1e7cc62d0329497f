"""The restores history (``protocol.restores``): one durable row per restore, rescale,
fallback and cancel, written by the core operations, with what followed each derived from
the retained checkpoints, and its summary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.ops import cancel_pipeline, plan_restore, restore_pipeline
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.protocol.restores import (
    CLI_LABEL,
    first_checkpoint_after,
    restore_rows,
    summarize_restores,
    who,
)
from microcheckpoint.protocol.view import scan
from tests.unit.conftest import SRC, Harness
from tests.unit.ops.test_operations import target

TP0 = TopicPartition("events", 0)
C1, C2, C3, C4 = (CheckpointId(n) for n in (1, 2, 3, 4))
CLI = {"by": CLI_LABEL, "user": "alice"}


@pytest.fixture
def clocked(h: Harness, monkeypatch) -> Harness:
    """Restores take their time from the harness's clock too (seconds, as ``time.time``)."""
    monkeypatch.setattr(savepoints, "time", SimpleNamespace(time=lambda: h.t[0]))
    return h


def epoch(h: Harness, end: int, parallelism: int, took_s: float = 2.5) -> CheckpointMetadata:
    """One checkpoint of the source and ``parallelism`` agg subtasks, ``took_s`` long."""
    coord = h.coordinator(retained=5)
    tasks = [SRC, *(TaskId.of("agg", i) for i in range(parallelism))]
    cid = coord.trigger(tasks, {TP0: end}, h.startup({TP0: 0})).checkpoint_id
    for task in tasks:
        h.ack(coord, cid, task, handles=[h.write_state(cid, task, "state.bin", b"s")])
    h.t[0] += took_s
    meta = coord.complete(cid)
    coord.notify(cid)
    return meta


def restore(h: Harness, point: str, labels: dict, parallelism: int | None = None) -> None:
    pipe = target(h, retained=5)
    request = plan_restore(pipe, point, parallelism=parallelism)
    restore_pipeline(pipe, request, labels=labels, sleep=lambda s: None)


def rows(h: Harness) -> list[dict]:
    return restore_rows(h.store, h.layout, scan(h.store, h.layout))


def test_every_restore_rescale_cancel_and_fallback_is_a_row_with_what_followed(
    clocked: Harness,
) -> None:
    h = clocked
    chk = f"{h.store.url}/pipe/chk-"
    epoch(h, 10, 2)
    epoch(h, 25, 2)
    # A rescale from checkpoint 1 from the command line: 15 records are read again.
    h.t[0] = 1010.0
    restore(h, "1", CLI, parallelism=3)
    (rescale,) = rows(h)
    assert {k: v for k, v in rescale.items() if k != "id"} == {
        "kind": "rescale",
        "at_ms": 1_010_000,
        "after_id": 2,
        "from": chk + "0000000001",
        "checkpoint_id": 1,
        "point_kind": "checkpoint",
        "claim_mode": "NO_CLAIM",
        "parallelism_before": {"agg": 2, "source": 1},
        "parallelism": 3,
        "records_to_replay": 15,
        "who": "cli:alice",
        "note": "",
        "labels": CLI,
        # Nothing ran since.
        "parallelism_after": None,
        "first_checkpoint": None,
        "time_to_first_checkpoint_ms": None,
    }
    assert rescale["id"].startswith("0000001010000-")
    # The next checkpoint runs at 3 and completes 12.5 s after the restore.
    h.t[0] = 1020.0
    assert epoch(h, 30, 3).checkpoint_id == C3
    (rescale,) = rows(h)
    assert (
        rescale["parallelism_after"],
        rescale["first_checkpoint"],
        rescale["time_to_first_checkpoint_ms"],
    ) == ({"agg": 3, "source": 1}, 3, 12_500)
    # A cancel from Airflow, then a restore of latest (nothing to replay), then, before any
    # checkpoint, a state file of checkpoint 3 is lost and a second restore of latest falls
    # back to checkpoint 2.
    h.t[0] = 1030.0
    labels = {"dag_id": "pipe_cancel", "run_id": "manual__1"}
    cancel_pipeline(target(h, retained=5), labels=labels, now=lambda: h.t[0])
    h.t[0] = 1040.0
    restore(h, "latest", {"dag_id": "pipe_restore", "run_id": "manual__2"})
    h.store.delete(h.layout.state_prefix(C3, 1, TaskId.of("agg", 0)) + "state.bin")
    h.t[0] = 1050.0
    restore(h, "latest", {"dag_id": "pipe_restore", "run_id": "manual__3"})
    h.t[0] = 1060.0
    assert epoch(h, 40, 2, took_s=1.0).checkpoint_id == C4
    got = rows(h)
    shown = [
        (
            r["kind"],
            r["from"],
            r["after_id"],
            r["parallelism_before"],
            r["parallelism"],
            r["parallelism_after"],
            r["records_to_replay"],
            r["who"],
            r["first_checkpoint"],
            r["time_to_first_checkpoint_ms"],
        )
        for r in got
    ]
    before3 = {"agg": 3, "source": 1}
    assert shown == [
        # Newest first. The fallback passed over checkpoint 3 (5 records past checkpoint 2).
        ("fallback", chk + "0000000002", 3, before3, None, {"agg": 2, "source": 1}, 5,
         "pipe_restore/manual__3", 4, 11_000),
        # Superseded by the fallback before any checkpoint ran: nothing followed it.
        ("restore", chk + "0000000003", 3, before3, None, None, 0,
         "pipe_restore/manual__2", None, None),
        ("cancel", chk + "0000000003", 3, before3, None, None, None,
         "pipe_cancel/manual__1", None, None),
        ("rescale", chk + "0000000001", 2, {"agg": 2, "source": 1}, 3, before3, 15,
         "cli:alice", 3, 12_500),
    ]  # fmt: skip
    assert got[0]["note"].startswith("FELL BACK to checkpoint 2 because ")
    assert got[2]["note"] == "RETAIN_ON_CANCELLATION; aborted: none; deleted 0 objects"
    assert got[2]["claim_mode"] is None and got[1]["claim_mode"] == "NO_CLAIM"
    # The history carries the rows and their summary.
    history = checkpoint_history(h.store, "pipe")
    assert history["restores"] == got
    assert history["restores_summary"] == {
        "count": 4,
        "by_kind": {"restore": 1, "rescale": 1, "fallback": 1, "cancel": 1},
        "time_to_first_checkpoint_ms": {"count": 2, "p50": 11_000, "p90": 12_500, "max": 12_500},
    }


def test_the_metric_names_the_restore_a_checkpoint_is_the_first_after(clocked: Harness) -> None:
    h = clocked
    first = epoch(h, 10, 2)
    assert first_checkpoint_after(h.store, h.layout, first) is None  # no restore yet
    h.t[0] = 1010.0
    restore(h, "1", CLI, parallelism=3)
    h.t[0] = 1012.0
    after = epoch(h, 20, 3, took_s=0.5)
    found = first_checkpoint_after(h.store, h.layout, after)
    assert found is not None and (found[0].event_kind.value, found[1]) == ("rescale", 2_500)
    # The next one continues from it: not the first after the restore (and no listing).
    assert epoch(h, 30, 3).base == C2.value
    assert first_checkpoint_after(h.store, h.layout, scan(h.store, h.layout).metadata(C3)) is None


def test_retention_of_the_first_checkpoint_leaves_the_time_unknown(clocked: Harness) -> None:
    h = clocked
    epoch(h, 10, 2)
    h.t[0] = 1010.0
    restore(h, "1", CLI)
    h.t[0] = 1020.0
    epoch(h, 20, 2)
    assert rows(h)[0]["time_to_first_checkpoint_ms"] == 12_500
    coord = h.coordinator(retained=1)
    h.epoch(coord, {TP0: 30})  # retention keeps only checkpoint 3
    assert scan(h.store, h.layout).completed == [C3]
    (row,) = rows(h)
    assert (row["kind"], row["first_checkpoint"], row["time_to_first_checkpoint_ms"]) == (
        "restore",
        None,
        None,
    )


def test_a_pipeline_without_events_has_no_rows() -> None:
    assert summarize_restores([]) == {
        "count": 0,
        "by_kind": {"restore": 0, "rescale": 0, "fallback": 0, "cancel": 0},
        "time_to_first_checkpoint_ms": None,
    }


def test_the_summary_counts_kinds_and_takes_nearest_rank_percentiles() -> None:
    times = [100, 400, 200, None, 300, 1_000, 500, 600, 700, 800, 900]
    kinds = ["restore", "rescale", "fallback", "cancel"]
    found = [
        {"kind": kinds[i % 4], "time_to_first_checkpoint_ms": t} for i, t in enumerate(times)
    ] + [{"id": "x", "error": "MetadataFormatError: corrupt"}]
    assert summarize_restores(found) == {
        "count": 11,
        "by_kind": {"restore": 3, "rescale": 3, "fallback": 3, "cancel": 2},
        "time_to_first_checkpoint_ms": {"count": 10, "p50": 500, "p90": 900, "max": 1_000},
    }


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"dag_id": "wordcount_restore", "run_id": "manual__1"}, "wordcount_restore/manual__1"),
        ({"by": CLI_LABEL, "user": "alice"}, "cli:alice"),
        ({"by": CLI_LABEL}, "cli"),
        ({}, "api"),
        ({"by": "notebook", "user": "bob"}, "notebook:bob"),
    ],
)
def test_who_names_the_airflow_run_or_the_cli_user(labels: dict, expected: str) -> None:
    assert who(labels) == expected
