"""Crash stories: kill -9 a real Spark epoch at each crash point, recover, count exactly once.

Each story runs ``spark_jobs/run_epoch.py`` (a whole local cycle: recover, trigger or re-run,
process, complete, notify) as a subprocess over the ``crash_pipeline`` module, against the
session's real broker and a file checkpoint store of its own:

1. records for 8 keys, each with ``seq`` 1..M, go into a fresh 2-partition topic (one key
   stays in one partition, so its sequence is ordered);
2. one clean epoch completes and is notified;
3. the next run SIGKILLs its own driver at the crash point (``harness.faults.crash_env``):
   we check what storage and Kafka hold at that moment;
4. runs without the crash follow until every record is consumed;
5. the checked state per key is ``last == count == M, bad == 0`` (Flink's sequence check:
   exactly once, in order), the counts add up to what was produced, the completed
   checkpoints chain without gaps or overlaps, and the group offsets equal the latest
   ``_metadata`` offsets.

Every job is a client of the session's warm Spark Connect server (the job is the driver;
``reading`` kills the server's Python worker too); in one more story the killed job runs
local Spark itself (``reading``, killed mid-task). Every subprocess runs in a session of its own;
whatever is left of it (the Spark JVM, Python workers) must exit by itself after a crash,
and is killed by process group in any case.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from kafka import KafkaProducer

from harness.faults import crash_env
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stores import open_store
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.faults import CRASH_ENV
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import CheckpointMetadata, decode_metadata
from microcheckpoint.protocol.view import CheckpointStatus, PipelineView, scan
from microcheckpoint.state.reader import read_keyed_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "crashy"
OPERATOR = "seq-check"
GROUP = f"microcheckpoint-{PIPELINE}"
PARTITIONS = 2
KEYS = [f"key-{i}" for i in range(8)]
M = 15  # seq 1..M per key: 4 keys x 15 = 60 records per partition
PER_EPOCH = 30  # max_records_per_epoch (per partition): the crash hits the second epoch
CONFIG = {"max_records_per_epoch": PER_EPOCH}  # retained: the default, 1
RUN_TIMEOUT_S = 240
LEFTOVER_DEADLINE_S = 30
MAX_RECOVERY_RUNS = 4


@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: str
    seq: int


@dataclass
class Run:
    returncode: int
    out: str
    err: str
    leftovers: list[str]

    def tail(self) -> str:
        return (
            f"rc={self.returncode}\n--- stdout\n{self.out[-2000:]}\n--- stderr\n{self.err[-4000:]}"
        )


# -- the world outside the job: Kafka and checkpoint storage ---------------------------------


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaOffsets]:
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as adapter:
        yield adapter


def produce_sequences(bootstrap: str, topic: str, seqs: range = range(1, M + 1)) -> list[Produced]:
    """Key i lives in partition i % 2; the keys of a partition take turns: seq 1 of each, 2, ...
    (``seqs``: the seqs to send, 1..M unless given)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    sent = []
    try:
        for seq in seqs:
            for i, key in enumerate(KEYS):
                value = json.dumps({"k": key, "seq": seq}).encode()
                future = producer.send(
                    topic, key=key.encode(), value=value, partition=i % PARTITIONS
                )
                sent.append((future, key, seq))
        producer.flush()
        out = []
        for future, key, seq in sent:
            meta = future.get(timeout=30)
            out.append(Produced(meta.partition, meta.offset, key, seq))
        return out
    finally:
        producer.close()


def expected_state(produced: list[Produced], offsets: dict[TopicPartition, int], topic: str):
    """The fold of every record below ``offsets`` (I4), as ``seq-check`` state."""
    state: dict[str, dict[str, int]] = {}
    for r in sorted(produced, key=lambda r: (r.partition, r.offset)):
        if r.offset < offsets.get(TopicPartition(topic, r.partition), 0):
            s = state.setdefault(r.key, {"last": 0, "count": 0, "bad": 0})
            s["bad"] += int(r.seq - s["last"] != 1)
            s["last"], s["count"] = r.seq, s["count"] + 1
    return state


def coordinator(store) -> CheckpointCoordinator:
    return CheckpointCoordinator(
        store, CheckpointConfig.from_mapping({"pipeline": PIPELINE, "storage": store.url})
    )


# -- running the job and making sure nothing of it survives ----------------------------------


def _session_members(sid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


def run_epoch_job(
    tmp: Path,
    bootstrap: str,
    topic: str,
    storage: str,
    crash_at: str | None = None,
    remote: str | None = None,
    pipeline: str = "tests.integration.crash_pipeline:pipeline",
    config: dict | None = None,
    env_extra: dict[str, str] | None = None,
    kill_after_s: float | None = None,
) -> Run:
    """One ``run_epoch.py`` cycle (local Spark, or a client of the Connect server ``remote``);
    waits (bounded) for its whole session to exit, then kills whatever is left.
    ``leftovers`` names what was still alive at the deadline. With ``kill_after_s``, a job
    still running that long after its start is SIGKILLed with its whole session (a kill at
    a random moment, not at a named point)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # the Connect server's workers import the pipeline by package
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "CRASH_TOPIC": topic,
        **(env_extra or {}),
    }
    env.pop(CRASH_ENV, None)
    if crash_at is not None:
        env.update(crash_env(crash_at))
    cmd = [
        sys.executable,
        "spark_jobs/run_epoch.py",
        "--pipeline",
        pipeline,
        "--storage",
        storage,
        "--bootstrap",
        bootstrap,
        "--parallelism",
        "2",
        "--config",
        json.dumps(CONFIG if config is None else config),
    ]
    if remote is not None:
        cmd += ["--remote", remote]
    name = f"run-{uuid.uuid4().hex[:6]}"
    with open(tmp / f"{name}.out", "w+") as out, open(tmp / f"{name}.err", "w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True
        )
        sid = proc.pid
        leftovers: list[str] = []
        try:
            try:
                returncode = proc.wait(timeout=kill_after_s or RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                if kill_after_s is None:
                    raise
                os.killpg(sid, signal.SIGKILL)
                returncode = proc.wait()
            deadline = time.monotonic() + LEFTOVER_DEADLINE_S
            while (alive := _session_members(sid)) and time.monotonic() < deadline:
                time.sleep(0.2)
            leftovers = _describe(alive)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return Run(returncode, out.read(), err.read(), leftovers)


def killed_by_sigkill(run: Run) -> bool:
    return run.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


# -- what a story checks ---------------------------------------------------------------------


class History:
    """Every completed ``_metadata`` seen after each run (retention keeps only the latest, so
    the history is ours): none may change, and the latest completed id only grows."""

    def __init__(self, store) -> None:
        self.store = store
        self.layout = Layout(PIPELINE)
        self.seen: dict[CheckpointId, bytes] = {}
        self.latest: list[CheckpointId] = []

    def observe(self) -> PipelineView:
        view = scan(self.store, self.layout)
        for cid in view.completed:
            data = self.store.get(self.layout.metadata(cid)).data
            assert self.seen.setdefault(cid, data) == data, f"_metadata of {cid} was rewritten"
        latest = view.latest_completed
        if latest is not None:
            assert not self.latest or latest >= self.latest[-1], (
                f"latest completed went back from {self.latest[-1]} to {latest}"
            )
            if not self.latest or latest != self.latest[-1]:
                self.latest.append(latest)
        return view

    def chain(self) -> list[CheckpointMetadata]:
        return [
            decode_metadata(data, self.layout.metadata(cid))
            for cid, data in sorted(self.seen.items())
        ]


def committed(kafka: KafkaOffsets, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    return kafka.committed_group_offsets(GROUP, tps)


def assert_state_is_fold(store, produced, view: PipelineView, topic: str) -> None:
    latest = view.latest_completed
    offsets = view.metadata(latest).offsets
    assert read_keyed_state(store, PIPELINE, OPERATOR) == expected_state(produced, offsets, topic)


CRASH_POINTS = ["reading", "after_snapshot", "after_acks", "after_metadata"]
# Every job is a client of the warm Connect server (no JVM start per run). In one more story
# the killed job runs local Spark itself, so the kill also takes down its own JVM and Python
# workers, which must not outlive it.
STORIES = [(point, "connect") for point in CRASH_POINTS] + [("reading", "local")]


@pytest.mark.parametrize(("crash_at", "killed_spark"), STORIES)
def test_a_killed_epoch_recovers_exactly_once(
    crash_at: str,
    killed_spark: str,
    kafka_bootstrap: str,
    kafka: KafkaOffsets,
    spark_connect_url: str,
    tmp_path: Path,
) -> None:
    remote = spark_connect_url
    killed_remote = remote if killed_spark == "connect" else None
    topic = f"crash-{crash_at.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    storage = (tmp_path / "checkpoints").as_uri()
    store = open_store(storage)
    history = History(store)
    logs = tmp_path / "logs"
    logs.mkdir()

    # Input: 8 keys x seq 1..M, 60 records in each partition.
    produced = produce_sequences(kafka_bootstrap, topic)
    assert len(produced) == len(KEYS) * M
    ends = kafka.end_offsets(tps)
    assert ends == {tp: len(KEYS) * M // PARTITIONS for tp in tps}

    # Chapter 1: a clean epoch reads the first PER_EPOCH records of each partition.
    first = run_epoch_job(logs, kafka_bootstrap, topic, storage, remote=remote)
    assert first.returncode == 0, first.tail()
    assert not first.leftovers, first.leftovers
    view = history.observe()
    assert view.completed == [CheckpointId(1)] and not view.pending
    assert view.records[CheckpointId(1)].notified
    chk1 = view.metadata(CheckpointId(1)).offsets
    assert chk1 == {tp: PER_EPOCH for tp in tps}
    assert committed(kafka, tps) == chk1
    assert_state_is_fold(store, produced, view, topic)

    # Chapter 2: the next epoch is killed at the crash point.
    crash = run_epoch_job(logs, kafka_bootstrap, topic, storage, crash_at, killed_remote)
    assert killed_by_sigkill(crash), crash.tail()
    assert not crash.leftovers, f"processes of the killed run still alive: {crash.leftovers}"
    assert '"checkpoint"' not in crash.out  # it never got to print its result
    view = history.observe()
    chk2 = CheckpointId(2)
    record = view.records[chk2]
    crashed_attempt = record.attempt
    barrier2 = coordinator(store).barrier(chk2)
    assert barrier2.starts == chk1
    assert barrier2.ends == ends
    if crash_at == "after_metadata":
        # The commit point passed: completed, but not notified; offsets not moved yet.
        assert record.status is CheckpointStatus.COMPLETED
        assert not record.notified
        assert view.metadata(chk2).offsets == ends  # I1: offsets of _metadata = barrier ends
        assert committed(kafka, tps) == chk1
    else:
        # Before the commit point: pending, no outcome, nothing committed.
        assert record.status is CheckpointStatus.PENDING
        assert view.completed == [CheckpointId(1)]
        assert committed(kafka, tps) == chk1
        pending = coordinator(store).load_pending(chk2, view)
        source = TaskId.of("src", 0)
        if crash_at == "after_acks":
            assert not pending.missing, pending.missing  # every task acked
        elif crash_at == "after_snapshot":
            assert {t for t in pending.missing if t.uid.value == OPERATOR}
            assert any("/state/" in k for k in record.keys)  # a snapshot was written
        else:  # reading
            # No task that reads got to ack; the source's ack is sent when the job starts
            # (its state is the barrier's ends), so it may be there.
            assert pending.missing in (pending.expected, pending.expected - {source})
    # Restoring now gives the state as of the latest completed checkpoint (I4).
    assert_state_is_fold(store, produced, view, topic)

    # Chapter 3: runs without the crash until every record is in a notified checkpoint.
    recoveries = []
    for _ in range(MAX_RECOVERY_RUNS):
        run = run_epoch_job(logs, kafka_bootstrap, topic, storage, remote=remote)
        recoveries.append(run)
        assert run.returncode == 0, run.tail()
        assert not run.leftovers, run.leftovers
        view = history.observe()
        assert not view.pending, view.pending
        latest = view.latest_completed
        group = committed(kafka, tps)
        offsets = view.metadata(latest).offsets
        assert all(group[tp] is not None and group[tp] <= offsets[tp] for tp in tps)  # I1
        if offsets == ends and view.records[latest].notified:
            break
    else:
        pytest.fail(f"not caught up after {MAX_RECOVERY_RUNS} runs: {view.records}")
    if crash_at != "after_metadata":
        # The killed epoch was re-run from the same barrier under a new attempt.
        meta2 = view.metadata(chk2)
        assert meta2.barrier == barrier2
        assert meta2.attempt > crashed_attempt

    # The end: exactly once, in order, nothing lost, nothing twice.
    state = read_keyed_state(store, PIPELINE, OPERATOR)
    assert state == {key: {"last": M, "count": M, "bad": 0} for key in KEYS}
    assert sum(s["count"] for s in state.values()) == len(produced)
    assert committed(kafka, tps) == view.metadata(view.latest_completed).offsets == ends
    # I2: completed ids only grow, and every completed checkpoint seen continues the one
    # before it: no range read twice, none skipped.
    assert history.latest == sorted(set(history.latest))
    previous = {tp: 0 for tp in tps}
    for meta in history.chain():
        assert meta.barrier.starts == previous, f"{meta.checkpoint_id} does not continue the chain"
        previous = meta.barrier.ends
    assert previous == ends
    assert all(view.records[c].notified for c in view.completed)
    assert not view.ids(CheckpointStatus.COMPLETING)
    # I5: the killed attempt's files are gone; every state file left is referenced.
    referenced = {h.key for h in view.metadata(view.latest_completed).handles}
    state_files = {k for k in store.list(f"{PIPELINE}/") if "/state/" in k}
    assert state_files == referenced
