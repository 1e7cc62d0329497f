"""Checkpoint history in the Airflow UI (like Flink's Checkpoints tab), and as JSON.

Served by Airflow's API server as a plugin FastAPI app under ``/microcheckpoint``:

- ``/microcheckpoint/`` — an HTML page per pipeline: checkpoints with status, abort
  reason, attempt, duration, records, state size, Airflow run and data interval;
  savepoints, the restore marker, and whether triggering is stopped;
- ``/microcheckpoint/api/pipelines`` and ``/microcheckpoint/api/pipelines/<name>`` — the
  same as JSON (``microcheckpoint.protocol.history.checkpoint_history``).

The pipelines are the ones the DAG files in the DAGs folder declare with
``pipeline_dags``; the files are read at most once a minute.

Every route needs Airflow's login (its FastAPI security dependency; the UI's session cookie
or a bearer token): an anonymous request gets 401. FastAPI's interactive docs pages load
their scripts from a CDN, so they are off; the OpenAPI schema is served, behind the same
login, at ``/microcheckpoint/api/openapi.json``.
"""

from __future__ import annotations

import html
import importlib.util
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint_airflow import factory
from microcheckpoint_airflow.hooks import CheckpointStorageHook
from microcheckpoint_airflow.spec import PipelineSpec

__all__ = ["app", "load_specs"]

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


@app.get("/api/openapi.json", include_in_schema=False)
def openapi() -> dict[str, Any]:
    """The JSON API's OpenAPI schema (behind the login, like every route here)."""
    return app.openapi()


_cache: dict[str, Any] = {"at": 0.0, "specs": {}}


def _dags_folder() -> Path:
    folder = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    if not folder:
        from airflow.configuration import conf

        folder = conf.get("core", "dags_folder")
    return Path(folder)


def load_specs(folder: Path | None = None, max_age_s: float = 60.0) -> dict[str, PipelineSpec]:
    """Pipelines declared by the DAG files in ``folder`` (cached for ``max_age_s``)."""
    if time.monotonic() - _cache["at"] < max_age_s and folder is None:
        return _cache["specs"]
    factory.REGISTRY.clear()
    for path in sorted((folder or _dags_folder()).glob("*.py")):
        if "pipeline_dags" not in path.read_text(errors="replace"):
            continue
        spec = importlib.util.spec_from_file_location(f"_mcp_dagfile_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception:  # an import error shows in Airflow's own DAG import errors
            continue
    specs = dict(factory.REGISTRY)
    if folder is None:
        _cache.update(at=time.monotonic(), specs=specs)
    return specs


def _history(spec: PipelineSpec) -> dict[str, Any]:
    hook = CheckpointStorageHook(spec.storage_conn_id)
    try:
        store = hook.get_store(spec.config.storage)
    except Exception:  # no connection access here: the environment's credentials
        from microcheckpoint.storage import open_store

        endpoint = os.environ.get("MICROCHECKPOINT_S3_ENDPOINT")
        options = {"endpoint_url": endpoint} if endpoint else {}
        store = open_store(spec.config.storage, **options)
    data = checkpoint_history(store, spec.name)
    data["dags"] = [spec.dag_id, spec.savepoint_dag_id, spec.restore_dag_id]
    return data


@app.get("/api/pipelines")
def pipelines() -> dict[str, Any]:
    return {
        name: {"storage": s.config.storage, "dag_id": s.dag_id} for name, s in load_specs().items()
    }


@app.get("/api/pipelines/{name}")
def pipeline_history(name: str) -> dict[str, Any]:
    specs = load_specs()
    if name not in specs:
        raise HTTPException(404, f"no pipeline {name!r}; known: {sorted(specs)}")
    return _history(specs[name])


def _time(ms: Any) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(data: dict[str, Any]) -> str:
    head = [
        "id",
        "status",
        "reason",
        "attempt",
        "triggered",
        "duration",
        "records",
        "state",
        "run",
        "interval",
    ]
    rows = []
    for c in data["checkpoints"]:
        labels = c.get("labels") or {}
        interval = " → ".join(labels.get("data_interval") or [])
        cells = [
            c["id"],
            c["status"],
            c.get("reason") or "",
            c.get("attempt", ""),
            _time(c.get("trigger_time_ms")),
            f"{c['duration_ms'] / 1000:.1f}s" if "duration_ms" in c else "",
            c.get("records", ""),
            c.get("state_bytes", ""),
            labels.get("run_id", ""),
            interval,
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


@app.get("/", response_class=HTMLResponse)
def index() -> str:
    sections = []
    for name, spec in sorted(load_specs().items()):
        try:
            data = _history(spec)
        except Exception as exc:
            sections.append(
                f"<h2>{html.escape(name)}</h2><p>unreadable: {html.escape(str(exc))}</p>"
            )
            continue
        stopped = data["stopped"]
        facts = [
            f"storage <code>{html.escape(data['storage'])}</code>",
            f"latest completed: {data['latest_completed']}",
            "triggering STOPPED: " + html.escape(stopped.get("reason", "")) if stopped else "",
            f"restored from <code>{html.escape(data['restored_from'])}</code>"
            if data["restored_from"]
            else "",
            f"<strong>restore note: {html.escape(data['restore_note'])}</strong>"
            if data.get("restore_note")
            else "",
        ]
        savepoints = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in data["savepoints"])
        sections.append(
            f"<h2>{html.escape(name)}</h2><p>{' · '.join(f for f in facts if f)}</p>"
            f"{_table(data)}<h3>Savepoints</h3><ul>{savepoints or '<li>none</li>'}</ul>"
        )
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}th{background:#eee}"
    )
    return (
        f"<html><head><title>Checkpoints</title><style>{style}</style></head><body>"
        f"<h1>Checkpoints</h1>{''.join(sections) or '<p>no pipelines</p>'}</body></html>"
    )
