"""The Checkpoints page in the Airflow UI (like Flink's Checkpoints tab), and its JSON API.

Served by Airflow's API server as a plugin FastAPI app under ``/microcheckpoint`` and shown
in the UI's navigation (``external_views``):

- ``/microcheckpoint/?pipeline=NAME[&checkpoint=ID]`` — the page (``history_page``);
- ``/microcheckpoint/api/pipelines`` — the pipelines this user may read;
- ``/microcheckpoint/api/pipelines/NAME`` — ``checkpoint_history`` as JSON;
- ``/microcheckpoint/api/pipelines/NAME/checkpoints/ID`` — one checkpoint with subtasks;
- ``/microcheckpoint/api/openapi.json`` — the API's schema.

Every route needs Airflow's login (its FastAPI security dependency: the UI's session or a
bearer token). An anonymous person opening the page is sent to the auth manager's login
and back (``page_login``); the JSON API answers 401 as JSON. A pipeline's data needs read
access to its DAG. FastAPI's interactive docs pages load their scripts from a CDN: they
are off. The page's CSS and script are files under ``/microcheckpoint/static/`` (public:
they hold no data). Opened without ``?pipeline=`` (Airflow's menu), the page shows the
pipeline whose newest checkpoint was triggered last, so the menu lands on data.

The pipelines come from the registry the DAG files write when they are parsed
(``registry``), limited to DAGs Airflow still has: the API server executes no DAG file.
What is read from storage is cached for ``MICROCHECKPOINT_UI_CACHE_S`` seconds (default 5),
so page views and API calls do not list the bucket again and again. Errors are JSON bodies
with a ``detail`` of one line: 404 for an unknown pipeline (with the closest name) or
checkpoint, 422 for a malformed value (``/checkpoints/abc``), 503 when the storage cannot
be read; a corrupt checkpoint is one row with its error, not an error of the page.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history
from microcheckpoint_airflow import page_login
from microcheckpoint_airflow.history_page import STATIC, render_page
from microcheckpoint_airflow.registry import registered

__all__ = ["app", "newest_pipeline", "pipelines_for"]

log = logging.getLogger(__name__)

app = FastAPI(
    title="microcheckpoint",
    description="Checkpoint history of microcheckpoint pipelines",
    # The interactive docs load assets from a CDN (not offline) and FastAPI serves them
    # outside the app's dependencies (not behind the login): both off.
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
    dependencies=[Depends(requires_access_view(AccessView.WEBSITE))],
)
app.mount("/static", StaticFiles(directory=STATIC), name="static")
page_login.install(app)


class TimedCache:
    """Values by key, each kept ``ttl()`` seconds (thread-safe; the API server is async)."""

    def __init__(self, ttl: Callable[[], float]) -> None:
        self.ttl = ttl
        self._items: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and now - hit[0] < self.ttl():
                return hit[1]
        value = make()
        with self._lock:
            self._items[key] = (time.monotonic(), value)
        return value


def _ttl() -> float:
    return float(os.environ.get("MICROCHECKPOINT_UI_CACHE_S", "5"))


_reads = TimedCache(_ttl)
_replay_reads = TimedCache(lambda: max(60.0, _ttl()))


@app.exception_handler(RequestValidationError)
async def _bad_value(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A malformed path or query value (``/checkpoints/abc``, ``?checkpoint=x``): 422 with
    one line naming it, its value and what it must be, as every edge answers bad input."""
    first = exc.errors()[0] if exc.errors() else {}
    name = str((first.get("loc") or ["value"])[-1])
    wanted = str(first.get("msg") or "a valid value")
    detail = f"{name} = {first.get('input')!r} is invalid: {wanted[:1].lower()}{wanted[1:]}"
    return JSONResponse(status_code=422, content={"detail": detail})


def _unknown(name: str, known: list[str]) -> str:
    """The one line for a pipeline that is not there (or not for this user), with the
    closest name and the known ones."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"no pipeline {name!r} that you may read; {hint}known: {', '.join(known) or 'none'}"


@app.get("/api/openapi.json", include_in_schema=False)
def openapi() -> dict[str, Any]:
    """The JSON API's OpenAPI schema (behind the login, like every route here)."""
    return app.openapi()


def _active(dag_ids: list[str]) -> set[str] | None:
    """Which of ``dag_ids`` Airflow has and has not marked stale (None: cannot tell)."""
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            query = select(DagModel.dag_id).where(
                DagModel.dag_id.in_(dag_ids), DagModel.is_stale.is_(False)
            )
            return set(session.scalars(query))
    except Exception as exc:  # no metadata database here: show what is registered
        log.warning("cannot read Airflow's DAGs: %s", exc)
        return None


def _readable(user: Any) -> set[str] | None:
    """The DAG ids ``user`` may read (None: cannot tell, e.g. outside the API server)."""
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))
    except Exception as exc:
        log.warning("cannot read the DAGs %s may read: %s", user, exc)
        return None


def pipelines_for(user: Any) -> dict[str, dict[str, Any]]:
    """The registered pipelines whose DAG Airflow has and ``user`` may read."""
    entries = _reads.get("registry", registered)
    active = _reads.get(
        ("active", tuple(sorted(entries))), lambda: _active([e["dag_id"] for e in entries.values()])
    )
    readable = _readable(user) if user is not None else None
    return {
        name: e
        for name, e in entries.items()
        if (active is None or e["dag_id"] in active)
        and (readable is None or e["dag_id"] in readable)
    }


def _store(entry: dict[str, Any]) -> Any:
    """The pipeline's checkpoint store, opened once per storage and connection (a page view
    does not build a new S3 client)."""
    return _open_store(entry["storage"], entry["storage_conn_id"])


@functools.lru_cache(maxsize=64)
def _open_store(storage: str, conn_id: str) -> Any:
    from microcheckpoint_airflow.hooks import CheckpointStorageHook

    try:
        return CheckpointStorageHook(conn_id).get_store(storage)
    except Exception:  # no connection access here: the environment's settings
        from microcheckpoint.ops import StorageSettings

        return StorageSettings.from_env().open(storage)


def _entry(name: str, user: Any) -> dict[str, Any]:
    entries = pipelines_for(user)
    if name not in entries:
        raise HTTPException(404, _unknown(name, sorted(entries)))
    return entries[name]


def _history(entry: dict[str, Any]) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        data = checkpoint_history(_store(entry), entry["name"])
        data["dags"] = [entry["dag_id"], entry["savepoint_dag_id"], entry["restore_dag_id"]]
        return data

    try:
        return _reads.get(("history", entry["name"]), read)
    except Exception as exc:
        raise HTTPException(
            503,
            f"cannot read the checkpoints of {entry['name']!r} in {entry['storage']}: "
            f"{type(exc).__name__}: {exc}; check the storage connection "
            f"{entry['storage_conn_id']!r} and that the storage is reachable",
        ) from exc


def _replay(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The replayability warnings of the pipeline's retained points (docs/operations.md),
    cached for a minute: they ask Kafka. Kafka out of reach is one warning, not an error."""

    def read() -> list[dict[str, Any]]:
        from microcheckpoint.adapters.kafka_replay import replay_warnings
        from microcheckpoint_airflow.hooks import KafkaHook

        try:
            bootstrap = KafkaHook(entry["kafka_conn_id"]).bootstrap_servers()
        except Exception:
            bootstrap = os.environ.get("MICROCHECKPOINT_KAFKA_BOOTSTRAP", "")
        try:
            return replay_warnings(_store(entry), entry["name"], bootstrap, request_timeout_ms=3000)
        except Exception as exc:
            return [
                {
                    "severity": "unchecked",
                    "message": f"Replayability not checked: Kafka at {bootstrap!r} did not "
                    f"answer ({exc}); check the connection {entry['kafka_conn_id']!r}",
                }
            ]

    return _replay_reads.get(("replay", entry["name"]), read)


def _detail(entry: dict[str, Any], checkpoint: int) -> dict[str, Any]:
    try:
        return _reads.get(
            ("detail", entry["name"], checkpoint),
            lambda: checkpoint_detail(_store(entry), entry["name"], checkpoint),
        )
    except CheckpointNotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except Exception as exc:
        raise HTTPException(
            503,
            f"cannot read checkpoint {checkpoint} of {entry['name']!r}: "
            f"{type(exc).__name__}: {exc}",
        ) from exc


@app.get("/api/pipelines")
def pipelines(user: GetUserDep) -> dict[str, Any]:
    """The pipelines, by name: storage and DAG ids."""
    return {
        name: {"storage": e["storage"], "dag_id": e["dag_id"]}
        for name, e in pipelines_for(user).items()
    }


@app.get("/api/pipelines/{name}")
def pipeline_history(name: str, user: GetUserDep) -> dict[str, Any]:
    """The pipeline's checkpoint history (``microcheckpoint.protocol.history``), with the
    replayability warnings of its retained points (``replay_warnings``)."""
    entry = _entry(name, user)
    return {**_history(entry), "replay_warnings": _replay(entry)}


@app.get("/api/pipelines/{name}/checkpoints/{checkpoint}")
def pipeline_checkpoint(name: str, checkpoint: int, user: GetUserDep) -> dict[str, Any]:
    """One checkpoint: its row, offsets, per-subtask statistics and configuration."""
    return _detail(_entry(name, user), checkpoint)


def newest_pipeline(entries: dict[str, dict[str, Any]]) -> str | None:
    """The pipeline whose newest checkpoint was triggered last; None when none has a
    checkpoint. A pipeline whose storage cannot be read is passed over (its tab says why).
    Ties go to the first name."""
    best, newest = None, -1
    for name in sorted(entries):
        try:
            rows = _history(entries[name])["checkpoints"]
        except HTTPException:
            continue
        times = [r["trigger_time_ms"] for r in rows if r.get("trigger_time_ms") is not None]
        if times and max(times) > newest:
            best, newest = name, max(times)
    return best


@app.get("/", response_class=HTMLResponse)
def index(
    request: Request,
    user: GetUserDep,
    pipeline: str | None = Query(None),
    checkpoint: int | None = Query(None),
) -> str:
    """The page: ``pipeline``'s history (else the one with the newest checkpoint), and
    ``checkpoint``'s details when given."""
    entries = pipelines_for(user)
    names = sorted(entries)
    current = pipeline if pipeline in entries else None
    if current is None and names:
        current = newest_pipeline(entries) or names[0]
    data = detail = error = None
    warnings: list[dict[str, Any]] = []
    if pipeline is not None and pipeline not in entries:
        error = _unknown(pipeline, names)
    if current is not None:
        try:
            data = _history(entries[current])
            warnings = _replay(entries[current])
            if checkpoint is not None:
                detail = _detail(entries[current], checkpoint)
        except HTTPException as exc:
            error = str(exc.detail)
    static = request.scope.get("root_path", "") + "/static"
    return render_page(
        names, current, data, error=error, detail=detail, warnings=warnings, static=static
    )
