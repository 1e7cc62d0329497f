"""The pipelines the DAG files declare, written down when a DAG file is parsed.

``pipeline_dags`` calls ``register`` for its spec; the Checkpoints page (served by the API
server) reads ``registered`` instead of executing DAG files itself. One small JSON file a
pipeline, in ``$MICROCHECKPOINT_REGISTRY`` or else ``$AIRFLOW_HOME/microcheckpoint/pipelines``
(the DAG processor and the API server share ``AIRFLOW_HOME`` in a deployment on one host; on
several hosts, point ``MICROCHECKPOINT_REGISTRY`` at a shared folder). A file is rewritten
only when its content changes, atomically, so a parse every 30 s writes nothing. The page
shows only pipelines whose DAG Airflow still has (a deleted DAG file's entry is ignored).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from microcheckpoint_airflow.spec import PipelineSpec

__all__ = ["register", "registered", "registry_dir"]

log = logging.getLogger(__name__)


def registry_dir() -> Path:
    folder = os.environ.get("MICROCHECKPOINT_REGISTRY")
    if folder:
        return Path(folder)
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return Path(home) / "microcheckpoint" / "pipelines"


def entry(spec: PipelineSpec) -> dict[str, Any]:
    """What the page needs of a pipeline: where its checkpoints are and its DAGs."""
    return {
        "name": spec.name,
        "storage": spec.config.storage,
        "storage_conn_id": spec.storage_conn_id,
        "kafka_conn_id": spec.kafka_conn_id,
        "dag_id": spec.dag_id,
        "savepoint_dag_id": spec.savepoint_dag_id,
        "restore_dag_id": spec.restore_dag_id,
        "after": spec.after,
    }


def register(spec: PipelineSpec, folder: Path | None = None) -> None:
    """Write ``spec``'s entry if it changed. Never fails a DAG file's parse: an unwritable
    folder is logged and the page then does not list the pipeline."""
    folder = folder or registry_dir()
    path = folder / f"{spec.name}.json"
    data = json.dumps(entry(spec), indent=1, sort_keys=True)
    try:
        if path.is_file() and path.read_text() == data:
            return
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("cannot register pipeline %s in %s: %s", spec.name, folder, exc)


def registered(folder: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every registered pipeline's entry, by name (unreadable files are skipped)."""
    folder = folder or registry_dir()
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            item = json.loads(path.read_text())
            found[str(item["name"])] = item
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping registry file %s: %s", path, exc)
    return found
