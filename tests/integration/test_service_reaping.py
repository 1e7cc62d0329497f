"""Services die with their owner: kill the process that started them, nothing of theirs stays.

A real owner process (``reaping_owner.py``) starts, through the harness, the S3 server and
Tansu (``services.local_stack``), a Spark Connect server, a Spark standalone master and
worker, PostgreSQL and a service whose child leaves the group and daemonizes (the shape of
``airflow standalone``'s children and of Spark's scripts; the daemon ignores SIGTERM). The
test records every process below the owner, kills the owner, and asserts that every one of
them has ended within a bounded wait. ``kill -9`` of the owner runs with everything;
``SIGTERM`` (which the owner does not handle) without the three JVMs, whose start is most of
the time: the guards see the same event, the owner's exit, either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import guard, services

pytestmark = pytest.mark.integration

OWNER = Path(__file__).with_name("reaping_owner.py")
START_S = 300.0
# The guard's grace for the command, one second for the rest, SIGKILL, and slack for load.
GONE_S = guard.GRACE_S + 25.0
SPARK = ("spark-connect", "spark-master", "spark-worker-0")


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:140]}")
    return out


def _start_owner(log_dir: Path, spark: bool) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """Start the owner (in a session of its own) and read its line of pids."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCHECKPOINT_")}
    owner = subprocess.Popen(
        [sys.executable, str(OWNER), str(log_dir), *([] if spark else ["--no-spark"])],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    )
    ready, _, _ = select.select([owner.stdout], [], [], START_S)
    line = owner.stdout.readline() if ready else ""  # type: ignore[union-attr]
    if not line:
        owner.kill()
        owner.wait()
        logs = sorted(p.name for p in log_dir.rglob("*.log"))
        pytest.fail(f"the owner printed no pids within {START_S:.0f}s; logs in {log_dir}: {logs}")
    return owner, json.loads(line)


@pytest.mark.parametrize(
    ("sig", "spark"), [(signal.SIGKILL, True), (signal.SIGTERM, False)], ids=["kill-9", "term"]
)
def test_every_service_process_ends_when_the_owner_is_killed(
    tmp_path: Path, sig: int, spark: bool
) -> None:
    owner, started = _start_owner(tmp_path, spark)
    procs: list[psutil.Process] = []
    try:
        # Step 1: what the owner started, as it stands before the kill.
        procs = psutil.Process(owner.pid).children(recursive=True)
        pids = {p.pid for p in procs}
        by_name: dict[str, int] = started["services"]  # type: ignore[assignment]
        names = {re.sub(r"-\d{4,5}$", "", name) for name in by_name}  # no port suffix
        store = names & {"seaweedfs", "moto-s3"}
        assert len(store) == 1, sorted(by_name)
        expected = {"tansu", "postgres", "tree"} | (set(SPARK) if spark else set())
        assert names - store == expected, sorted(by_name)
        # Each service's pid is a guard, a child of the owner; the daemon is in the tree.
        assert {p.pid for p in psutil.Process(owner.pid).children()} == set(by_name.values())
        assert started["daemon"] in pids
        commands = [" ".join(p.cmdline()) for p in procs if _running(p)]
        javas = [c for c in commands if c.split(" ")[0].endswith("/java")]
        mains = ("SparkConnectServer", "deploy.master.Master", "deploy.worker.Worker")
        assert [sum(m in c for c in javas) for m in mains] == [int(spark)] * 3, javas
        assert sum(c.startswith(str(services.tansu_binary())) for c in commands) == 1, commands
        assert sum("postgres" in c and "guard.py" not in c for c in commands) >= 3, commands
        # Step 2: the owner ends by ``sig``; nothing it started may outlive the wait.
        os.kill(owner.pid, sig)
        assert owner.wait(10) == -sig
        deadline = time.monotonic() + GONE_S
        while any(_running(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = _describe([p for p in procs if _running(p)])
        assert survivors == [], (
            f"{len(survivors)} of {len(procs)} processes outlived the owner's "
            f"{signal.Signals(sig).name} by {GONE_S:.0f}s: {survivors}"
        )
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if owner.poll() is None:
            owner.kill()
            owner.wait()
