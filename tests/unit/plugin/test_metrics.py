"""Checkpoint metrics reach a StatsD server (a UDP socket on loopback, read here) through
Airflow's own metrics module, as a task sends them when ``[metrics] statsd_on`` is set."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from airflow.sdk._shared.observability.metrics import statsd_logger
from airflow.sdk.observability import stats
from statsd import StatsClient

from microcheckpoint_airflow.operators import AbortCheckpointOperator, CompleteCheckpointOperator
from tests.unit.plugin.test_operators import CONTEXT, TASKS, TP0, Env


@pytest.fixture
def statsd_server() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(5)
    port = server.getsockname()[1]
    stats.initialize(
        factory=lambda: statsd_logger.get_statsd_logger(
            stats_class=StatsClient, host="127.0.0.1", port=port, prefix="airflow"
        ),
        export_legacy_names=False,
    )
    try:
        yield server
    finally:
        stats.initialize(factory=None, export_legacy_names=False)  # back to no metrics
        server.close()


def received(server: socket.socket, count: int) -> dict[str, str]:
    """``count`` StatsD packets: ``{name: "value|type"}``."""
    out = {}
    for _ in range(count):
        name, _, rest = server.recv(4096).decode().partition(":")
        out[name] = rest
    return out


def test_a_completed_and_a_failed_checkpoint_send_their_metrics(tmp_path, statsd_server) -> None:
    env = Env(tmp_path)
    spec = env.spec(tolerable_failures=5, timeout=600)
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10})
    env.ack(coord, cid, *TASKS)
    done = CompleteCheckpointOperator(task_id="c", spec=spec, checkpoint_id="1").execute(CONTEXT)
    got = received(statsd_server, 5)
    meta = coord.view().metadata(cid)
    size = meta.statistics.checkpointed_size
    assert size > 0 and done["records"] == 10
    assert got == {
        "airflow.microcheckpoint.pipe.checkpoint_completed": "1|c",
        "airflow.microcheckpoint.pipe.checkpoint_duration": got[
            "airflow.microcheckpoint.pipe.checkpoint_duration"
        ],
        "airflow.microcheckpoint.pipe.checkpointed_size": f"{size}|g",
        "airflow.microcheckpoint.pipe.full_size": f"{meta.statistics.full_size}|g",
        "airflow.microcheckpoint.pipe.checkpoint_records": "10|g",
    }
    duration = got["airflow.microcheckpoint.pipe.checkpoint_duration"]
    assert duration.endswith("|ms")
    assert float(duration[:-3]) == pytest.approx(meta.statistics.end_to_end_duration_ms)
    # A failed checkpoint: counted, and by its reason.
    env.trigger(coord, {TP0: 20})
    AbortCheckpointOperator(task_id="a", spec=spec, checkpoint_id="2").execute(CONTEXT)
    assert received(statsd_server, 2) == {
        "airflow.microcheckpoint.pipe.checkpoint_failed": "1|c",
        "airflow.microcheckpoint.pipe.checkpoint_failed.DECLINED": "1|c",
    }


def test_a_stage_checkpoint_sends_its_alignment(statsd_server) -> None:
    from microcheckpoint.protocol.records.alignment import AlignmentMode, InputAlignment
    from microcheckpoint.protocol.records.statistics import CheckpointStatistics
    from microcheckpoint_airflow import metrics

    alignment = InputAlignment(AlignmentMode.UNALIGNED, waited_ms=1200, alignment_duration_ms=1500)
    statistics = CheckpointStatistics(3, 900, 10, 30, alignment)
    metrics.checkpoint_completed("hot", statistics, 7)
    got = received(statsd_server, 8)
    assert {k.removeprefix("airflow.microcheckpoint.hot."): v for k, v in got.items()} == {
        "checkpoint_completed": "1|c",
        "checkpoint_duration": "900.000000|ms",
        "checkpointed_size": "10|g",
        "full_size": "30|g",
        "checkpoint_records": "7|g",
        "alignment_duration": "1500.000000|ms",
        "alignment_wait": "1200.000000|ms",
        "checkpoint_unaligned": "1|c",
    }


def test_a_rescale_the_first_checkpoint_after_it_and_a_cancel_send_their_metrics(
    tmp_path, statsd_server, monkeypatch
) -> None:
    from types import SimpleNamespace
    from typing import Any

    from microcheckpoint.engine.runner import expected_tasks
    from microcheckpoint.protocol.history import checkpoint_history
    from microcheckpoint_airflow import operators
    from microcheckpoint_airflow.operators import CancelOperator
    from tests.unit.plugin.test_operators import PIPELINE, TP1, restore_op, two_epochs

    class Hook:
        def __init__(self, conn_id: str) -> None:
            pass

        def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
            return {}

    monkeypatch.setattr(operators, "AirflowApiHook", Hook)
    env = Env(tmp_path)
    spec = env.spec(retained=3)
    two_epochs(env, spec)  # at parallelism 2
    context = {**CONTEXT, "dag": SimpleNamespace(dag_id="pipe_restore", params={})}
    restore_op(spec, point="chk-1", parallelism="3").execute(context)
    prefix = "airflow.microcheckpoint.pipe."
    assert received(statsd_server, 2) == {
        prefix + "restore_events": "1|c",
        prefix + "restore_events.rescale": "1|c",
    }
    # The first checkpoint after it completes: the time from the restore is sent with it.
    coord = env.coordinator(spec)
    tasks = expected_tasks(PIPELINE, 3)
    cid = env.trigger(coord, {TP0: 30, TP1: 9}, tasks)
    env.ack(coord, cid, *tasks)
    CompleteCheckpointOperator(task_id="c", spec=spec, checkpoint_id=str(cid.value)).execute(
        CONTEXT
    )
    got = received(statsd_server, 6)
    (row,) = checkpoint_history(env.store, "pipe")["restores"]
    assert row["first_checkpoint"] == cid.value == 3
    timer = got[prefix + "restore_time_to_first_checkpoint"]
    assert timer.endswith("|ms")
    assert float(timer[:-3]) == row["time_to_first_checkpoint_ms"]
    # A checkpoint that continues from it sends no such time.
    cid = env.trigger(coord, {TP0: 40, TP1: 9}, tasks)
    env.ack(coord, cid, *tasks)
    CompleteCheckpointOperator(task_id="c", spec=spec, checkpoint_id=str(cid.value)).execute(
        CONTEXT
    )
    assert prefix + "restore_time_to_first_checkpoint" not in received(statsd_server, 5)
    # A cancel.
    CancelOperator(task_id="cancel", spec=spec).execute(context)
    assert received(statsd_server, 2) == {
        prefix + "restore_events": "1|c",
        prefix + "restore_events.cancel": "1|c",
    }
