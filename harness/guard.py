"""A guard process between a service and its owner: the service ends when the owner does.

``harness.services._spawn`` starts every service (moto or SeaweedFS, Tansu, Spark, PostgreSQL,
``airflow standalone``) as ``python -I -S harness/guard.py [options] -- <command>``; the owner
is the process that called ``_spawn`` (a pytest worker, ``make demo``). The guard:

1. makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so a descendant that
   daemonizes or calls ``setsid`` (a JVM started by Spark's scripts, the children of
   ``airflow standalone``, PostgreSQL's backends) is re-parented to the guard, not to init,
   and stays findable;
2. starts the command in its own process group (the one ``_spawn`` opened for the guard), with
   ``PR_SET_PDEATHSIG`` = ``SIGKILL`` on the command's first process;
3. watches the owner: a pidfd of its parent (woken the moment the owner exits) and its parent
   id, checked every half second (a changed parent means the owner is gone);
4. when the owner is gone: ``SIGTERM`` to the group, up to ``--grace`` seconds for the
   command, then ``SIGTERM`` to every descendant left, one more second, then ``SIGKILL`` to
   what is left; then it exits;
5. when the command ends by itself (or by ``Service.stop``): the same clean-up of what it
   left, and the guard exits with the command's status (a death by signal N is re-raised,
   so ``Popen.returncode`` is ``-N`` as before).

Why this design: ``PR_SET_PDEATHSIG`` alone fires when the parent *thread* ends (a fixture
started from a thread would lose its service early) and only reaches one process; a lease
file needs a later run to clean up. A guard is one small stdlib-only process (about 40 ms
of CPU per service, see docs/testing.md) that survives ``kill -9`` of its owner and sees its
whole tree. What the owner sees is unchanged: ``Service.pid`` is the guard's pid, which is
the process group's id, so ``Service.stop`` (``killpg``) signals the command and everything
in its group exactly as before, and the guard, which ignores those signals, follows the
command out. Edge cases: a signal sent to the guard's pid alone (not the group) is not
forwarded, except ``SIGKILL``, which ends the command through its parent-death signal; a
command must stay in the foreground (``--wait``, ``SPARK_NO_DAEMONIZE``): its first process
ending is the service ending. The guard uses the standard library only and is run with
``-I -S``: no site-packages, no ``PYTHON*`` variables, whatever the service's environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Callable

__all__ = ["GRACE_S", "command", "descendants", "main", "run"]

GRACE_S = 5.0
_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# Signals that would end the guard by default: they reach the whole group, the guard stays.
_NOTED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_libc: ctypes.CDLL | None = None


def command(
    argv: list[str], grace: float = GRACE_S, user: int | None = None, group: int | None = None
) -> list[str]:
    """The command line that runs ``argv`` under a guard (start it in a new session).

    ``user``/``group`` are the ids the service runs as; the guard itself keeps the owner's,
    so it can signal the service and anything it starts. The owner is this process.
    """
    line = [sys.executable, "-I", "-S", os.path.realpath(__file__), "--grace", str(grace)]
    line += ["--owner", str(os.getpid())]
    if user is not None:
        line += ["--user", str(user)]
    if group is not None:
        line += ["--group", str(group)]
    return [*line, "--", *argv]


def _prctl(option: int, value: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}) failed: {os.strerror(err)}")


def descendants(root: int) -> list[int]:
    """Every living process below ``root`` (from ``/proc``), parents before children.

    Zombies are left out (they have ended; their parent reaps them). A process that ends
    during the scan is skipped.
    """
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as file:
                stat = file.read()
        except OSError:
            continue
        # The name (field 2) may hold spaces and parentheses: split after its last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    queue = [root]
    while queue:
        children = parents.get(queue.pop(0), [])
        found += children
        queue += children
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class _Guard:
    """The loop of one guard: its command, its owner and the wake-up pipe its signals write."""

    def __init__(
        self, argv: list[str], grace: float, owner: int, user: int | None, group: int | None
    ) -> None:
        self.argv, self.grace, self.owner, self.user, self.group = argv, grace, owner, user, group
        self.status: int | None = None
        self.child = 0
        self.owner_fd: int | None = None

    def start(self) -> None:
        """Steps 1-3: subreaper, wake-up pipe and handlers, the command; the owner's pidfd."""
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        if os.getpgrp() != os.getpid():  # not started in a session of its own: lead a group
            os.setpgid(0, 0)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (*_NOTED, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)
        self.child = self._fork_exec()
        with contextlib.suppress(OSError, AttributeError):
            self.owner_fd = os.pidfd_open(self.owner)

    def _fork_exec(self) -> int:
        """Start the command (fork and exec: ``subprocess`` would double the guard's start).

        Raises:
            OSError: it could not be started (the child's error, as its message).
        """
        guard = os.getpid()
        errors_r, errors_w = os.pipe()  # closed on exec: EOF without a word means started
        child = os.fork()
        if child == 0:
            try:
                os.close(errors_r)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these
                    signal.signal(sig, signal.SIG_DFL)
                if self.group is not None:
                    os.setregid(self.group, self.group)
                if self.user is not None:
                    os.setreuid(self.user, self.user)
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != guard:  # the guard ended before the line above
                    os._exit(1)
                os.execvp(self.argv[0], self.argv)
            except BaseException as exc:
                os.write(errors_w, str(exc).encode(errors="replace"))
            finally:
                os._exit(127)
        os.close(errors_w)
        with os.fdopen(errors_r, "rb") as errors:
            message = errors.read().decode(errors="replace")
        if message:
            os.waitpid(child, 0)
            raise OSError(message)
        return child

    def owner_gone(self) -> bool:
        """The owner has ended: the guard was re-parented (to init or a subreaper)."""
        return os.getppid() != self.owner

    def reap(self) -> None:
        """Collect every ended child (the command, and orphans re-parented to the guard)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.status = status

    def wait(self, seconds: float, until: Callable[[], bool]) -> bool:
        """Reap and sleep (woken by any signal or the owner's exit) until ``until()``."""
        deadline = time.monotonic() + seconds
        while True:
            self.reap()
            if until():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # The owner's pidfd stays readable once it has ended: watch it until then only.
            watch_owner = self.owner_fd is not None and not self.owner_gone()
            fds = [self.wake_r] + ([self.owner_fd] if watch_owner else [])  # type: ignore[list-item]
            readable, _, _ = select.select(fds, [], [], min(left, _POLL_S))
            if self.wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)

    def clean_up(self, stop_command: bool) -> None:
        """Steps 4-5: end the command (when asked) and everything below the guard."""
        me = os.getpid()
        if stop_command and self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(me, signal.SIGTERM)
            self.wait(self.grace, lambda: self.status is not None)
        _signal_all(descendants(me), signal.SIGTERM)
        if not self.wait(1.0, lambda: not descendants(me)):
            _signal_all(descendants(me), signal.SIGKILL)
            self.wait(5.0, lambda: not descendants(me))


def run(
    argv: list[str],
    grace: float = GRACE_S,
    owner: int | None = None,
    user: int | None = None,
    group: int | None = None,
) -> int:
    """Run ``argv`` under a guard; its exit code, or ``-N`` when it died by signal N.

    Steps: 1. start (subreaper, command, owner watch); 2. wait until the command ends or
    the owner does; 3. clean up the tree; 4. return the command's status.

    ``owner`` defaults to the parent; an owner that is not the parent (it ended before the
    guard started) counts as gone at once. A command that cannot be started: 127.
    """
    # Step 1
    guard = _Guard(argv, grace, os.getppid() if owner is None else owner, user, group)
    try:
        guard.start()
    except OSError as exc:
        print(f"guard: cannot start {argv}: {exc}", file=sys.stderr, flush=True)
        return 127
    # Step 2
    guard.wait(float("inf"), lambda: guard.status is not None or guard.owner_gone())
    owner_gone = guard.status is None
    if owner_gone:
        print(
            f"guard: owner {guard.owner} is gone; stopping {argv[0]}", file=sys.stderr, flush=True
        )
    # Step 3
    guard.clean_up(stop_command=owner_gone)
    # Step 4
    return os.waitstatus_to_exitcode(guard.status) if guard.status is not None else 0


def _options(args: list[str]) -> tuple[dict[str, float], list[str]]:
    """``--name value`` pairs up to ``--``, and the command after it (no argparse: 10 ms)."""
    usage = "usage: guard.py [--grace S] [--owner PID] [--user UID] [--group GID] -- COMMAND..."
    if "--" not in args or args.index("--") == len(args) - 1:
        raise SystemExit(f"guard: no command given in {args}; pass it after --\n{usage}")
    split = args.index("--")
    options: dict[str, float] = {}
    names = args[:split:2]
    for name, value in zip(names, args[1:split:2], strict=False):
        if name not in ("--grace", "--owner", "--user", "--group"):
            raise SystemExit(f"guard: unknown option {name}\n{usage}")
        options[name[2:]] = float(value) if name == "--grace" else int(value)
    if len(names) != len(args[1:split:2]):
        raise SystemExit(f"guard: option {names[-1]} needs a value\n{usage}")
    return options, args[split + 1 :]


def main(args: list[str] | None = None) -> None:
    """``guard.py [--grace S] [--owner PID] [--user UID] [--group GID] -- COMMAND...``"""
    options, argv = _options(sys.argv[1:] if args is None else args)
    code = run(argv, **options)  # type: ignore[arg-type]
    if code < 0:  # die by the same signal, so the owner sees what it would have seen
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
