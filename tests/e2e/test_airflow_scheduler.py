"""End to end with Airflow's real scheduler: ``airflow standalone`` on SQLite with the
project's ``dags/`` and the installed plugin, Tansu and SeaweedFS (S3).

The story, in order (the tests share one Airflow and run top to bottom):
1. scheduled epochs of ``wordcount_pipeline`` consume the input exactly once;
2. a slow epoch passes the checkpoint timeout: its own task aborts it as EXPIRED at its
   deadline while the epoch still runs, its late ack is discarded, and the next epoch
   re-reads its range and succeeds;
3. a savepoint with stop, triggered through the REST API v2 with the UI's conf, pauses
   the pipeline; a restore from it resumes it, and new input is counted exactly once; the
   same through the ``microcheckpoint`` console script with ``--airflow`` (``savepoint
   --stop`` pauses the DAG, ``restore`` unpauses it); ``wordcount_cancel`` during a slow
   epoch aborts it as CANCELLED and keeps the checkpoints, and a restore of ``latest``
   resumes with exact counts;
4. ``wordcount_hourly``: a backfill over three past hours gives one checkpoint per hour
   with exactly that hour's records; restoring checkpoint 1 and backfilling hours 1-2
   again replays them once; later (after step 6), a savepoint of hour 0 restored through
   the restore DAG and a backfill of hour 1 give exactly hours 0-1 (backfill from a
   savepoint);
5. the Checkpoints page answers with the stored history behind the login; a person logs
   in with a headless Chromium, opens it inside Airflow's UI, and its counts, rows and
   plots match storage; a corrupt ``_metadata`` is one row with its error (screenshots go
   to ``docs/screenshots/``);
6. the stored timestamps prove min pause and max concurrent were honoured, and the
   min-pause sensor's log shows that it waited;
7. the two Nexmark stages (dags/nexmark_stages.py): the second stage's DAG runs on the
   first stage's Asset events, waits for aligned inputs with its deferrable sensor, and
   counts exactly the true bids per item and window; a global savepoint, more input, then
   a global restore of both stages with other parallelisms gives the true counts again;
7b. event-driven epochs (dags/wordcount_events.py): with no record no run starts; records
   produced start runs through the DAG's Kafka AssetWatcher without a schedule tick, which
   count them exactly, honour the min pause, and stop when the records are processed;
8. a misspelt key in a trigger's conf (REST API, ``airflow dags trigger``) fails the first
   task of each kind of DAG with a did-you-mean; nothing is stored, nothing is unpaused;
   the edge contract: every DAG's bad trigger input and every page route's bad request is
   one line, and storage is untouched; a cancel with ``DELETE_ON_CANCELLATION`` leaves no
   checkpoint, the savepoints byte-identical, and a restore from the savepoint counts
   exactly with new ids;
9. no credential (the S3 secret key, the admin password, the JWT secret) is in any log.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from examples import nexmark_stages, wordcount
from harness.airflow_stack import AirflowStack, ApiError, start_airflow
from harness.leaks import find_leaks, log_files
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import S3Store, ensure_bucket
from microcheckpoint.faults import SLOW_ENV
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.savepoints import create_savepoint
from microcheckpoint.state.reader import read_keyed_state
from tests.e2e.browser import chromium

pytestmark = pytest.mark.e2e
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"

# The pause must outlast the scheduler's gap between one run's end and the next run's
# sensor start on a busy machine (a few seconds under load), so some sensors defer.
MIN_PAUSE_S = 9
INTERVAL_S = 10
# Generous: a cold first epoch beside the backfill took over 35 s once. On a machine busy
# with other work (a load of 20 on 2 cores gave 90 s epochs), raise it with E2E_TIMEOUT_S.
TIMEOUT_S = int(os.environ.get("E2E_TIMEOUT_S", "60"))
T0 = datetime(2026, 3, 1, tzinfo=UTC)
PER_HOUR = [40, 30, 50]
EVENTS_MIN_PAUSE_S = 5


@dataclass
class World:
    airflow: AirflowStack
    store: S3Store
    bootstrap: str
    topic: str
    hourly_topic: str
    slow_flag: Path
    nexmark: dict[str, str]
    events_topic: str
    lines: list[str] = field(default_factory=list)
    hourly_lines: list[str] = field(default_factory=list)
    savepoint: str = ""

    @property
    def api(self):
        return self.airflow.client

    def history(self, pipeline: str = "wordcount") -> dict[str, Any]:
        return checkpoint_history(self.store, pipeline)

    def rows(self, pipeline: str = "wordcount") -> dict[int, dict[str, Any]]:
        return {r["id"]: r for r in self.history(pipeline)["checkpoints"]}


def wait_for(
    what: str,
    predicate,
    timeout: float,
    airflow: AirflowStack | None = None,
    state: Any = None,
) -> Any:
    """Until ``predicate`` holds; on time-out the message shows ``state()`` (what the test
    waited on) and the end of Airflow's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    shown = json.dumps(state(), indent=1, default=str) if state else ""
    tail = airflow.service.log_tail(40) if airflow else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{shown}\n{tail}")


@pytest.fixture(scope="module")
def world(tmp_path_factory, kafka_bootstrap, s3_endpoint, s3_client, spark_connect_url):
    tmp = tmp_path_factory.mktemp("e2e")
    s3_bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    ensure_bucket(s3_client, s3_bucket)
    topic, hourly = f"e2e-{uuid.uuid4().hex[:8]}", f"e2e-hourly-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    nexmark = {k: f"e2e-{k}-{tag}" for k in ("auctions", "bids", "joined")}
    with KafkaOffsets(kafka_bootstrap) as kafka:
        for name in nexmark.values():
            kafka.create_topic(name, 2)
    events_topic = f"e2e-events-{tag}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(events_topic, 2)  # the watcher subscribes to it: it must exist
    lines = wordcount.lines_for(240, seed=31)  # 120 per partition
    wordcount.produce(kafka_bootstrap, topic, lines)
    hourly_lines, stamps = wordcount.hourly_lines(T0, PER_HOUR, seed=40)
    wordcount.produce(kafka_bootstrap, hourly, hourly_lines, timestamps_ms=stamps)
    env = {
        "MICROCHECKPOINT_STORAGE": f"s3://{s3_bucket}/chk",
        "WORDCOUNT_TOPIC": topic,
        "WORDCOUNT_INTERVAL": f"{INTERVAL_S}s",
        "WORDCOUNT_MIN_PAUSE": f"{MIN_PAUSE_S}s",
        "WORDCOUNT_TIMEOUT": f"{TIMEOUT_S}s",
        "WORDCOUNT_MAX_RECORDS": "60",
        "WORDCOUNT_RETAINED": "100",
        "WORDCOUNT_TOLERABLE_FAILURES": "1",
        "WORDCOUNT_HOURLY_TOPIC": hourly,
        "WORDCOUNT_HOURLY_START": T0.isoformat(),
        "WORDCOUNT_HOURLY_END": (T0 + timedelta(hours=3)).isoformat(),
        "WORDCOUNT_HOURLY_RETAINED": "100",
        # Only step 2 means a checkpoint to expire (wordcount's 60 s): the hourly epochs and
        # the stages get a timeout no busy machine reaches.
        "WORDCOUNT_HOURLY_TIMEOUT": "10min",
        SLOW_ENV: str(tmp / "slow-once"),
        # Epochs run on the session's warm Spark Connect server, as in `make demo`: two
        # pipelines each starting a JVM per epoch task on 2 cores took 35-60 s per epoch.
        "MICROCHECKPOINT_SPARK_MODE": "connect",
        # The Nexmark stages (step 7); paused until then.
        "MICROCHECKPOINT_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "NEXMARK_AUCTIONS_TOPIC": nexmark["auctions"],
        "NEXMARK_BIDS_TOPIC": nexmark["bids"],
        "NEXMARK_INTERNAL_TOPIC": nexmark["joined"],
        "NEXMARK_INTERVAL": f"{INTERVAL_S}s",
        "NEXMARK_TIMEOUT": "10min",
        "NEXMARK_RETAINED": "10",
        # dags/wordcount_events.py (step 7b); paused until then.
        "WORDCOUNT_EVENTS_TOPIC": events_topic,
        "WORDCOUNT_EVENTS_MIN_PAUSE": f"{EVENTS_MIN_PAUSE_S}s",
        "WORDCOUNT_EVENTS_RETAINED": "10",
    }
    airflow = start_airflow(
        tmp / "airflow", kafka_bootstrap, s3_endpoint, env, spark_connect=spark_connect_url
    )
    try:
        airflow.client.wait_dags(
            [
                "wordcount_pipeline",
                "wordcount_savepoint",
                "wordcount_restore",
                "wordcount_hourly_pipeline",
                "wordcount_hourly_restore",
            ]
        )
        # The hourly backfill runs beside the wordcount story (checked in step 4).
        airflow.client.set_paused("wordcount_hourly_pipeline", False)  # backfills need it active
        airflow.client.backfill(
            "wordcount_hourly_pipeline", T0.isoformat(), (T0 + timedelta(hours=2)).isoformat()
        )
        yield World(
            airflow,
            S3Store(s3_client, s3_bucket, "chk"),
            kafka_bootstrap,
            topic,
            hourly,
            tmp / "slow-once",
            nexmark,
            events_topic,
            lines,
            hourly_lines,
        )
    finally:
        airflow.stop()
        assert not airflow.service.alive()


def _offsets_done(world: World, ends: int) -> bool:
    history = world.history()
    latest = history["latest_completed"]
    if latest is None:
        return False
    row = next(r for r in history["checkpoints"] if r["id"] == latest)
    # Notified too: the group offsets are committed by the task after completion.
    return row["notified"] and all(end == ends for _, end in row["ranges"].values())


def _group(world: World) -> dict[int, int]:
    with KafkaOffsets(world.bootstrap) as kafka:
        tps = [TopicPartition(world.topic, p) for p in (0, 1)]
        got = kafka.committed_group_offsets("microcheckpoint-wordcount", tps)
    return {tp.partition: o for tp, o in got.items()}


def test_scheduled_epochs_consume_the_input_exactly_once(world: World):
    world.api.set_paused("wordcount_pipeline", False)
    # 120 records per partition at 60 per epoch: two epochs, then empty ones.
    wait_for(
        "two completed checkpoints ending at offset 120",
        lambda: (
            len([r for r in world.rows().values() if r["status"] == "COMPLETED"]) >= 2
            and _offsets_done(world, 120)
        ),
        max(240, 3 * TIMEOUT_S),  # a cold first epoch on a busy machine takes long
        world.airflow,
    )
    rows = world.rows()
    # The first two completed checkpoints, whatever their ids: on a busy machine a cold first
    # epoch may expire, and its range is then the next checkpoint's.
    first, second = [rows[i] for i in sorted(rows) if rows[i]["status"] == "COMPLETED"][:2]
    assert first["ranges"] == {f"{world.topic}:0": [0, 60], f"{world.topic}:1": [0, 60]}
    assert second["ranges"] == {f"{world.topic}:0": [60, 120], f"{world.topic}:1": [60, 120]}
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))
    assert _group(world) == {0: 120, 1: 120}
    # Every checkpoint names the Airflow run that triggered it, and that run succeeded.
    run_id = first["labels"]["run_id"]
    assert world.api.wait_run("wordcount_pipeline", run_id, 120) == "success"
    # The epoch task skipped its followers when it succeeded, its XCom pushed first.
    assert world.api.task_states("wordcount_pipeline", run_id) == {
        "process_epoch": "success",
        "done": "skipped",
        "abort_on_failure": "skipped",
    }
    xcom = world.api.xcom("wordcount_pipeline", run_id, "process_epoch")
    assert (xcom["checkpoint"], xcom["records"]) == (first["id"], 120), xcom


def test_a_slow_epoch_expires_and_the_next_one_succeeds(world: World):
    more = wordcount.lines_for(60, seed=32)
    wordcount.produce(world.bootstrap, world.topic, more, create=False)
    world.lines += more
    before = max(world.rows())
    # The next wordcount epoch sleeps 20 s past the timeout before its last ack (the hourly
    # pipeline's epochs pass by). The epoch task's deadline watch aborts it as EXPIRED at
    # its deadline, while the task sleeps; the late ack is discarded and the task fails.
    world.slow_flag.write_text(f"wordcount {TIMEOUT_S + 20}")
    # A manual run through the REST API, as the UI's Trigger button does.
    world.api.trigger("wordcount_pipeline", {})
    expired = wait_for(
        "a checkpoint aborted as EXPIRED",
        lambda: [r for i, r in world.rows().items() if i > before and r.get("reason") == "EXPIRED"],
        TIMEOUT_S + 120,
        world.airflow,
    )[0]
    assert not world.slow_flag.exists()
    # Expired at its deadline, not when the slow job returns 20 s later: the abort record's
    # time against trigger time + timeout.
    chk = Layout("wordcount").chk(CheckpointId(expired["id"]))
    outcome = json.loads(world.store.get(chk + "_outcome").data)
    deadline = expired["trigger_time_ms"] + TIMEOUT_S * 1000
    assert (outcome["outcome"], outcome["reason"]) == ("ABORTED", "EXPIRED")
    assert deadline < outcome["at_ms"] <= deadline + 10_000, outcome["at_ms"] - deadline
    wait_for(
        "a completed checkpoint after the expired one, at offset 150",
        lambda: _offsets_done(world, 150) and world.history()["latest_completed"] > expired["id"],
        180,
        world.airflow,
    )
    rows = world.rows()
    after = rows[
        min(i for i, r in rows.items() if i > expired["id"] and r["status"] == "COMPLETED")
    ]
    assert after["ranges"] == expired["ranges"]  # the expired range is read again
    assert expired["duration_ms"] >= TIMEOUT_S * 1000
    run = expired["labels"]["run_id"]
    assert world.api.wait_run("wordcount_pipeline", run, 60) == "failed"
    states = world.api.task_states("wordcount_pipeline", run)
    assert states["process_epoch"] == "failed"
    assert "checkpoint_timeout" not in states  # no sensor beside the one-task epoch
    assert states["abort_on_failure"] == "success"
    assert states["done"] == "upstream_failed"  # what fails the run
    # The source's ack came after the abort: discarded, so nothing but the protocol's
    # markers is left of the checkpoint (the abort deleted what was acked in time).
    left = {k.removeprefix(chk) for k in world.store.list(chk)}
    assert {n for n in left if not n.startswith("_attempt-")} == {"_pending", "_outcome"}
    # The epoch task logged the abort at the deadline, then failed naming the expiry.
    logs = world.airflow.home / "logs" / "dag_id=wordcount_pipeline" / f"run_id={run}"
    text = "".join(p.read_text() for p in logs.glob("task_id=process_epoch/attempt=*.log"))
    watch = f"checkpoint {expired['id']} of 'wordcount': its timeout ({TIMEOUT_S:g}s) passed"
    message = f"checkpoint {expired['id']} of 'wordcount' expired: not complete within"
    assert watch in text and message in text, text[-2000:]
    assert world.api.wait_run("wordcount_pipeline", after["labels"]["run_id"], 60) == "success"
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))


def test_savepoint_with_stop_then_restore_from_it(world: World):
    conf = {"target": "", "stop": True}
    run = world.api.trigger("wordcount_savepoint", conf)
    assert world.api.wait_run("wordcount_savepoint", run, 240) == "success"
    world.savepoint = world.api.xcom("wordcount_savepoint", run, "take_savepoint")
    history = world.history()
    assert world.savepoint in history["savepoints"]
    assert history["stopped"] is not None
    assert world.api.dag("wordcount_pipeline")["is_paused"] is True
    # Nothing is triggered while stopped, though input arrives and intervals pass.
    stopped_at = max(world.rows())
    more = wordcount.lines_for(100, seed=33)
    wordcount.produce(world.bootstrap, world.topic, more, create=False)
    world.lines += more
    time.sleep(INTERVAL_S + 2)
    assert max(world.rows()) == stopped_at
    conf = {
        "point": world.savepoint,
        "claim_mode": "NO_CLAIM",
        "allow_non_restored_state": False,
        "parallelism": 2,
        "resume": True,
    }
    run = world.api.trigger("wordcount_restore", conf)
    assert world.api.wait_run("wordcount_restore", run, 240) == "success"
    assert world.api.dag("wordcount_pipeline")["is_paused"] is False
    assert world.history()["restored_from"] == world.savepoint
    wait_for("the new input checkpointed", lambda: _offsets_done(world, 200), 240, world.airflow)
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))
    assert _group(world) == {0: 200, 1: 200}


def _cli_env(world: World, s3_endpoint) -> dict[str, str]:
    """A shell of a person with the README's exports and Airflow's address."""
    return {
        **os.environ,
        **s3_endpoint.environment(),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "COLUMNS": "200",
        "MICROCHECKPOINT_STORAGE": f"s3://{world.store.bucket}/chk",
        "MICROCHECKPOINT_PIPELINE": "wordcount",
        "MICROCHECKPOINT_S3_ENDPOINT": s3_endpoint.url,
        "MICROCHECKPOINT_AIRFLOW_URL": world.airflow.url,
        "MICROCHECKPOINT_AIRFLOW_USER": world.airflow.username,
        "MICROCHECKPOINT_AIRFLOW_PASSWORD": world.airflow.password,
    }


def _script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "microcheckpoint"
    done = subprocess.run(
        [str(script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def test_the_cli_stops_with_savepoint_pausing_the_dag_and_restores_unpausing_it(
    world: World, s3_endpoint
):
    env = _cli_env(world, s3_endpoint)
    assert world.api.dag("wordcount_pipeline")["is_paused"] is False
    done = _script(env, "savepoint", "--stop")
    url = done.stdout.strip()
    assert done.stderr.strip().endswith("paused wordcount_pipeline"), done.stderr
    assert world.api.dag("wordcount_pipeline")["is_paused"] is True
    assert world.history()["stopped"] is not None
    more = wordcount.lines_for(40, seed=34)
    wordcount.produce(world.bootstrap, world.topic, more, create=False)
    world.lines += more
    done = _script(env, "restore", url)
    assert done.stdout == f"restored wordcount from {url}\n"
    assert "unpaused wordcount_pipeline" in done.stderr
    assert world.api.dag("wordcount_pipeline")["is_paused"] is False
    assert world.history()["restored_from"] == url
    wait_for("the new input checkpointed", lambda: _offsets_done(world, 220), 240, world.airflow)
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))


def _more_lines(world: World, lines: list[str]) -> None:
    wordcount.produce(world.bootstrap, world.topic, lines, create=False)
    world.lines += lines


def _slow_epoch_in_flight(world: World) -> int:
    """The next wordcount epoch holds its last ack 45 s: its checkpoint's id, once in
    flight."""
    before = max(world.rows(), default=0)
    world.slow_flag.write_text("wordcount 45")
    return wait_for(
        "a checkpoint in flight",
        lambda: [i for i, r in world.rows().items() if i > before and r["status"] == "PENDING"],
        180,
        world.airflow,
    )[0]


def test_a_cancel_during_an_epoch_aborts_it_retains_checkpoints_and_a_restore_resumes(
    world: World,
):
    _more_lines(world, wordcount.lines_for(60, seed=35))
    kept = world.history()["latest_completed"]
    flying = _slow_epoch_in_flight(world)
    slow_run = world.rows()[flying]["labels"]["run_id"]
    run = world.api.trigger("wordcount_cancel", {"cleanup": ""})
    assert world.api.wait_run("wordcount_cancel", run, 120) == "success"
    record = world.api.xcom("wordcount_cancel", run, "cancel")
    assert (record["cleanup"], record["aborted"]) == ("RETAIN_ON_CANCELLATION", [flying])
    assert kept in record["retained"]
    assert world.api.dag("wordcount_pipeline")["is_paused"] is True
    assert world.rows()[flying]["reason"] == "CANCELLED"
    # The slow epoch's task fails (its checkpoint is aborted). Airflow schedules no further
    # task of a paused DAG's run: the run ends once the restore unpauses the DAG.
    wait_for(
        "the cancelled epoch's task to fail",
        lambda: (
            world.api.task_states("wordcount_pipeline", slow_run).get("process_epoch") == "failed"
        ),
        120,
        world.airflow,
    )
    assert world.history()["latest_completed"] == kept
    conf = {
        "point": "latest",
        "claim_mode": "NO_CLAIM",
        "allow_non_restored_state": False,
        "parallelism": 2,
        "resume": True,
    }
    run = world.api.trigger("wordcount_restore", conf)
    assert world.api.wait_run("wordcount_restore", run, 240) == "success"
    assert world.api.dag("wordcount_pipeline")["is_paused"] is False
    assert world.api.wait_run("wordcount_pipeline", slow_run, 120) == "failed"
    wait_for(
        "the cancelled range checkpointed", lambda: _offsets_done(world, 250), 240, world.airflow
    )
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))


def test_an_epoch_task_marked_failed_is_named_in_the_abort_and_its_range_read_again(
    world: World,
):
    # A task killed without raising (here a person marks the running epoch task failed;
    # an out-of-memory kill is the same to Airflow) writes no decline: the abort names the
    # run's failed task from Airflow's task states.
    world.api.set_paused("wordcount_pipeline", False)  # as the story leaves it (or alone)
    _more_lines(world, wordcount.lines_for(40, seed=36))
    flying = _slow_epoch_in_flight(world)
    run = world.rows()[flying]["labels"]["run_id"]
    wait_for("the slow epoch to hold", lambda: not world.slow_flag.exists(), 60, world.airflow)
    world.api.set_task_state("wordcount_pipeline", run, "process_epoch", "failed")
    aborted = wait_for(
        "the checkpoint aborted",
        lambda: [r for i, r in world.rows().items() if i == flying and r["status"] == "ABORTED"],
        120,
        world.airflow,
    )[0]
    assert (aborted["reason"], aborted["detail"]) == (
        "DECLINED",
        f"task process_epoch of Airflow run {run} failed",
    )
    assert aborted.get("failed_task") is None  # no subtask declined: the edge named it
    assert world.api.wait_run("wordcount_pipeline", run, 120) == "failed"
    states = world.api.task_states("wordcount_pipeline", run)
    assert (states["process_epoch"], states["abort_on_failure"]) == ("failed", "success")
    total = len(world.lines) // 2
    wait_for("the range read again", lambda: _offsets_done(world, total), 240, world.airflow)
    rows = world.rows()
    again = min(i for i, r in rows.items() if i > flying and r["status"] == "COMPLETED")
    assert rows[again]["ranges"] == aborted["ranges"]
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))


def test_a_task_notes_its_run_through_the_real_api(world: World, monkeypatch):
    # A restore that falls back to an older checkpoint notes it on its run this way.
    from microcheckpoint_airflow.hooks import AirflowApiHook

    api = world.api
    host, _, port = api.base_url.removeprefix("http://").partition(":")
    conn = {"conn_type": "http", "host": host, "port": int(port), "schema": "http"}
    conn.update(login=api.username, password=api.password)
    monkeypatch.setenv("AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API", json.dumps(conn))
    run_id = api.runs("wordcount_restore")[-1]["dag_run_id"]
    note = "Restored from s3://b/chk-1. FELL BACK to checkpoint 1 because " + "x" * 1200
    AirflowApiHook().set_note("wordcount_restore", run_id, note)
    assert api.run("wordcount_restore", run_id)["note"] == note[:1000]


def _hourly_done(world: World, count: int) -> bool:
    rows = world.rows("wordcount_hourly")
    return len([r for r in rows.values() if r["status"] == "COMPLETED"]) >= count


def _hourly_state(world: World) -> dict[str, Any]:
    """What a failed wait shows: checkpoints, backfills and runs of the hourly pipeline."""
    dag = "wordcount_hourly_pipeline"
    return {
        "checkpoints": [
            {k: r.get(k) for k in ("id", "status", "reason", "records", "labels")}
            for r in world.rows("wordcount_hourly").values()
        ],
        "backfills": world.api.backfills(dag),
        "runs": [
            {k: r.get(k) for k in ("dag_run_id", "logical_date", "state", "run_type", "conf")}
            for r in world.api.runs(dag)
        ],
    }


def test_backfill_over_past_hours_and_again_from_an_older_checkpoint(world: World):
    # The wordcount story is over: pausing it leaves both cores to the hourly epochs.
    world.api.set_paused("wordcount_pipeline", True)
    # The backfill over hours 0-2 was created when Airflow started.
    state = lambda: _hourly_state(world)  # noqa: E731
    wait_for("three hourly checkpoints", lambda: _hourly_done(world, 3), 300, world.airflow, state)
    rows = world.rows("wordcount_hourly")
    hour = lambda h: (T0 + timedelta(hours=h)).isoformat()  # noqa: E731
    assert [rows[i]["labels"]["data_interval"] for i in (1, 2, 3)] == [
        [hour(0), hour(1)],
        [hour(1), hour(2)],
        [hour(2), hour(3)],
    ]
    assert [rows[i]["records"] for i in (1, 2, 3)] == PER_HOUR
    assert read_keyed_state(world.store, "wordcount_hourly", "word-counts") == dict(
        wordcount.expected(world.hourly_lines)
    )
    # Re-base on checkpoint 1 and backfill hours 1-2 again: replayed once, not added twice.
    conf = {"point": "1", "claim_mode": "NO_CLAIM", "resume": True}
    run = world.api.trigger("wordcount_hourly_restore", conf)
    assert world.api.wait_run("wordcount_hourly_restore", run, 240) == "success"
    # The client completes a backfill that Airflow stored with only some of its runs (a
    # locked SQLite), so one or two backfills replay the two hours.
    made = world.api.backfill(
        "wordcount_hourly_pipeline",
        (T0 + timedelta(hours=1)).isoformat(),
        (T0 + timedelta(hours=2)).isoformat(),
        reprocess="completed",
    )
    assert 1 <= len(made) <= 2
    wait_for("two replayed checkpoints", lambda: _hourly_done(world, 5), 300, world.airflow, state)
    rows = world.rows("wordcount_hourly")
    assert [rows[i]["labels"]["data_interval"] for i in (4, 5)] == [
        [hour(1), hour(2)],
        [hour(2), hour(3)],
    ]
    assert [rows[i]["records"] for i in (4, 5)] == PER_HOUR[1:]
    assert max(rows) == 5  # each hour replayed once
    assert rows[4]["ranges"] == rows[2]["ranges"]
    assert read_keyed_state(world.store, "wordcount_hourly", "word-counts") == dict(
        wordcount.expected(world.hourly_lines)
    )


def _get(url: str, token: str | None = None, cookie: bool = False) -> tuple[int, bytes]:
    """GET ``url`` anonymously, with a bearer token, or as the UI does (its session cookie)."""
    request = urllib.request.Request(url)
    if token and cookie:
        request.add_header("Cookie", f"_token={token}")
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_history_page_serves_the_stored_history_behind_the_login(world: World):
    base = world.airflow.url + "/microcheckpoint"
    pages = ["/", "/api/pipelines", "/api/pipelines/wordcount", "/api/openapi.json"]
    # Anonymous: the JSON API answers 401, its schema included; the page itself sends a
    # person to the login (test_an_anonymous_person_is_sent_to_the_login_and_back_to_the_page).
    assert [_get(base + page)[0] for page in pages[1:]] == [401, 401, 401]
    assert _get(base + "/docs", world.api.token())[0] == 404
    token = world.api.token()
    status, body = _get(base + "/api/pipelines/wordcount", token)
    assert status == 200
    served = json.loads(body)
    stored = world.history()
    assert [r["id"] for r in served["checkpoints"]] == [r["id"] for r in stored["checkpoints"]]
    assert served["savepoints"] == stored["savepoints"]
    # A logged-in user inside the UI: the page comes with the UI's session cookie.
    status, body = _get(base + "/?pipeline=wordcount", token, cookie=True)
    page = body.decode()
    assert status == 200 and '">wordcount</a>' in page and "EXPIRED" in page
    status, body = _get(base + "/api/openapi.json", token)
    assert status == 200 and "/api/pipelines/{name}" in json.loads(body)["paths"]


def _page_counts(page) -> dict[str, int]:
    return page.eval_on_selector_all(
        "[data-count]",
        "els => Object.fromEntries(els.map(e => [e.dataset.count, +e.querySelector('.n').textContent]))",
    )


def _shown(counts: dict[str, int]) -> dict[str, int]:
    """The counts the page shows (``unreadable`` only when there are some)."""
    keys = ["triggered", "in_progress", "completed", "failed", "restored"]
    return {k: counts[k] for k in keys + (["unreadable"] if counts["unreadable"] else [])}


def test_a_person_logs_in_and_reads_the_checkpoints_page_in_a_browser(world: World):
    base = world.airflow.url
    broken = Layout("wordcount_hourly").metadata(CheckpointId(3))
    original = world.store.get(broken)
    assert original is not None
    with chromium() as browser:
        page = browser.new_page()
        # Anonymous: the page sends the browser to the login; its API answers 401.
        page.goto(base + "/microcheckpoint/")
        assert urlsplit(page.url).path == "/auth/login"
        assert page.goto(base + "/microcheckpoint/api/pipelines/wordcount").status == 401
        # Log in through Airflow's own login form.
        page.goto(base + "/auth/login")
        page.fill("input[name=username]", world.airflow.username)
        page.fill("input[name=password]", world.airflow.password)
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)
        # The Checkpoints entry of Airflow's navigation shows the page inside the UI.
        page.goto(base + "/plugin/checkpoints")
        frame = page.frame_locator("iframe")
        frame.locator("[data-count=completed]").wait_for(timeout=60_000)
        frame.locator("nav.tabs a", has_text="wordcount").first.click()
        frame.locator("a.on", has_text="wordcount").wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(SHOTS / "airflow-checkpoints.png"))

        # The page itself agrees with storage: counts, history rows and each plot's points.
        def agrees() -> bool:
            page.goto(base + "/microcheckpoint/?pipeline=wordcount")
            stored = world.history()
            rows = [r for r in stored["checkpoints"] if "error" not in r]
            timed = sum(1 for r in rows if "duration_ms" in r)
            sized = sum(1 for r in rows if r["status"] == "COMPLETED")
            return (
                _page_counts(page) == _shown(stored["counts"])
                and page.locator("a[href*='checkpoint=']:not([data-first-checkpoint])").count()
                == len(stored["checkpoints"])
                and page.get_attribute("svg[aria-label='End-to-end duration']", "data-points")
                == str(timed)
                and page.locator("svg[aria-label='End-to-end duration'] circle").count() == timed
                and page.get_attribute("svg[aria-label='Full checkpoint size']", "data-points")
                == str(sized)
            )

        wait_for("the page to show what storage holds", agrees, 60, world.airflow)
        stored = world.history()
        assert stored["counts"]["completed"] >= 4 and stored["counts"]["failed"] >= 1
        assert page.locator("text=" + world.savepoint).count() >= 1  # the latest savepoint
        assert page.locator("[data-replay]").count() == 0  # input of today: replayable
        page.screenshot(path=str(SHOTS / "checkpoints-page.png"), full_page=True)
        # The Restores section: every restore and cancel of the stories above, as stored,
        # newest first; a DAG's run is linked; the times to the first checkpoint agree.
        restores = stored["restores"]
        kinds = {r["kind"] for r in restores}
        assert {"restore", "cancel"} <= kinds, restores
        shown = page.eval_on_selector_all(
            "tr[data-restore]", "els => els.map(e => [e.dataset.restore, e.dataset.kind])"
        )
        assert shown == [[r["id"], r["kind"]] for r in restores]
        for r in restores:
            row = page.locator(f'tr[data-restore="{r["id"]}"]')
            if r["labels"].get("run_id"):
                run = urllib.parse.quote(r["labels"]["run_id"], safe="")
                assert row.locator(f'a[href$="/runs/{run}"]').count() == 1, r
            cell = row.locator("td[data-part=time_to_first_checkpoint_ms]")
            ms = r["time_to_first_checkpoint_ms"]
            assert cell.get_attribute("data-ms") == (None if ms is None else str(ms))
        timed = [r for r in restores if r["time_to_first_checkpoint_ms"] is not None]
        assert timed, "a checkpoint completed after a restore"
        summary = page.locator("[data-restores-summary]").inner_text()
        assert summary.startswith(f"{len(restores)} in all: ") and f"(over {len(timed)})" in summary
        page.evaluate("window.scrollTo(0, 0)")
        top = page.locator("h2#restores").bounding_box()
        end = page.locator("section[data-restores]").bounding_box()
        assert top is not None and end is not None
        page.screenshot(
            path=str(SHOTS / "checkpoints-restores.png"),
            full_page=True,
            clip={
                "x": 0,
                "y": top["y"] - 12,
                "width": 1400,
                "height": end["y"] + end["height"] - top["y"] + 24,
            },
        )
        latest = stored["latest_completed"]
        page.goto(base + f"/microcheckpoint/?pipeline=wordcount&checkpoint={latest}")
        subtasks = page.locator("tr[data-task]").count()  # the details' subtask rows
        assert subtasks == len(checkpoint_detail(world.store, "wordcount", latest)["subtasks"]) > 0
        # A corrupt _metadata is one row with its error; the API answers it too.
        world.store.put(broken, b"{ not json")
        try:
            page.wait_for_timeout(6000)  # past the page's cache of storage reads
            page.goto(base + "/microcheckpoint/?pipeline=wordcount_hourly")
            row = page.locator("tr", has=page.locator("a", has_text="#3"))
            assert "UNREADABLE" in row.inner_text() and "is corrupt (not JSON" in row.inner_text()
            counts = _page_counts(page)
            assert counts["unreadable"] == 1 and counts["restored"] == 1  # step 4's restore
            assert page.locator(
                "a[href*='checkpoint=']:not([data-first-checkpoint])"
            ).count() == len(world.history("wordcount_hourly")["checkpoints"])
            row.evaluate("el => el.scrollIntoView({block: 'center'})")
            page.screenshot(path=str(SHOTS / "checkpoints-unreadable.png"))
            answer = page.request.get(base + "/microcheckpoint/api/pipelines/wordcount_hourly")
            assert answer.status == 200
            # Its input carries March's timestamps: past the 7 days of Kafka's default
            # retention, so the page warns about each retained point's partitions.
            replay = answer.json()["replay_warnings"]
            assert replay and {w["severity"] for w in replay} == {"soon"}
            assert page.get_attribute("[data-replay]", "data-replay") == str(len(replay))
            # The epoch task logs them too, after notifying (no retention task runs).
            logs = world.airflow.home / "logs" / "dag_id=wordcount_hourly_pipeline"
            logged = [
                line
                for log in logs.glob("run_id=*/task_id=process_epoch/attempt=*.log")
                for line in log.read_text().splitlines()
                if "replayability: " in line
            ]
            assert logged and all("retention.ms" in line for line in logged), logs
            served = {r["id"]: r for r in answer.json()["checkpoints"]}
            assert "corrupt" in served[3]["error"] and "error" not in served[2]
            missing = page.request.get(base + "/microcheckpoint/api/pipelines/nope")
            assert missing.status == 404
            assert missing.json()["detail"].startswith("no pipeline 'nope' that you may read")
            gone = page.request.get(
                base + "/microcheckpoint/api/pipelines/wordcount/checkpoints/9999"
            )
            assert gone.status == 404 and "has no checkpoint 9999" in gone.json()["detail"]
        finally:
            world.store.put(broken, original.data)


def _log_in(page, world: World) -> None:
    """Fill and send Airflow's own login form (the page must show it)."""
    page.fill("input[name=username]", world.airflow.username)
    page.fill("input[name=password]", world.airflow.password)
    page.click("button[type=submit]")


def _hourly_completed(world: World) -> int:
    return wait_for(
        "a completed checkpoint of wordcount_hourly (the fixture's backfill)",
        lambda: world.history("wordcount_hourly")["latest_completed"],
        300,
        world.airflow,
    )


def test_an_anonymous_person_is_sent_to_the_login_and_back_to_the_page(world: World):
    base = world.airflow.url
    wanted = "/microcheckpoint/?pipeline=wordcount_hourly"
    with chromium() as browser:
        page = browser.new_page()
        # The JSON API keeps answering 401 with its JSON body: a client is not a person.
        answer = page.request.get(base + "/microcheckpoint/api/pipelines")
        assert (answer.status, answer.json()) == (401, {"detail": "Not authenticated"})
        # The page's own CSS and script (no data in them: served without a login).
        for name in ("checkpoints.css", "checkpoints.js"):
            assert page.request.get(f"{base}/microcheckpoint/static/{name}").status == 200
        # The page sends a person to Airflow's login form, with the way back ...
        page.goto(base + wanted)
        page.locator("input[name=username]").wait_for(timeout=30_000)
        login = urlsplit(page.url)
        assert (login.path, parse_qs(login.query)) == ("/auth/login", {"next": [wanted]})
        # ... and after the login, the page itself.
        _log_in(page, world)
        page.wait_for_url(base + wanted, timeout=60_000)
        assert page.locator("nav.tabs a.on").inner_text() == "wordcount_hourly"
        assert page.locator("[data-count=triggered]").count() == 1


def _newest(world: World, names: list[str]) -> str:
    """Of ``names``, the pipeline whose newest checkpoint was triggered last (in storage)."""
    latest = {}
    for name in names:
        rows = world.history(name)["checkpoints"]
        times = [r["trigger_time_ms"] for r in rows if "trigger_time_ms" in r]
        if times:
            latest[name] = max(times)
    return max(latest, key=lambda name: latest[name])


def test_the_checkpoints_menu_opens_on_the_pipeline_with_the_newest_checkpoint(world: World):
    base = world.airflow.url
    _hourly_completed(world)
    status, body = _get(base + "/microcheckpoint/api/pipelines", world.api.token())
    names = sorted(json.loads(body))
    assert status == 200 and {"nexmark-hot-items", "wordcount_hourly"} <= set(names)
    with chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/auth/login")
        _log_in(page, world)
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)
        before = _newest(world, names)
        page.goto(base + "/plugin/checkpoints")  # Airflow's menu entry
        frame = page.frame_locator("iframe")
        frame.locator("[data-count=triggered]").wait_for(timeout=60_000)
        shown = frame.locator("nav.tabs a.on").inner_text()
        after = _newest(world, names)
        # Not the alphabetically first pipeline (nexmark-hot-items, nothing triggered yet).
        assert shown in {before, after}
        assert int(frame.locator("[data-count=triggered] .n").inner_text()) > 0


def test_checkpoint_details_show_each_subtasks_sync_and_async_parts(world: World):
    base = world.airflow.url
    latest = _hourly_completed(world)
    path = f"/microcheckpoint/api/pipelines/wordcount_hourly/checkpoints/{latest}"
    status, body = _get(base + path, world.api.token())
    assert status == 200
    subtasks = json.loads(body)["subtasks"]
    operators = json.loads(body)["operators"]
    # Every subtask: a real end to end (trigger to ack), and its sync and async parts
    # (snapshot written locally; upload) within it; one with files took time to write them.
    for s in subtasks:
        assert s["end_to_end_ms"] > 0, s
        assert s["sync_ms"] + s["async_ms"] <= s["end_to_end_ms"], s
        assert s["sync_ms"] > 0 or not s["files"], s
    by_uid: dict[str, list[dict[str, Any]]] = {}
    for s in subtasks:
        by_uid.setdefault(s["task"].rsplit("#", 1)[0], []).append(s)
    assert set(operators) == set(by_uid) and {"word-counts", "lines-source"} <= set(by_uid)
    # The keyed operator uploaded its changed keys (the source's snapshot is its offsets).
    assert operators["word-counts"]["async_ms"]["max"] > 0
    assert operators["lines-source"]["async_ms"]["max"] == 0
    for uid, rows in by_uid.items():
        for part in ("end_to_end_ms", "sync_ms", "async_ms"):
            values = [r[part] for r in rows]
            assert operators[uid]["subtasks"] == len(rows)
            assert operators[uid][part]["min"] == min(values)
            assert operators[uid][part]["max"] == max(values)
    with chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/auth/login")
        _log_in(page, world)
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)
        page.goto(base + f"/microcheckpoint/?pipeline=wordcount_hourly&checkpoint={latest}")
        for s in subtasks:
            row = page.locator(f"tr[data-task='{s['task']}']")
            shown = row.locator("td[data-ms]").evaluate_all(
                "tds => Object.fromEntries(tds.map(td => [td.dataset.part, +td.dataset.ms]))"
            )
            assert shown == {k: s[k] for k in ("end_to_end_ms", "sync_ms", "async_ms")}
            assert row.locator("td[data-part=end_to_end_ms]").inner_text() != "0 ms"
        assert page.locator("tr[data-operator]").count() == len(by_uid)
        # The subtask that finished last, its phases adding up to its end to end, and why.
        slowest = json.loads(body)["slowest"]
        last = max(subtasks, key=lambda s: s["end_to_end_ms"])
        assert (slowest["task"], slowest["end_to_end_ms"]) == (last["task"], last["end_to_end_ms"])
        assert sum(slowest["phases"].values()) == pytest.approx(last["end_to_end_ms"], abs=1)
        assert slowest["why"] == max(slowest["phases"], key=slowest["phases"].get)
        panel = page.locator(f"[data-slowest='{slowest['task']}']")
        assert panel.get_attribute("data-why") == slowest["why"]
        shown = panel.locator("td[data-ms]").evaluate_all(
            "tds => Object.fromEntries(tds.map(td => [td.dataset.part, +td.dataset.ms]))"
        )
        assert shown == {"end_to_end_ms": slowest["end_to_end_ms"], **slowest["phases"]}
        assert panel.locator("strong").inner_text() == slowest["why"]


def test_stored_timestamps_prove_min_pause_and_max_concurrent(world: World):
    rows = sorted(
        (r for r in world.rows().values() if "trigger_time_ms" in r and "end_time_ms" in r),
        key=lambda r: r["id"],
    )
    assert len(rows) >= 5  # two epochs, the expired one, its re-read, one after restore
    completed = [r for r in rows if r["status"] == "COMPLETED"]
    for earlier, later in itertools.pairwise(rows):
        # max_concurrent = 1 (min_pause > 0 forces it): no two checkpoints overlap.
        assert later["trigger_time_ms"] >= earlier["end_time_ms"], (earlier, later)
    for row in rows[1:]:
        done = [c for c in completed if c["end_time_ms"] <= row["trigger_time_ms"]]
        if done:
            gap = row["trigger_time_ms"] - max(c["end_time_ms"] for c in done)
            assert gap >= MIN_PAUSE_S * 1000, (row["id"], gap)
    # The scheduler had runs waiting (interval 10 s < epoch + pause), so the gaps come from the
    # pause being enforced, not from idle time: the epoch task of some runs found the pause
    # not yet over and waited it out in the task (a short pause is not deferred).
    logs = world.airflow.home / "logs" / "dag_id=wordcount_pipeline"
    waited = [
        log
        for log in logs.glob("run_id=*/task_id=process_epoch/attempt=*.log")
        if re.search(
            r"min pause and max concurrent: [\d.]+s since checkpoint \d+ completed, "
            rf"min_pause={MIN_PAUSE_S}\.0s; waiting [\d.]+ s in the task",
            log.read_text(),
        )
    ]
    assert waited, f"no process_epoch run waited for the min pause under {logs}"


def test_a_backfill_from_a_savepoint_replays_exactly_the_hours_after_it(world: World):
    # The hourly story is over (step 4, the page's reads): nothing of it is in flight.
    dag = "wordcount_hourly_pipeline"
    world.api.quiesce(dag)
    world.api.set_paused(dag, False)
    rows = world.rows("wordcount_hourly")
    hour = lambda h: (T0 + timedelta(hours=h)).isoformat()  # noqa: E731
    # A savepoint of checkpoint 1 (hour 0), taken by the core function the savepoint DAG
    # runs (that DAG takes the latest checkpoint only).
    url = create_savepoint(world.store, "wordcount_hourly", CheckpointId(1))
    folder = url.removeprefix(world.store.url + "/") + "/"
    saved = {k: world.store.get(k).data for k in world.store.list(folder)}
    # Restore it through the restore DAG's REST trigger (the UI's form), then backfill hour
    # 1 through POST /api/v2/backfills (the UI's Backfill form).
    conf = {"point": url, "claim_mode": "NO_CLAIM", "resume": True}
    run = world.api.trigger("wordcount_hourly_restore", conf)
    assert world.api.wait_run("wordcount_hourly_restore", run, 240) == "success"
    assert world.history("wordcount_hourly")["restored_from"] == url
    made = world.api.backfill(dag, hour(1), hour(1), reprocess="completed")
    assert len(made) == 1
    state = lambda: _hourly_state(world)  # noqa: E731
    top = max(rows)
    wait_for("the hour replayed", lambda: _hourly_done(world, top + 1), 300, world.airflow, state)
    new = world.rows("wordcount_hourly")
    assert max(new) == top + 1  # one checkpoint: hour 1
    replay = new[top + 1]
    assert (replay["status"], replay["labels"]["data_interval"]) == (
        "COMPLETED",
        [hour(1), hour(2)],
    )
    assert replay["labels"]["restored_from"] == url
    # Exactly hour 1's records, from where the savepoint's offsets end (hour 0's end).
    assert replay["records"] == PER_HOUR[1]
    assert replay["ranges"] == rows[2]["ranges"]
    # The state is exactly hours 0 and 1 (storage held all three hours before the restore).
    first_two = world.hourly_lines[: PER_HOUR[0] + PER_HOUR[1]]
    assert read_keyed_state(world.store, "wordcount_hourly", "word-counts") == dict(
        wordcount.expected(first_two)
    )
    # The group offsets moved back to hour 1's end with it; the savepoint is untouched.
    ends = {int(tp.rsplit(":", 1)[1]): end for tp, (_, end) in replay["ranges"].items()}
    assert len(ends) == 2 and sum(ends.values()) == PER_HOUR[0] + PER_HOUR[1]
    tps = [TopicPartition(world.hourly_topic, p) for p in ends]
    with KafkaOffsets(world.bootstrap) as kafka:
        committed = kafka.committed_group_offsets("microcheckpoint-wordcount_hourly", tps)
    assert {tp.partition: o for tp, o in committed.items()} == ends
    assert {k: world.store.get(k).data for k in world.store.list(folder)} == saved


JOIN, HOT = "nexmark-join", "nexmark-hot-items"
COUNTS = "bids-per-item-window"


def _stage_state(world: World) -> dict[str, Any]:
    """What a failed wait on the stages shows: their checkpoints and runs."""
    return {
        name: {
            "checkpoints": [
                {k: r.get(k) for k in ("id", "status", "reason", "records", "labels")}
                for r in world.rows(name).values()
            ],
            "runs": [
                {k: r.get(k) for k in ("dag_run_id", "state", "run_type")}
                for r in world.api.runs(f"{name}_pipeline")
            ],
        }
        for name in (JOIN, HOT)
    }


def _counted(world: World, truth: dict[str, int], after: int = 0) -> bool:
    """The second stage's latest completed checkpoint (newer than ``after``) holds ``truth``."""
    latest = world.history(HOT)["latest_completed"]
    if latest is None or latest <= after:
        return False
    return read_keyed_state(world.store, HOT, COUNTS) == truth


def test_stage_dags_run_on_asset_events_and_restore_globally(world: World):
    topics = world.nexmark
    auctions, bids = nexmark_stages.generate(seed=12, auctions=8, bids=90)
    nexmark_stages.produce(world.bootstrap, topics["auctions"], auctions)
    nexmark_stages.produce(world.bootstrap, topics["bids"], bids[:60])
    world.api.wait_dags(
        [
            f"{JOIN}_pipeline",
            f"{HOT}_pipeline",
            "nexmark_global_savepoint",
            "nexmark_global_restore",
        ]
    )
    world.api.set_paused(f"{HOT}_pipeline", False)
    world.api.set_paused(f"{JOIN}_pipeline", False)
    state = lambda: _stage_state(world)  # noqa: E731
    first = dict(nexmark_stages.truth(auctions, bids[:60]))
    wait_for(
        "stage 2 counting the first bids", lambda: _counted(world, first), 300, world.airflow, state
    )

    # Stage 2 ran only on stage 1's Asset events, each run past its alignment sensor, and
    # every checkpoint it completed is aligned on one stage-1 epoch.
    # The counts are in storage a moment before the epoch task itself ends: wait for it.
    def hot_runs() -> list[dict[str, Any]] | None:
        runs = world.api.runs(f"{HOT}_pipeline")
        tasks = [world.api.task_states(f"{HOT}_pipeline", r["dag_run_id"]) for r in runs]
        done = any(t.get("process_epoch") == "success" for t in tasks)
        return [{**r, "tasks": t} for r, t in zip(runs, tasks, strict=True)] if done else None

    runs = wait_for("a stage-2 epoch task to succeed", hot_runs, 120, world.airflow)
    assert {r["run_type"] for r in runs} == {"asset_triggered"}
    epochs = [r["tasks"] for r in runs if r["tasks"].get("process_epoch") == "success"]
    assert epochs and all(t["wait_aligned"] == "success" for t in epochs), runs
    join_done = {i for i, r in world.rows(JOIN).items() if r["status"] == "COMPLETED"}
    for row in world.rows(HOT).values():
        if row["status"] == "COMPLETED":
            alignment = row["labels"]["alignment"]
            assert alignment["mode"] == "aligned" and alignment["inflight"] == []
            assert alignment["upstream"] == JOIN and alignment["epoch"] in join_done
    # A global savepoint at the newest aligned cut.
    run = world.api.trigger("nexmark_global_savepoint", {"target": ""})
    assert world.api.wait_run("nexmark_global_savepoint", run, 120) == "success"
    location = world.api.xcom("nexmark_global_savepoint", run, "take_global_savepoint")
    assert location.startswith(f"s3://{world.store.bucket}/chk/nexmark/global-savepoints/global-")
    # More bids: both stages count them, then abandon that work in the restore.
    nexmark_stages.produce(world.bootstrap, topics["bids"], bids[60:], partitions=2)
    truth = dict(nexmark_stages.truth(auctions, bids))
    wait_for(
        "stage 2 counting every bid", lambda: _counted(world, truth), 300, world.airflow, state
    )
    before = max(world.rows(HOT))
    conf = {
        "point": location,
        "claim_mode": "NO_CLAIM",
        "parallelism": {JOIN: 1, HOT: 3},
        "resume": True,
    }
    run = world.api.trigger("nexmark_global_restore", conf)
    assert world.api.wait_run("nexmark_global_restore", run, 300) == "success"
    for name in (JOIN, HOT):
        assert world.history(name)["restored_from"].startswith(location + "/" + name + "/")
    # Both stages re-run the work after the cut; stage 2 skips what stage 1 abandoned, so
    # its counts equal a failure-free run's, now with 3 subtasks.
    wait_for(
        "stage 2 counting every bid after the global restore",
        lambda: _counted(world, truth, after=before),
        300,
        world.airflow,
        state,
    )
    latest = world.history(HOT)["latest_completed"]
    subtasks = world.rows(HOT)[latest]["statistics"]["subtasks"]
    assert sorted(t for t in subtasks if t.startswith(COUNTS)) == [
        f"{COUNTS}#{i}" for i in range(3)
    ]
    world.api.set_paused(f"{JOIN}_pipeline", True)
    world.api.set_paused(f"{HOT}_pipeline", True)


def _stored(world: World) -> dict[str, bytes]:
    """Every object of the checkpoint storage (all pipelines), listed and read."""
    objects = {}
    for key in sorted(world.store.list()):
        stored = world.store.get(key)
        assert stored is not None, f"{key} was listed, then gone: something is writing"
        objects[key] = stored.data
    return objects


def _failure(world: World, dag_id: str, run_id: str, task_id: str) -> tuple[int, list[str]]:
    """The try number of a failed task and the exception messages its log shows (REST API)."""
    path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/{task_id}"
    task = world.api.get(path)
    assert task["state"] == "failed", task
    log = world.api.get(f"{path}/logs/{task['try_number']}?full_content=true")
    errors = [
        f"{detail['exc_type']}: {detail['exc_value']}"
        for entry in log["content"]
        if isinstance(entry, dict)
        for detail in entry.get("error_detail") or []
    ]
    return task["try_number"], errors


UNKNOWN_KEY = "config field {key!r} = {value!r} is invalid: "
# One misspelt key per DAG kind: the DAG, the conf sent, its first task, the message after
# UNKNOWN_KEY.
REFUSED = [
    (
        "wordcount_restore",
        {"point": "latest", "paralelism": 3},
        "validate_point",
        "not a field of wordcount_restore's form; did you mean 'parallelism'? known: "
        "allow_non_restored_state, claim_mode, parallelism, point, resume",
    ),
    (
        "wordcount_savepoint",
        {"targt": "", "stop": True},
        "validate_target",
        "not a field of wordcount_savepoint's form; did you mean 'target'? known: stop, target",
    ),
    (
        "wordcount_cancel",
        {"cleanp": "DELETE_ON_CANCELLATION"},
        "cancel",
        "not a field of wordcount_cancel's form; did you mean 'cleanup'? known: cleanup",
    ),
    (
        "wordcount_hourly_pipeline",
        {"paralelism": 3},
        "process_epoch",
        "wordcount_hourly_pipeline declares no params; trigger it without a conf",
    ),
    (
        "nexmark_global_restore",
        {"point": "s3://nowhere/global", "paralelism": {HOT: 2}},
        "validate_point",
        "not a field of nexmark_global_restore's form; did you mean 'parallelism'? known: "
        "claim_mode, parallelism, point, resume",
    ),
    (
        "nexmark_global_savepoint",
        {"targt": ""},
        "take_global_savepoint",
        "not a field of nexmark_global_savepoint's form; did you mean 'target'? known: target",
    ),
]


def _idle(world: World) -> list[str]:
    """Pause the pipelines that a trigger must not find running, with no run half done, and
    let the hourly backfill end (its DAG stays active: its schedule ended, runs it is given
    still run); returns the pipeline DAGs."""
    if world.history()["latest_completed"] is None:  # this test alone: one checkpoint first
        world.api.set_paused("wordcount_pipeline", False)
        wait_for(
            "a wordcount checkpoint",
            lambda: world.history()["latest_completed"],
            300,
            world.airflow,
            lambda: {
                run["dag_run_id"]: world.api.task_states("wordcount_pipeline", run["dag_run_id"])
                for run in world.api.runs("wordcount_pipeline")
            },
        )
    for dag_id in ("wordcount_pipeline", f"{JOIN}_pipeline", f"{HOT}_pipeline"):
        world.api.quiesce(dag_id)
    hourly = "wordcount_hourly_pipeline"
    wait_for(
        "the hourly backfill to end",
        lambda: (
            _hourly_done(world, 3)
            and all(r["state"] in ("success", "failed") for r in world.api.runs(hourly))
        ),
        300,
        world.airflow,
        lambda: _hourly_state(world),
    )
    return ["wordcount_pipeline", hourly, f"{JOIN}_pipeline", f"{HOT}_pipeline"]


def _events_done(world: World, ends: int) -> bool:
    history = world.history("wordcount_events")
    latest = history["latest_completed"]
    if latest is None:
        return False
    row = next(r for r in history["checkpoints"] if r["id"] == latest)
    return row["notified"] and all(end == ends for _, end in row["ranges"].values())


def test_records_arriving_start_event_driven_runs_without_a_schedule_tick(world: World):
    dag = "wordcount_events_pipeline"
    world.api.wait_dags([dag])
    world.api.set_paused(dag, False)
    # Idle: the DAG has no timetable, and its watcher (attached at the next parse, within
    # the processor's 10 s refresh) sees no record: no run starts.
    time.sleep(12)
    assert world.api.runs(dag) == []
    lines: list[str] = []
    for seed, count in ((51, 40), (52, 30)):
        more = wordcount.lines_for(count, seed=seed)
        wordcount.produce(world.bootstrap, world.events_topic, more, create=False)
        lines += more
        end = len(lines) // 2  # produced round robin over 2 partitions
        wait_for(
            f"a notified checkpoint of wordcount_events ending at {end}",
            lambda end=end: _events_done(world, end),
            240,
            world.airflow,
        )
        counts = read_keyed_state(world.store, "wordcount_events", "word-counts")
        assert counts == dict(wordcount.expected(lines))
    # Records that arrive while a run is in flight queue at most one more run. Once the
    # watcher has read every record and no run is in flight, it stays idle.
    tps = [TopicPartition(world.events_topic, p) for p in (0, 1)]

    def settled() -> bool:
        with KafkaOffsets(world.bootstrap) as kafka:
            read = kafka.committed_group_offsets("microcheckpoint-watch-wordcount_events", tps)
        runs = world.api.runs(dag)
        done = all(r["state"] in ("success", "failed") for r in runs)
        return done and {tp.partition: o for tp, o in read.items()} == {0: 35, 1: 35}

    wait_for("the watcher at the log end and no run in flight", settled, 120, world.airflow)
    before = len(world.api.runs(dag))
    time.sleep(8)
    runs = world.api.runs(dag)
    assert len(runs) == before
    # Every run came from the watcher's asset events, none from a schedule tick.
    assert {r["run_type"] for r in runs} == {"asset_triggered"}, runs
    assert all(r["state"] == "success" for r in runs), runs
    # Each checkpoint names its run; consecutive triggers are at least the min pause apart
    # (from the previous completion, which is later than its trigger).
    rows = sorted(
        (r for r in world.history("wordcount_events")["checkpoints"] if r["status"] == "COMPLETED"),
        key=lambda r: r["id"],
    )
    assert {r["labels"]["run_id"] for r in rows} <= {r["dag_run_id"] for r in runs}
    starts = [r["trigger_time_ms"] for r in rows]
    assert all(b - a >= EVENTS_MIN_PAUSE_S * 1000 for a, b in itertools.pairwise(starts)), starts
    # Two bursts: two runs each at most (a record read while a run is in flight queues one).
    assert 2 <= len(runs) <= 4, [(r["dag_run_id"], r["run_type"]) for r in runs]
    world.api.set_paused(dag, True)


def test_a_misspelt_trigger_key_fails_the_first_task_and_writes_nothing(world: World):
    world.api.wait_dags([dag_id for dag_id, *_ in REFUSED])
    pipelines = _idle(world)
    paused = {dag_id: world.api.dag(dag_id)["is_paused"] for dag_id in pipelines}
    assert paused["wordcount_pipeline"] is True  # a restore would unpause it
    before = _stored(world)
    assert any(key.startswith("wordcount/chk-") for key in before)  # something to restore
    # Through the REST API, as the UI's Trigger form sends it.
    runs = [(dag_id, world.api.trigger(dag_id, conf)) for dag_id, conf, *_ in REFUSED]
    # And through `airflow dags trigger`, with the Airflow's own environment.
    cli_run = f"manual__misspelt-{uuid.uuid4().hex[:8]}"
    conf = {"paralelism": 3}
    command = [str(Path(sys.executable).with_name("airflow")), "dags", "trigger"]
    done = subprocess.run(
        [*command, "wordcount_restore", "--conf", json.dumps(conf), "--run-id", cli_run],
        env=world.airflow.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [(run, *case) for run, case in zip(runs, REFUSED, strict=True)]
    cases.append((("wordcount_restore", cli_run), "wordcount_restore", conf, *REFUSED[0][2:]))
    for (dag_id, run_id), _, sent, first, expected in cases:
        assert world.api.wait_run(dag_id, run_id, 240) == "failed", (dag_id, run_id)
        key = next(k for k in sorted(sent) if k in ("paralelism", "targt", "cleanp"))
        message = UNKNOWN_KEY.format(key=key, value=sent[key]) + expected
        # The first task failed at once (no retry), with the one-line message in its log.
        assert _failure(world, dag_id, run_id, first) == (
            1,
            [f"AirflowFailException: {message}"],
        ), dag_id
        states = world.api.task_states(dag_id, run_id)
        ran = {task for task, state in states.items() if state not in ("upstream_failed", None)}
        # Only the first task and the clean-up tasks that run when one fails have run.
        assert ran == {first} | {
            "wordcount_savepoint": {"resume_on_failure"},
            "wordcount_hourly_pipeline": {"abort_on_failure"},
        }.get(dag_id, set()), states
    # The savepoint run's clean-up found no stop of its own to undo.
    savepoint_run = runs[1][1]
    assert world.api.xcom("wordcount_savepoint", savepoint_run, "resume_on_failure") is False
    after = _stored(world)
    assert sorted(after) == sorted(before)
    assert after == before
    assert {dag_id: world.api.dag(dag_id)["is_paused"] for dag_id in pipelines} == paused


# ---- the edge contract through Airflow (docs/reliability.md, "Edge contract") -------------


def _misspelt(rnd: random.Random, key: str, declared: frozenset[str]) -> str:
    """``key`` with one character dropped, doubled, swapped or replaced (``rnd`` from
    Hypothesis, so a failure shows the draw); never a declared name."""
    while True:
        i = rnd.randrange(len(key) - 1)
        spelt = rnd.choice(
            [
                key[:i] + key[i + 1 :],
                key[:i] + key[i] + key[i:],
                key[:i] + key[i + 1] + key[i] + key[i + 2 :],
                key[:i] + rnd.choice("abcdefghijklmnopqrstuvwxyz") + key[i + 1 :],
            ]
        )
        if spelt not in declared:
            return spelt


# Each DAG's first task, the form field a generated misspelling stands for, the fields it
# declares, and the rest of a conf Airflow's own checks accept (a required field).
FORMS = {
    "wordcount_restore": (
        "validate_point",
        "claim_mode",
        {"allow_non_restored_state", "claim_mode", "parallelism", "point", "resume"},
        {},
    ),
    "wordcount_savepoint": ("validate_target", "stop", {"stop", "target"}, {}),
    "wordcount_cancel": ("cancel", "cleanup", {"cleanup"}, {}),
    "nexmark_global_restore": (
        "validate_point",
        "resume",
        {"claim_mode", "parallelism", "point", "resume"},
        {"point": "s3://elsewhere-bucket/global"},
    ),
    "nexmark_global_savepoint": ("take_global_savepoint", "target", {"target"}, {}),
}


def _edge_rows(world: World, misspelt: dict[str, str]) -> tuple[list, list]:
    """(API rows: DAG, bad input, conf, HTTP status, start of the error body; run rows: DAG,
    bad input, conf, first task, start of its exception line)."""
    root = f"s3://{world.store.bucket}/chk"
    outside = "s3://elsewhere-bucket/sp"
    api = [
        (
            "wordcount_restore",
            "wrong type",
            {"parallelism": "abc"},
            400,
            "Invalid input for param parallelism: 'abc' is not of type 'integer'",
        ),
        (
            "wordcount_restore",
            "out of range",
            {"parallelism": 999},
            400,
            "Invalid input for param parallelism: 999 is greater than the maximum of 128",
        ),
        (
            "wordcount_savepoint",
            "wrong type",
            {"stop": "yes"},
            400,
            "Invalid input for param stop: 'yes' is not of type 'boolean'",
        ),
        (
            "wordcount_cancel",
            "out of range",
            {"cleanup": "KEEP"},
            400,
            "Invalid input for param cleanup: 'KEEP' is not one of",
        ),
        (
            "nexmark_global_restore",
            "wrong type",
            {"point": "x", "parallelism": "x"},
            400,
            "Invalid input for param parallelism: 'x' is not of type 'object'",
        ),
        (
            "wordcont_restore",
            "misspelt pipeline",
            {"point": "latest"},
            404,
            "Dag with dag_id: 'wordcont_restore' not found",
        ),
    ]
    runs = [
        (
            "wordcount_restore",
            "missing point",
            {"point": "99999"},
            "validate_point",
            "checkpoint 99999 of 'wordcount' is not a completed checkpoint (completed: [",
        ),
        (
            "wordcount_restore",
            "wrong type",
            {"point": "7x"},
            "validate_point",
            "config field 'point' = '7x' is invalid: latest, a checkpoint id (7 or chk-7), or a "
            "savepoint folder URL",
        ),
        (
            "wordcount_restore",
            "another pipeline's point",
            {"point": f"{root}/wordcount_hourly/chk-0000000001"},
            "validate_point",
            f"{root}/wordcount_hourly/chk-0000000001 belongs to pipeline 'wordcount_hourly', not "
            "'wordcount'; restore a savepoint taken from this pipeline",
        ),
        (
            "wordcount_restore",
            "corrupt _metadata",
            {"point": f"{root}/wordcount/savepoints/edge-corrupt"},
            "validate_point",
            f"{root}/wordcount/savepoints/edge-corrupt/_metadata is corrupt (not JSON: ",
        ),
        (
            "wordcount_restore",
            "empty _metadata",
            {"point": f"{root}/wordcount/savepoints/edge-empty"},
            "validate_point",
            f"{root}/wordcount/savepoints/edge-empty/_metadata is corrupt (not JSON: ",
        ),
        (
            "wordcount_restore",
            "target outside the root",
            {"point": outside},
            "validate_point",
            f"config field 'point' = '{outside}' is invalid: a location under one of the "
            f"configured roots ({root})",
        ),
        (
            "wordcount_savepoint",
            "target outside the root",
            {"target": outside},
            "validate_target",
            f"config field 'target' = '{outside}' is invalid: a location under one of the "
            f"configured roots ({root})",
        ),
        (
            "nexmark_global_savepoint",
            "target outside the root",
            {"target": outside},
            "take_global_savepoint",
            f"config field 'target' = '{outside}' is invalid: ",
        ),
        (
            "nexmark_global_restore",
            "target outside the root",
            {"point": outside},
            "validate_point",
            f"config field 'point' = '{outside}' is invalid: ",
        ),
    ]
    for dag_id, (first, key, declared, rest) in FORMS.items():
        spelt = misspelt[dag_id]
        conf = {spelt: "x", **rest}
        known = ", ".join(sorted(declared))
        runs.append(
            (
                dag_id,
                "unknown key",
                conf,
                first,
                UNKNOWN_KEY.format(key=spelt, value="x") + f"not a field of {dag_id}'s form; "
                f"did you mean {key!r}? known: {known}",
            )
        )
    return api, runs


def _page_rows() -> list:
    """The Checkpoints page: route, bad input, HTTP status, start of the one error line."""
    known = "known: nexmark-hot-items, nexmark-join, wordcount, wordcount_events, wordcount_hourly"
    return [
        (
            "/api/pipelines/wordcont",
            "misspelt pipeline",
            404,
            f"no pipeline 'wordcont' that you may read; did you mean 'wordcount'? {known}",
        ),
        (
            "/api/pipelines/wordcount/checkpoints/99999",
            "missing point",
            404,
            "pipeline 'wordcount' has no checkpoint 99999 in s3://",
        ),
        (
            "/api/pipelines/wordcount/checkpoints/abc",
            "wrong type",
            422,
            "checkpoint = 'abc' is invalid: input should be a valid integer",
        ),
        (
            "/?pipeline=wordcont",
            "misspelt pipeline",
            200,
            f"no pipeline &#39;wordcont&#39; that you may read; did you mean &#39;wordcount&#39;? "
            f"{known}",
        ),
        (
            "/?pipeline=wordcount&checkpoint=x",
            "wrong type",
            422,
            "checkpoint = 'x' is invalid: input should be a valid integer",
        ),
    ]


@settings(max_examples=1, deadline=None, database=None, phases=[Phase.generate])
@given(data=st.data())
def test_every_dag_trigger_and_page_route_answers_bad_input_in_one_line(world: World, data):
    """The Airflow half of the edge contract: each DAG's REST trigger and each page route,
    a table of bad inputs; each row one line naming the thing, the value and the fix (the
    API's error body, or the failed first task's exception in its log), its status, and
    storage byte-identical (every object listed and read) before and after."""
    rnd = data.draw(st.randoms(use_true_random=True), label="misspellings")
    misspelt = {
        dag_id: _misspelt(rnd, key, frozenset(declared))
        for dag_id, (_, key, declared, _) in FORMS.items()
    }
    world.api.wait_dags(list(FORMS))
    pipelines = _idle(world)
    paused = {dag_id: world.api.dag(dag_id)["is_paused"] for dag_id in pipelines}
    damaged = {
        "wordcount/savepoints/edge-corrupt/_metadata": b"{not json",
        "wordcount/savepoints/edge-empty/_metadata": b"",
    }
    for key, body in damaged.items():
        world.store.put(key, body)
    api_rows, run_rows = _edge_rows(world, misspelt)
    table, problems = [], []
    try:
        before = _stored(world)
        # Refused by Airflow's API itself: its error body.
        for dag_id, bad, conf, status, start in api_rows:
            try:
                world.api.trigger(dag_id, conf)
                got, detail = 200, "accepted"
            except ApiError as exc:
                got, detail = exc.status, json.loads(exc.detail)["detail"]
            # Airflow's own param check: its first line names the param, the value and the
            # rule; jsonschema's dump of the schema follows it in the body.
            lines = str(detail).split("\n\n")[0].splitlines()
            table.append(
                (
                    f"REST {dag_id}",
                    bad,
                    json.dumps(conf),
                    got,
                    lines[0],
                    len(str(detail).split("\n")),
                )
            )
            if got != status or len(lines) != 1 or not lines[0].startswith(start):
                problems.append(f"[{dag_id} | {bad}] {got}: {detail!r}")
        # Refused by the run's first task, before anything is written.
        started = [(row, world.api.trigger(row[0], row[2])) for row in run_rows]
        for (dag_id, bad, conf, first, start), run_id in started:
            state = world.api.wait_run(dag_id, run_id, 240)
            tries, errors = _failure(world, dag_id, run_id, first)
            # The task fails with one line; a core error translated by ``task_errors`` is
            # shown below it as its cause, with the same message (and its own cause, a
            # JSONDecodeError for a corrupt _metadata, below that).
            messages = {e.split(": ", 1)[-1] for e in errors[:2]}
            line = errors[0] if errors else ""
            table.append((f"REST {dag_id}", bad, json.dumps(conf), state, line, len(errors)))
            if (
                (state, tries) != ("failed", 1)
                or not line.startswith("AirflowFailException: ")
                or len(messages) != 1
                or "\n" in line
                or not line.removeprefix("AirflowFailException: ").startswith(start)
            ):
                problems.append(f"[{dag_id} | {bad}] {state}, try {tries}: {errors!r}")
        # The page and its JSON routes.
        base, token = world.airflow.url + "/microcheckpoint", world.api.token()
        for route, bad, status, start in _page_rows():
            got, body = _get(base + route, token, cookie=not route.startswith("/api"))
            text = body.decode()
            if text.startswith("{"):
                line = str(json.loads(text)["detail"])
            else:
                found = re.search(r'data-error="1">[^:<]*: ([^<]*)<', text)
                line = found[1] if found else "no error shown"
            table.append((f"page {route.split('?')[0]}", bad, route, got, line, 1))
            if got != status or not line.startswith(start):
                problems.append(f"[page {route} | {bad}] {got}: {line!r}")
        after = _stored(world)
    finally:
        for key in damaged:
            world.store.delete(key)
    for row in table:
        print("| " + " | ".join(str(x) for x in row) + " |")
    print(f"edge contract (Airflow): {len(table)} cases, {len({r[0] for r in table})} entry points")
    assert not problems, "\n".join(problems)
    assert sorted(after) == sorted(before)
    assert after == before
    assert {dag_id: world.api.dag(dag_id)["is_paused"] for dag_id in pipelines} == paused


def test_a_cancel_with_delete_removes_checkpoints_not_savepoints_and_restores(world: World):
    savepoint = world.savepoint
    assert savepoint, "step 3 took a savepoint"
    prefix = savepoint.removeprefix(f"s3://{world.store.bucket}/chk/")
    kept = {k: world.store.get(k).data for k in world.store.list("wordcount/savepoints/")}
    highest = max(world.rows())
    run = world.api.trigger("wordcount_cancel", {"cleanup": "DELETE_ON_CANCELLATION"})
    assert world.api.wait_run("wordcount_cancel", run, 120) == "success"
    record = world.api.xcom("wordcount_cancel", run, "cancel")
    assert (record["cleanup"], record["retained"]) == ("DELETE_ON_CANCELLATION", [])
    assert record["after_id"] >= highest
    assert list(world.store.list("wordcount/chk-")) == []
    assert {k: world.store.get(k).data for k in world.store.list("wordcount/savepoints/")} == kept
    assert world.store.get(prefix + "/_metadata") is not None
    conf = {
        "point": savepoint,
        "claim_mode": "NO_CLAIM",
        "allow_non_restored_state": False,
        "parallelism": 2,
        "resume": True,
    }
    run = world.api.trigger("wordcount_restore", conf)
    assert world.api.wait_run("wordcount_restore", run, 240) == "success"
    total = len(world.lines) // 2
    wait_for(
        "a checkpoint after the deleted ones, with all the input",
        lambda: (
            world.rows() and min(world.rows()) > record["after_id"] and _offsets_done(world, total)
        ),
        240,
        world.airflow,
    )
    counts = read_keyed_state(world.store, "wordcount", "word-counts")
    assert counts == dict(wordcount.expected(world.lines))
    world.api.set_paused("wordcount_pipeline", True)


def test_no_credential_appears_in_any_log(world: World, s3_endpoint, service_log_dir):
    # Last: every log of the whole story is written (Airflow's own and each task's, the
    # services'). The S3 keys are this session's own (harness.services.start_seaweedfs).
    secrets = {
        "S3 secret key": s3_endpoint.secret_key,
        "Airflow admin password": world.airflow.password,
        "Airflow JWT secret": world.airflow.env["AIRFLOW__API_AUTH__JWT_SECRET"],
    }
    folders = [world.airflow.home, service_log_dir]
    assert len(log_files(folders)) > 50  # the task logs of every run are there
    assert find_leaks(folders, secrets) == []
