"""A real Airflow for tests and the demo: ``airflow standalone`` on PostgreSQL, and a REST client.

``start_airflow`` starts a PostgreSQL server (``harness.postgres``) for the metadata database,
writes an ``AIRFLOW_HOME`` with the project's ``dags/`` (the plugin is the installed package's),
connections for the local broker and S3 server, and a known admin login, starts
``airflow standalone`` (API server, scheduler, DAG processor, triggerer, LocalExecutor) on
a free loopback port in its own process group, and waits until every component reports
healthy. ``AirflowClient`` speaks the REST API v2 the way the UI does.

An edge module: no Airflow import here (Airflow runs in its own processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.postgres import Postgres, start_postgres
from harness.services import S3Endpoint, Service, _spawn, free_port
from microcheckpoint.errors import ServiceError

__all__ = ["AirflowClient", "ApiError", "AirflowStack", "airflow_environment", "start_airflow"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"success", "failed"}
BACKFILL_REQUEST = "microcheckpoint_backfill_request"  # conf key tagging a creation's runs


class ApiError(ServiceError):
    """The API server answered an HTTP error; ``status`` and ``detail`` are its answer."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class AirflowClient:
    """REST API v2 with a bearer token from the simple auth manager.

    ``sqlite``: Airflow's metadata database is SQLite, whose single writer makes the API
    refuse calls now and then ("database is locked"); only then are the work-arounds below
    on. On PostgreSQL every error is raised at once: none is expected.
    """

    retry_pause_s = 1.0  # between retries of a refused call

    def __init__(self, base_url: str, username: str, password: str, sqlite: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.sqlite = sqlite
        self._token: str | None = None

    def _call(
        self, method: str, path: str, body: Any = None, auth: bool = True, retry: bool = True
    ) -> Any:
        """One API call. A call that a locked SQLite database refused is retried for up to a
        minute, unless ``retry`` is false.

        The API server writes its audit record on its event loop before the route runs; when
        another request holds SQLite's write lock and needs that loop to commit, the audit
        write waits out SQLite's 5 s busy timeout and the call fails with 500 (or 503 from
        the backfill route) "database is locked". Nothing of the call was stored then."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + 60
        while True:
            request = urllib.request.Request(
                self.base_url + path, data=data, method=method, headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    raw = response.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")
                locked = self.sqlite and retry and _locked(exc.code, detail)
                if not locked or time.monotonic() > deadline:
                    raise ApiError(
                        f"Airflow {method} {path} answered {exc.code}: {detail[:2000]}",
                        exc.code,
                        detail,
                    ) from exc
            time.sleep(self.retry_pause_s)

    def token(self) -> str:
        if self._token is None:
            body = {"username": self.username, "password": self.password}
            self._token = self._call("POST", "/auth/token", body, auth=False)["access_token"]
        return self._token

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    # -- DAGs and runs --------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        try:
            return self.get(f"/api/v2/dags/{dag_id}")
        except ServiceError as exc:
            if " 404:" in str(exc):
                return None
            raise

    def wait_dags(self, dag_ids: list[str], timeout: float = 120.0) -> None:
        """Until the DAG processor has parsed every DAG in ``dag_ids``."""
        deadline = time.monotonic() + timeout
        missing = list(dag_ids)
        while time.monotonic() < deadline:
            missing = [d for d in dag_ids if self.dag(d) is None]
            if not missing:
                return
            time.sleep(1)
        errors = self.get("/api/v2/importErrors").get("import_errors", [])
        raise ServiceError(
            f"DAGs {missing} not parsed within {timeout:.0f}s; import errors: {errors}"
        )

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run as the UI's Trigger form does (no logical date); returns its id."""
        body = {"logical_date": None, "conf": conf or {}}
        return self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        data = self.get(f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=run_after")
        return data["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}")

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300.0, poll: float = 1.0) -> str:
        """Until the run ends (asking every ``poll`` seconds); returns ``success`` or
        ``failed``."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run(dag_id, run_id)["state"]
            if state in TERMINAL:
                return state
            time.sleep(poll)
        raise ServiceError(f"run {run_id} of {dag_id} still {state} after {timeout:.0f}s")

    def quiesce(self, dag_id: str, timeout: float = 300.0) -> list[str]:
        """Pause ``dag_id`` with none of its runs left half done; returns their final states.

        The scheduler does not schedule the tasks of a paused DAG's runs, so a run caught in
        flight by the pause would wait for ever (and fail when Airflow stops). While a run
        is unfinished, the DAG is unpaused until that run ends, then paused again.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.set_paused(dag_id, True)
            runs = self.runs(dag_id)
            unfinished = [r["dag_run_id"] for r in runs if r["state"] not in TERMINAL]
            if not unfinished:
                return [r["state"] for r in runs]
            self.set_paused(dag_id, False)
            for run_id in unfinished:
                self.wait_run(dag_id, run_id, max(1.0, deadline - time.monotonic()))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        data = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in data["task_instances"]}

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """Set a task's state as the UI's "Mark as" buttons do (a running task is killed)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/{task_id}"
        self._call("PATCH", path, {"new_state": state})

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        data = self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances/"
            f"{task_id}/xcomEntries/return_value"
        )
        value = data["value"]
        return json.loads(value) if isinstance(value, str) and value[:1] in '[{"' else value

    def backfill(
        self, dag_id: str, from_date: str, to_date: str, reprocess: str = "none"
    ) -> list[dict[str, Any]]:
        """Create a backfill as the UI's Backfill form does; returns the backfills made (one,
        unless a creation had to be completed by another).

        On SQLite, Airflow 3.3 commits a new backfill before it creates its runs, and a lock
        met while creating them answers 503 after its best-effort cleanup, which may itself
        fail: the backfill then stays with only some of its runs. So the logical dates are
        asked first (dry run), each creation tags its runs' conf with a request id, and after
        an error the runs that were stored are looked up by that id, and once that partial
        backfill has finished the dates it lacks get a backfill of their own. A creation is
        never sent again blindly, so no interval runs twice, and they run in order."""
        body = {
            "dag_id": dag_id,
            "from_date": from_date,
            "to_date": to_date,
            "max_active_runs": 1,
            "reprocess_behavior": reprocess,
        }
        dry = self._call("POST", "/api/v2/backfills/dry_run", body)["backfills"]
        remaining = sorted(_instant(b["logical_date"]) for b in dry)
        if not remaining:
            raise ServiceError(
                f"no run to backfill for {dag_id} from {from_date} to {to_date} with reprocess "
                f"behavior {reprocess!r}: pick dates within the DAG's schedule, or reprocess "
                "'completed' to run finished intervals again"
            )
        made: list[dict[str, Any]] = []
        # Airflow allows one unfinished backfill per DAG. The scheduler marks one finished a
        # little after its last run, and an orphan two minutes after it was made: wait.
        deadline = time.monotonic() + 180
        while remaining:
            request = secrets.token_hex(8)
            part = {
                **body,
                "from_date": remaining[0].isoformat(),
                "to_date": remaining[-1].isoformat(),
                "dag_run_conf": {BACKFILL_REQUEST: request},
            }
            known = {b["id"] for b in self.backfills(dag_id)}
            try:
                made.append(self._call("POST", "/api/v2/backfills", part, retry=False))
                return made
            except ApiError as exc:
                # Only SQLite stores part of a creation that answered an error.
                stored = [b for b in self.backfills(dag_id) if b["id"] not in known]
                if stored and not self.sqlite:
                    raise
                if stored:
                    covered = self._backfill_dates(dag_id, request)
                    made.append(stored[-1])
                    remaining = [d for d in remaining if d not in covered]
                    deadline = time.monotonic() + 180
                    continue
                wait = "already a running backfill" in exc.detail or (
                    self.sqlite and _locked(exc.status, exc.detail)
                )
                if not wait or time.monotonic() > deadline:
                    raise
            time.sleep(2 * self.retry_pause_s)
        return made

    def _backfill_dates(self, dag_id: str, request: str) -> set[datetime]:
        """The logical dates of the runs a backfill creation tagged with ``request``."""
        query = urllib.parse.urlencode({"run_type": "backfill", "limit": 100, "order_by": "-id"})
        runs = self.get(f"/api/v2/dags/{dag_id}/dagRuns?{query}")["dag_runs"]
        return {
            _instant(run["logical_date"])
            for run in runs
            if (run.get("conf") or {}).get(BACKFILL_REQUEST) == request
        }

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        return self.get(f"/api/v2/backfills?dag_id={urllib.parse.quote(dag_id)}&limit=100")[
            "backfills"
        ]


@dataclass
class AirflowStack:
    service: Service
    client: AirflowClient
    home: Path
    port: int
    username: str
    password: str
    env: dict[str, str] = field(repr=False, default_factory=dict)
    postgres: Postgres | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop Airflow, then its metadata database."""
        try:
            self.service.stop(timeout=30)
        finally:
            if self.postgres is not None:
                self.postgres.stop()


def airflow_environment(
    home: Path,
    port: int,
    kafka_bootstrap: str,
    s3: S3Endpoint | None,
    password: str,
    extra: dict[str, str] | None = None,
    database_url: str | None = None,
    spark_connect: str | None = None,
) -> dict[str, str]:
    """Environment for every Airflow process: config, connections, paths.

    ``database_url`` is the metadata database (SQLAlchemy URL); SQLite in ``home`` if None.
    ``spark_connect`` (``sc://host:port``) becomes connection ``spark_connect_default``.
    """
    venv_bin = str(Path(sys.executable).parent)
    storage_conn: dict[str, Any] = {"conn_type": "microcheckpoint_storage"}
    if s3 is not None:
        storage_conn.update(
            login=s3.access_key,
            password=s3.secret_key,
            extra={"endpoint_url": s3.url, "region_name": s3.region},
        )
    env = {
        **os.environ,
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(PROJECT_ROOT),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        # The plugin comes from the installed package's `airflow.plugins` entry point.
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url or f"sqlite:///{home}/airflow.db",
        # A local stack: an API error shows its database cause instead of a lookup id.
        "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        # Free ports for the log servers too, so two stacks (a demo, the tests) can coexist.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW_CONN_MICROCHECKPOINT_STORAGE": json.dumps(storage_conn),
        "AIRFLOW_CONN_MICROCHECKPOINT_KAFKA": json.dumps(
            {"conn_type": "microcheckpoint_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
        ),
        "AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API": json.dumps(
            {
                "conn_type": "microcheckpoint_api",
                "host": "127.0.0.1",
                "port": port,
                "schema": "http",
                "login": "admin",
                "password": password,
            }
        ),
        # The consumer group of dags/wordcount_events.py's watcher. Tansu takes about half
        # the session timeout to let a consumer join: 6 s makes a watcher's restart 3 s.
        "AIRFLOW_CONN_WORDCOUNT_EVENTS_WATCH": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {
                    "bootstrap.servers": kafka_bootstrap,
                    "group.id": "microcheckpoint-watch-wordcount_events",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": "false",
                    "session.timeout.ms": "6000",
                },
            }
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PYSPARK_PYTHON": sys.executable,
        "NO_PROXY": "*",
    }
    if s3 is not None:
        env.update(s3.environment())
        env["MICROCHECKPOINT_S3_ENDPOINT"] = s3.url
    if spark_connect is not None:
        host, _, port = spark_connect.removeprefix("sc://").partition(":")
        env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
            {"conn_type": "spark_connect", "host": host, "port": int(port)}
        )
    env.update(extra or {})
    return env


def _wal_database(path: Path) -> None:
    """Create the metadata database in write-ahead-log mode (the mode is stored in the file):
    the scheduler's reads then no longer hold off the API server's writes."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")


def _locked(status: int, detail: str) -> bool:
    return status in (500, 503) and "database is locked" in detail.lower()


def _instant(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _healthy(client: AirflowClient) -> bool:
    try:
        request = urllib.request.Request(client.base_url + "/api/v2/monitor/health")
        with urllib.request.urlopen(request, timeout=2) as response:
            health = json.loads(response.read())
    except (OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(p) or {}).get("status") == "healthy" for p in parts)


def start_airflow(
    home: Path,
    kafka_bootstrap: str,
    s3: S3Endpoint | None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 240.0,
    database: str = "postgres",
    spark_connect: str | None = None,
) -> AirflowStack:
    """Start ``airflow standalone`` in ``home``; returns when all components are healthy.

    ``database`` is ``postgres`` (a PostgreSQL server of its own, the default) or ``sqlite``
    (one file in ``home``: one writer at a time, see docs/testing.md). ``spark_connect`` is a
    Spark Connect server's ``sc://`` URL for connection ``spark_connect_default``.
    """
    home.mkdir(parents=True, exist_ok=True)
    # Epoch tasks fork from the scheduler's executor: load their modules there, once.
    (home / "config").mkdir(exist_ok=True)
    shutil.copy(PROJECT_ROOT / "docker" / "airflow_local_settings.py", home / "config")
    postgres = None
    if database == "postgres":
        postgres = start_postgres(home / "postgres-log")
    elif database == "sqlite":
        _wal_database(home / "airflow.db")
    else:
        raise ValueError(f"database {database!r} is not one of postgres, sqlite")
    port = free_port()
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    env = airflow_environment(
        home,
        port,
        kafka_bootstrap,
        s3,
        password,
        extra_env,
        postgres.url if postgres else None,
        spark_connect,
    )
    airflow = Path(sys.executable).with_name("airflow")
    service = _spawn("airflow", [str(airflow), "standalone"], env, home, f"127.0.0.1:{port}")
    client = AirflowClient(
        f"http://127.0.0.1:{port}", "admin", password, sqlite=database == "sqlite"
    )
    stack = AirflowStack(service, client, home, port, "admin", password, env, postgres)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            stack.stop()
            raise ServiceError(
                f"airflow standalone exited with {service.process.returncode}; "
                f"log {service.log_path}:\n{service.log_tail(60)}"
            )
        if _healthy(client):
            return stack
        time.sleep(1)
    tail = service.log_tail(60)
    stack.stop()
    raise ServiceError(
        f"airflow standalone was not healthy within {timeout:.0f}s; log {service.log_path}:\n{tail}"
    )
