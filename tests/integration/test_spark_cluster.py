"""Epochs on a Spark standalone cluster: executors are JVMs of their own, under the workers.

The session's cluster (``spark_cluster``: a master and two workers, 1 core and 1g each, on
loopback) runs ``tests.integration.cluster_pipeline``: the crash tests' 8 keys with ``seq``
1..M each, the keyed ``seq-check`` (it counts every step that is not +1), and a FileSink
of each epoch's ``(key, last seq)``. Two stories, two epochs of 30 records per partition:

1. **spark-submit, driver killed.** ``spark-submit --master spark://…`` of
   ``spark_jobs/run_epoch.py --cycles 2``: checkpoint 1 is held while an executor reads,
   and the whole driver (the spark-submit JVM and its Python) is killed with SIGKILL; the
   master ends the application and its executors. The next job re-runs checkpoint 1 under
   a new attempt (fenced), runs checkpoint 2, and everything is counted exactly once.
2. **Spark Connect on the cluster, executor killed.** A Connect server whose master is the
   cluster runs both epochs for one client; checkpoint 1 is held while an executor reads,
   and one executor JVM is killed with SIGKILL: Spark runs the lost work again on a new
   executor, and the same run completes both epochs, exactly once.

Each job is watched from outside (``ExecutorWatch``): its executors are children of the
worker JVMs, in the workers' process sessions, not the driver's, with Python workers of
their own. Exactly once: per-key state ``last == count == M, bad == 0``, the published rows
equal to the set computed from the input and the checkpoints' ranges, none twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import services
from harness.faults import Hold
from harness.spark_cluster import Executor, SparkCluster, spark_home
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stores import open_store
from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.faults import CRASH_ENV, HOLD_ENV
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.cluster_pipeline import SINK
from tests.integration.test_crash_recovery import (
    KEYS,
    OPERATOR,
    PARTITIONS,
    PER_EPOCH,
    PIPELINE,
    History,
    M,
    Produced,
    committed,
    coordinator,
    produce_sequences,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240
GONE_DEADLINE_S = 60


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaOffsets]:
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as adapter:
        yield adapter


@pytest.fixture(scope="module")
def cluster_connect(
    spark_cluster: SparkCluster, service_log_dir: Path
) -> Iterator[services.Service]:
    """A Spark Connect server whose master is the cluster (``address``: its ``sc://`` URL).

    It holds the cluster's cores while it runs: the spark-submit story comes first in
    this file, and the server stops with the module.
    """
    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "1g",
        "spark.task.maxFailures": "4",  # the cluster default, said aloud: a lost task retries
        "spark.executor.extraJavaOptions": services.QUICK_JVM_OPTIONS,
    }
    log_dir = service_log_dir / "cluster-connect"
    service = services.start_spark_connect(log_dir, master=spark_cluster.master_url, conf=conf)
    try:
        yield service
    finally:
        service.stop()


class ExecutorWatch:
    """Every executor of the cluster seen while a job runs (a look every 0.2 s), by pid."""

    def __init__(self, cluster: SparkCluster) -> None:
        self.cluster = cluster
        self.seen: dict[int, Executor] = {}
        self.pythons: dict[int, set[int]] = {}
        self.sessions: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ExecutorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(0.2)

    def look(self) -> list[Executor]:
        now = self.cluster.executors()
        for executor in now:
            self.seen.setdefault(executor.pid, executor)
            self.pythons.setdefault(executor.pid, set()).update(executor.python_pids)
            with contextlib.suppress(OSError):
                self.sessions.setdefault(executor.pid, os.getsid(executor.pid))
        return now

    def apps(self) -> set[str]:
        return {e.app_id for e in self.seen.values()}


def assert_separate_executors(watch: ExecutorWatch, cluster: SparkCluster, driver: int) -> None:
    """The executors seen were JVMs of the workers (some on each): each a child of a
    worker, in that worker's process session, not in the driver's (session ``driver``),
    with Python workers under them."""
    workers = cluster.worker_pids()
    executors = list(watch.seen.values())
    assert {e.worker_pid for e in executors} == set(workers), executors
    for e in executors:
        assert e.pid != driver
        assert watch.sessions[e.pid] == os.getsid(e.worker_pid) != driver  # the worker's
    assert any(watch.pythons.values()), "no executor ran a Python worker"
    assert not set().union(*watch.pythons.values()) & {driver, os.getpid()}


def job_env(
    cluster: SparkCluster, topic: str, sink: str, extra: dict[str, str] | None = None
) -> dict:
    """The cluster's client environment for a job on ``topic`` publishing to ``sink``; faults
    armed by ``extra`` only."""
    env = {**cluster.client_env(), "CRASH_TOPIC": topic, "CLUSTER_SINK": sink}
    env.pop(CRASH_ENV, None)
    env.pop(HOLD_ENV, None)
    return {**env, **(extra or {})}


def job_argv(storage: str, bootstrap: str, master: str | None, remote: str | None) -> list[str]:
    """``run_epoch.py`` (two cycles) by ``spark-submit --master`` or as a Connect client."""
    job = [
        str(ROOT / "spark_jobs" / "run_epoch.py"),
        "--pipeline",
        "tests.integration.cluster_pipeline:pipeline",
        "--storage",
        storage,
        "--bootstrap",
        bootstrap,
        "--parallelism",
        "2",
        "--config",
        json.dumps({"max_records_per_epoch": PER_EPOCH, "retained": 2}),  # keep both
        "--cycles",
        "2",
    ]
    if remote is not None:
        return [sys.executable, *job, "--remote", remote]
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", str(master)]
    submit += ["--driver-memory", "1g", "--executor-memory", "1g"]
    submit += ["--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"]
    submit += ["--conf", f"spark.executor.extraJavaOptions={services.QUICK_JVM_OPTIONS}"]
    return [*submit, *job]


class Job:
    """A running ``run_epoch.py`` in a process session of its own; output in ``tmp``."""

    def __init__(self, argv: list[str], env: dict, tmp: Path) -> None:
        name = f"job-{uuid.uuid4().hex[:6]}"
        self.out_path, self.err_path = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True
            )

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the job's whole session (its driver: JVM and Python)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def reports(self) -> list[dict]:
        lines = self.out_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def tail(self) -> str:
        out, err = self.out_path.read_text(), self.err_path.read_text()
        return f"rc={self.proc.returncode}\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-4000:]}"


def run_clean(
    cluster: SparkCluster, argv: list[str], env: dict, tmp: Path
) -> tuple[Job, ExecutorWatch]:
    with ExecutorWatch(cluster) as watch:
        job = Job(argv, env, tmp)
        returncode = job.wait()
    assert returncode == 0, job.tail()
    return job, watch


def run_killing_an_executor(
    cluster: SparkCluster,
    argv: list[str],
    env_for,
    target: tuple[str, str],
    hold_dir: Path,
    tmp: Path,
) -> tuple[Job, ExecutorWatch, list[Executor], Executor]:
    """Run the job until an executor holds the ``reading`` point, ``kill -9`` one executor
    JVM, wait until it is gone, release the hold; the job must then end with 0.

    Returns the job, the watch, the executors seen before the kill and the one killed."""
    hold = Hold(hold_dir, "reading", limit_s=RUN_TIMEOUT_S)
    with ExecutorWatch(cluster) as watch:
        job = Job(argv, env_for(cluster, *target, hold.env), tmp)
        try:
            hold.wait_reached(RUN_TIMEOUT_S, alive=lambda: job.proc.poll() is None)
            before = watch.look()
            victim = before[0]
            os.kill(victim.pid, signal.SIGKILL)
            wait_until(
                lambda: victim.pid not in {e.pid for e in cluster.executors()},
                GONE_DEADLINE_S,
                f"executor {victim.pid} exits",
            )
        finally:
            hold.release()
        returncode = job.wait()
    assert returncode == 0, job.tail()
    return job, watch, before, victim


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)


def new_topic(kafka: KafkaOffsets, bootstrap: str, name: str):
    topic = f"cluster-{name}-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    produced = produce_sequences(bootstrap, topic)
    ends = kafka.end_offsets(tps)
    assert (
        ends == {tp: len(KEYS) * M // PARTITIONS for tp in tps} == {tp: 2 * PER_EPOCH for tp in tps}
    )
    return topic, tps, produced


def expected_output(produced: list[Produced], chain: list, topic: str) -> set[tuple[str, int]]:
    """What ``seq-out`` publishes: each epoch, each key it read with that key's last seq."""
    rows = set()
    for meta in chain:
        last: dict[str, int] = {}
        for r in sorted(produced, key=lambda r: (r.partition, r.offset)):
            tp = TopicPartition(topic, r.partition)
            if meta.barrier.starts[tp] <= r.offset < meta.barrier.ends[tp]:
                last[r.key] = r.seq
        rows |= set(last.items())
    return rows


def assert_exactly_once(store, history: History, kafka, tps, produced, sink: str) -> None:
    """Every record counted once, in order; every epoch's output published once; the chain
    of checkpoints has no gap or overlap and ends at the end of the topic."""
    ends = kafka.end_offsets(tps)
    view = history.observe()
    assert not view.pending, view.pending
    state = read_keyed_state(store, PIPELINE, OPERATOR)
    assert state == {key: {"last": M, "count": M, "bad": 0} for key in KEYS}
    assert sum(s["count"] for s in state.values()) == len(produced)
    assert committed(kafka, tps) == view.metadata(view.latest_completed).offsets == ends
    previous = {tp: 0 for tp in tps}
    for meta in history.chain():
        assert meta.barrier.starts == previous, f"{meta.checkpoint_id} does not continue the chain"
        previous = meta.barrier.ends
    assert previous == ends
    assert all(view.records[c].notified for c in view.completed)
    handles = {h.key for c in view.completed for h in view.metadata(c).handles}
    state_files = {k for k in store.list(f"{PIPELINE}/") if "/state/" in k}
    assert state_files == {k for k in handles if "/state/" in k}  # none left of the killed
    output = [(row["k"], row["last"]) for row in read_committed(sink, PIPELINE, SINK)]
    assert len(output) == len(set(output))  # nothing published twice
    assert set(output) == expected_output(produced, history.chain(), tps[0].topic)
    assert {k for k, _ in output} == set(KEYS)


def test_spark_submit_on_the_cluster_survives_a_driver_kill_exactly_once(
    spark_cluster: SparkCluster, kafka_bootstrap: str, kafka: KafkaOffsets, tmp_path: Path
) -> None:
    cluster = spark_cluster
    topic, tps, produced = new_topic(kafka, kafka_bootstrap, "submit")
    storage, sink = (tmp_path / "checkpoints").as_uri(), (tmp_path / "out").as_uri()
    store = open_store(storage)
    history = History(store)
    argv = job_argv(storage, kafka_bootstrap, cluster.master_url, None)

    # Chapter 1: checkpoint 1 is held while an executor reads, and the whole driver (the
    # spark-submit JVM and its Python) is killed: the master ends the application.
    hold = Hold(tmp_path / "hold", "reading", limit_s=RUN_TIMEOUT_S)
    with ExecutorWatch(cluster) as watch:
        job = Job(argv, job_env(cluster, topic, sink, hold.env), tmp_path)
        try:
            hold.wait_reached(RUN_TIMEOUT_S, alive=lambda: job.proc.poll() is None)
            assert watch.look(), "no executor while an executor holds the reading point"
            job.kill()
            wait_until(lambda: not cluster.executors(), GONE_DEADLINE_S, "executors end")
        finally:
            hold.release()
            job.kill()
    assert job.proc.returncode == -signal.SIGKILL, job.tail()
    assert not job.reports()
    [app] = watch.apps()
    assert app in {a["id"] for a in cluster.status()["completedapps"]}  # ended by the master
    assert_separate_executors(watch, cluster, job.proc.pid)
    view = history.observe()
    chk1 = CheckpointId(1)
    crashed_attempt = view.records[chk1].attempt
    assert view.records[chk1].status is CheckpointStatus.PENDING and not view.completed
    pending = coordinator(store).load_pending(chk1, view)
    # No task that reads acked; the source's ack is sent when the job starts (its state is
    # the barrier's ends), so it may be there.
    source = TaskId.of("src", 0)  # cluster_pipeline.py
    assert pending.missing in (pending.expected, pending.expected - {source})
    assert committed(kafka, tps) == {tp: None for tp in tps}
    with pytest.raises(CheckpointNotFound):  # no state to restore: nothing completed
        read_keyed_state(store, PIPELINE, OPERATOR)

    # Chapter 2: the next job re-runs checkpoint 1 under a new attempt, then runs 2. One of
    # its executors is killed while it reads: Spark runs the lost task again (the job keeps
    # the cluster's task retries), and the same job completes both checkpoints.
    job, watch, before, _ = run_killing_an_executor(
        cluster, argv, job_env, (topic, sink), tmp_path / "hold-again", tmp_path
    )
    replacements = {e.pid for e in watch.seen.values()} - {e.pid for e in before}
    assert replacements, "the master started no executor in place of the killed one"
    reports = [(r["checkpoint"], r["records"], r["master"]) for r in job.reports()]
    assert reports == [(n, PARTITIONS * PER_EPOCH, cluster.master_url) for n in (1, 2)]
    assert job.reports()[0]["attempt"] > crashed_attempt
    assert len(watch.apps()) == 1, watch.seen
    assert_separate_executors(watch, cluster, job.proc.pid)
    assert history.observe().metadata(chk1).attempt == job.reports()[0]["attempt"]
    assert_exactly_once(store, history, kafka, tps, produced, sink)


def test_connect_on_the_cluster_survives_an_executor_kill_exactly_once(
    spark_cluster: SparkCluster,
    cluster_connect: services.Service,
    kafka_bootstrap: str,
    kafka: KafkaOffsets,
    tmp_path: Path,
) -> None:
    cluster = spark_cluster
    topic, tps, produced = new_topic(kafka, kafka_bootstrap, "connect")
    storage, sink = (tmp_path / "checkpoints").as_uri(), (tmp_path / "out").as_uri()
    store = open_store(storage)
    history = History(store)
    argv = job_argv(storage, kafka_bootstrap, None, cluster_connect.address)

    # Two epochs through the Connect server; the first is held while an executor reads,
    # and one executor JVM is killed: Spark runs the lost work again on a new executor.
    log_start = cluster_connect.log_path.stat().st_size
    job, watch, before, victim = run_killing_an_executor(
        cluster, argv, job_env, (topic, sink), tmp_path / "hold", tmp_path
    )
    reports = [(r["checkpoint"], r["records"], r["master"]) for r in job.reports()]
    master = f"connect {cluster_connect.address}"
    assert reports == [(n, PARTITIONS * PER_EPOCH, master) for n in (1, 2)]
    # The same run completed checkpoint 1: retried by Spark, not re-run by the protocol.
    view = history.observe()
    assert [view.metadata(c).attempt for c in view.completed] == [
        r["attempt"] for r in job.reports()
    ]
    [app] = {e.app_id for e in before}
    assert watch.apps() == {app} and len(before) == len(cluster.workers)
    replacements = {e.pid for e in watch.seen.values()} - {e.pid for e in before}
    assert replacements, "the master started no executor in place of the killed one"
    assert_separate_executors(watch, cluster, cluster_connect.pid)
    with open(cluster_connect.log_path, "rb") as log_file:
        log_file.seek(log_start)
        log = log_file.read().decode(errors="replace")
    assert f"Lost executor {victim.executor_id} on 127.0.0.1" in log
    # A second attempt of a task (index.attempt "N.1"): the one lost with the executor, or
    # one whose shuffle output was on it.
    assert re.search(r"Starting task \d+\.1 in stage", log), log[-3000:]
    assert_exactly_once(store, history, kafka, tps, produced, sink)
