"""The guard between a service and its owner: the service's whole tree ends with the owner.

Real processes, no services: a small command tree stands in for a service that daemonizes
(a child in a session of its own that double-forks a daemon ignoring SIGTERM, as Spark's
scripts and ``airflow standalone``'s children do).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import guard, services
from tests.daemon_tree import TREE

ROOT = Path(__file__).resolve().parents[3]

# The owner: starts the service through the harness, prints the guard's pid, sleeps.
OWNER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from harness import services
tree = [sys.executable, "-c", sys.argv[2], sys.argv[3]]
service = services._spawn("tree", tree, dict(os.environ), Path(sys.argv[4]), "-")
print(service.pid, flush=True)
time.sleep(1000)
"""


def _wait_for_file(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written within {timeout:.0f}s"
        time.sleep(0.05)
    return int(path.read_text())


def _adopted(daemon: int, guard_pid: int, timeout: float = 10.0) -> None:
    """Wait until the daemon's first parent has exited and the guard adopted it."""
    deadline = time.monotonic() + timeout
    while psutil.Process(daemon).ppid() != guard_pid:
        assert time.monotonic() < deadline, f"daemon {daemon} not adopted by guard {guard_pid}"
        time.sleep(0.02)


def _survivors(procs: list[psutil.Process], timeout: float) -> list[str]:
    """The processes of ``procs`` still running (zombies count as ended) after ``timeout``."""

    def running(proc: psutil.Process) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while any(running(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in procs if running(p)]


def _tree(pid: int) -> list[psutil.Process]:
    """``pid``'s descendants, zombies left out: the daemon's first fork is a zombie for the
    moment between its exit and its parent's ``waitpid``, longer on a busy machine."""

    def ended(proc: psutil.Process) -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return [p for p in psutil.Process(pid).children(recursive=True) if not ended(p)]


def _kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_the_whole_tree_ends_when_its_owner_is_killed(tmp_path: Path, sig: int) -> None:
    daemon_file = tmp_path / "daemon.pid"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(ROOT), TREE, str(daemon_file), str(tmp_path)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    procs: list[psutil.Process] = []
    try:
        guard_pid = int(owner.stdout.readline())  # type: ignore[union-attr]
        daemon = _wait_for_file(daemon_file)
        _adopted(daemon, guard_pid)
        procs = _tree(owner.pid)
        # Step 1: the guard, the command, its child in a session of its own, and the daemon,
        # re-parented to the guard (the subreaper), not to init.
        assert len(procs) == 4, [p.cmdline()[:3] for p in procs]
        assert {p.pid for p in procs} >= {guard_pid, daemon}
        assert psutil.Process(daemon).ppid() == guard_pid
        assert os.getsid(daemon) not in (guard_pid, os.getsid(owner.pid))
        # Step 2: the owner dies; everything it started follows (the daemon by SIGKILL).
        os.kill(owner.pid, sig)
        assert owner.wait(10) == -sig
        survivors = _survivors(procs, timeout=guard.GRACE_S + 10)
        assert survivors == [], f"still running after the owner's {sig!r}: {survivors}"
        log = (tmp_path / "tree.log").read_text()
        assert f"guard: owner {owner.pid} is gone; stopping {sys.executable}" in log
    finally:
        _kill_all([*procs, psutil.Process(owner.pid)] if owner.poll() is None else procs)


def test_stop_ends_the_service_and_what_it_daemonized_with_its_status(tmp_path: Path) -> None:
    daemon_file = tmp_path / "daemon.pid"
    argv = [sys.executable, "-c", TREE, str(daemon_file)]
    service = services._spawn("tree", argv, dict(os.environ), tmp_path, "-")
    procs: list[psutil.Process] = []
    try:
        daemon = _wait_for_file(daemon_file)
        _adopted(daemon, service.pid)
        procs = [psutil.Process(service.pid), *_tree(service.pid)]
        assert len(procs) == 4 and daemon in {p.pid for p in procs}
        assert os.getpgid(service.pid) == service.pid  # the pid stop() signals is the group's
        service.stop(timeout=10)
        # The command died by the group's SIGTERM: the owner sees that status, as before.
        assert service.process.returncode == -signal.SIGTERM
        assert _survivors(procs, timeout=0) == []
    finally:
        _kill_all(procs)


@pytest.mark.parametrize(("script", "code"), [("exit 3", 3), ("exit 0", 0), ("kill -USR2 $$", -12)])
def test_the_guard_exits_with_the_commands_status(script: str, code: int) -> None:
    done = subprocess.run(guard.command(["sh", "-c", script]), timeout=10, start_new_session=True)
    assert done.returncode == code


def test_kill_9_of_the_guard_alone_kills_the_command(tmp_path: Path) -> None:
    service = services._spawn("sleeper", ["sleep", "1000"], dict(os.environ), tmp_path, "-")
    deadline = time.monotonic() + 10
    # The command is the guard's child once it has exec'd (before, a fork of the guard).
    while [c.cmdline() for c in psutil.Process(service.pid).children()] != [["sleep", "1000"]]:
        assert time.monotonic() < deadline, "the guard did not start its command"
        time.sleep(0.02)
    command = psutil.Process(service.pid).children()[0]
    os.kill(service.pid, signal.SIGKILL)
    service.process.wait(10)
    # Its parent-death signal: a kill -9 of the service's pid still ends the service.
    assert _survivors([command], timeout=10) == []


def test_a_command_that_cannot_start_exits_127_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-binary")
    service = services._spawn("missing", [missing, "--flag"], dict(os.environ), tmp_path, "-")
    assert service.process.wait(10) == 127
    service.stop()
    assert f"guard: cannot start ['{missing}', '--flag']: [Errno 2]" in service.log_tail()


def test_an_owner_gone_before_the_guard_starts_ends_the_command_at_once() -> None:
    line = guard.command(["sleep", "1000"], grace=1.0)
    line[line.index("--owner") + 1] = "999999999"  # no such process: already gone
    started = time.monotonic()
    done = subprocess.run(line, timeout=20, start_new_session=True, capture_output=True)
    assert done.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5
    assert b"guard: owner 999999999 is gone; stopping sleep" in done.stderr


def test_descendants_lists_every_living_process_below_a_root() -> None:
    child = subprocess.Popen(["sh", "-c", "sleep 1000 & sleep 1000 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(guard.descendants(child.pid)) < 2:
            assert time.monotonic() < deadline, guard.descendants(child.pid)
            time.sleep(0.02)
        found = guard.descendants(os.getpid())
        assert found.index(child.pid) < min(found.index(p) for p in guard.descendants(child.pid))
        assert {psutil.Process(p).name() for p in guard.descendants(child.pid)} == {"sleep"}
    finally:
        for pid in [*guard.descendants(child.pid), child.pid]:
            os.kill(pid, signal.SIGKILL)
        child.wait()


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (["--grace", "1"], "guard: no command given in ['--grace', '1']; pass it after --"),
        (["--bogus", "1", "--", "true"], "guard: unknown option --bogus"),
        (["--owner", "--", "true"], "guard: option --owner needs a value"),
    ],
)
def test_bad_options_are_named_with_the_usage(args: list[str], first_line: str) -> None:
    line = [*guard.command(["true"])[:4], *args]
    done = subprocess.run(line, capture_output=True, text=True, timeout=10)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        first_line,
        "usage: guard.py [--grace S] [--owner PID] [--user UID] [--group GID] -- COMMAND...",
    ]
