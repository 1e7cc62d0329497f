"""A Spark standalone cluster on loopback: one master and N workers, from pyspark's wheel.

pyspark's wheel has the cluster's classes but not ``sbin/start-master.sh``: the master and
each worker run in the foreground through ``bin/spark-class``, each a ``Service`` of
``harness.services`` (a process group of its own, a log file, stopped by process id). Every
port is a free loopback port (master, its web UI, each worker and its web UI), so several
clusters can run on one machine.

Executors are JVMs the workers start (``CoarseGrainedExecutorBackend``), with Python
workers of their own: they run this interpreter with the project importable, as the Spark
Connect server's do (``PYSPARK_PYTHON`` and ``PYTHONPATH`` in the workers' environment).
``SparkCluster.executors`` finds them by process, for tests that kill one.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.services import Service, _spawn, free_port
from microcheckpoint.errors import ServiceError

__all__ = ["EXECUTOR_CLASS", "Executor", "SparkCluster", "spark_home", "start_spark_cluster"]

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def spark_home() -> Path:
    """The pyspark package's folder, which is a ``SPARK_HOME`` (``bin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass(frozen=True)
class Executor:
    """One executor JVM of the cluster, as seen in the process table.

    Attributes:
        pid: the executor JVM's process id.
        worker_pid: the worker JVM that started it (its parent process; see
            ``SparkCluster.worker_pids``).
        app_id: the application (``app-…``) it runs for.
        executor_id: Spark's executor id within that application.
        python_pids: its Python worker processes at the time of the look (none before its
            first Python task, and none after ``spark.python.worker.reuse`` ends them).
    """

    pid: int
    worker_pid: int
    app_id: str
    executor_id: str
    python_pids: tuple[int, ...] = ()


@dataclass
class SparkCluster:
    """A running standalone cluster: ``master_url`` (``spark://127.0.0.1:PORT``) takes apps."""

    master_url: str
    web_url: str
    master: Service
    workers: list[Service]
    log_dir: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def services(self) -> list[Service]:
        """The master first, then the workers (stop in reverse)."""
        return [self.master, *self.workers]

    def status(self) -> dict:
        """The master's web UI JSON: ``workers``, ``activeapps``, ``completedapps``, …

        Raises:
            ServiceError: the master did not answer.
        """
        try:
            with urllib.request.urlopen(self.web_url + "/json/", timeout=5.0) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise ServiceError(
                f"the Spark master's web UI {self.web_url}/json/ did not answer ({exc}); "
                f"see {self.master.log_path}"
            ) from exc

    def alive_workers(self) -> int:
        """How many workers the master lists as ALIVE (0 while it does not answer)."""
        try:
            return sum(w.get("state") == "ALIVE" for w in self.status().get("workers", []))
        except ServiceError:
            return 0

    def executors(self, app_id: str | None = None) -> list[Executor]:
        """The executor JVMs the workers run now (of ``app_id`` only, if given), by pid.

        Edge cases: an executor that exits while it is being looked at is left out; a
        zombie (exited, not yet reaped by its worker) is left out.
        """
        workers = set(self.worker_pids())
        found = []
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
            info = proc.info
            cmdline = info["cmdline"] or []
            if info["ppid"] not in workers or EXECUTOR_CLASS not in cmdline:
                continue
            if info["status"] == psutil.STATUS_ZOMBIE:
                continue
            app = _arg(cmdline, "--app-id")
            if app_id is not None and app != app_id:
                continue
            try:
                pythons = tuple(
                    c.pid for c in proc.children(recursive=True) if "python" in c.name().lower()
                )
            except psutil.Error:
                continue
            found.append(
                Executor(proc.pid, info["ppid"], app, _arg(cmdline, "--executor-id"), pythons)
            )
        return sorted(found, key=lambda e: e.pid)

    def worker_pids(self) -> list[int]:
        """The worker JVMs' process ids, in worker order (a ``Service``'s own pid may be a
        process that runs the JVM, such as the harness's guard; the JVM is found under it).

        Raises:
            ServiceError: a worker has no JVM (it exited).
        """
        return [_jvm_pid(w, _WORKER_CLASS) for w in self.workers]

    def client_env(self) -> dict[str, str]:
        """Environment for a driver of this cluster (``spark-submit``, a Connect server)."""
        return dict(self.env)

    def stop(self) -> None:
        """Stop the workers (and so their executors), then the master, by process group."""
        for service in reversed(self.services):
            service.stop()


def _jvm_pid(service: Service, main_class: str) -> int:
    """The pid of the JVM running ``main_class``: ``service``'s process or one under it."""
    try:
        top = psutil.Process(service.pid)
        for proc in [top, *top.children(recursive=True)]:
            cmdline = proc.cmdline()  # a wrapper names the class too: only java counts
            if cmdline and Path(cmdline[0]).name == "java" and main_class in cmdline:
                return proc.pid
    except psutil.Error:
        pass
    raise ServiceError(
        f"{service.name} (pid {service.pid}) runs no {main_class} JVM; see {service.log_path}"
    )


def _arg(cmdline: list[str], flag: str) -> str:
    """The value after ``flag`` in ``cmdline`` ("" when absent)."""
    try:
        return cmdline[cmdline.index(flag) + 1]
    except (ValueError, IndexError):
        return ""


def _environment(log_dir: Path) -> dict[str, str]:
    """Variables for the daemons, the executors they start and the drivers: loopback only,
    this interpreter, the project importable, logs in ``log_dir``."""
    paths = [str(_PROJECT_ROOT), *(p for p in sys.path if p and Path(p).is_dir())]
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_PID_DIR": str(log_dir),
        "SPARK_DAEMON_MEMORY": "512m",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


def start_spark_cluster(
    log_dir: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout: float = 120.0,
) -> SparkCluster:
    """Start a master and ``workers`` workers on loopback; return once all are ALIVE.

    Steps: 1. the master, waited on until its web UI answers; 2. the workers, each with
    ``cores`` cores and ``memory`` for executors and a work folder under ``log_dir``;
    3. wait until the master lists ``workers`` ALIVE workers.

    Args:
        log_dir: the daemons' logs, and the workers' folders (``work-N/``: each
            executor's stdout and stderr).
        workers: how many workers (at least 1).
        cores: cores each worker offers (an application takes them all unless it sets
            ``spark.cores.max``: two applications at once wait for each other).
        memory: executor memory each worker offers (``1g`` fits one default executor).
        timeout: seconds for the whole start.

    Raises:
        ServiceError: a daemon exited or the workers did not register in time; whatever
            was started is stopped first.
    """
    if workers < 1:
        raise ServiceError(f"a Spark cluster of {workers} workers: give workers >= 1")
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _environment(log_dir)
    spark_class = str(spark_home() / "bin" / "spark-class")
    deadline = time.monotonic() + timeout
    # Step 1
    port, web_port = free_port(), free_port()
    argv = [spark_class, _MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--webui-port", str(web_port)]
    master_url = f"spark://127.0.0.1:{port}"
    master = _spawn("spark-master", argv, env, log_dir, master_url)
    cluster = SparkCluster(master_url, f"http://127.0.0.1:{web_port}", master, [], log_dir, env)
    try:
        _wait(cluster, lambda: _answers(cluster.web_url + "/json/"), deadline, "its web UI")
        # Step 2
        for n in range(workers):
            work = log_dir / f"work-{n}"
            argv = [spark_class, _WORKER_CLASS, "--host", "127.0.0.1"]
            argv += ["--port", str(free_port()), "--webui-port", str(free_port())]
            argv += ["--cores", str(cores), "--memory", memory, "--work-dir", str(work)]
            name = f"spark-worker-{n}"
            cluster.workers.append(_spawn(name, [*argv, master_url], env, log_dir, master_url))
        # Step 3
        _wait(cluster, lambda: cluster.alive_workers() == workers, deadline, f"{workers} workers")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def _wait(cluster: SparkCluster, ready, deadline: float, what: str) -> None:
    """Poll ``ready`` until the deadline; a daemon that exits ends the wait at once."""
    while time.monotonic() < deadline:
        for service in cluster.services:
            if not service.alive():
                raise ServiceError(
                    f"{service.name} exited with code {service.process.returncode} while the "
                    f"Spark cluster started; log {service.log_path}:\n{service.log_tail()}"
                )
        if ready():
            return
        time.sleep(0.2)
    raise ServiceError(
        f"the Spark master {cluster.master_url} did not report {what} in time; "
        f"log {cluster.master.log_path}:\n{cluster.master.log_tail()}"
    )
