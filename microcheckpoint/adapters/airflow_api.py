"""Airflow's REST API v2 over plain HTTP: pause, unpause, note a run, trigger a DAG.

Used by the Airflow tasks (through ``AirflowApiHook``, which reads a connection) and by the
CLI (``--airflow``), so both pause a pipeline DAG the same way. Tokens come from
``/auth/token`` (the simple auth manager and FAB both serve it).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import ServiceError

__all__ = ["AirflowApi"]


@dataclass(frozen=True)
class AirflowApi:
    """Airflow's API server at ``base`` (``http://host:port``).

    Args:
        base: the API server's URL.
        username: a user allowed to edit DAGs (None: the server hands out tokens freely,
            as the simple auth manager does with all admins).
        password: that user's password.
        source: what to name in errors (a connection id, a command-line option).
    """

    base: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = "the Airflow API settings"

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, token: str | None
    ) -> Any:
        url = self.base.rstrip("/") + path
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ServiceError(
                f"Airflow API {method} {url} answered {exc.code}: {detail}; check "
                f"{self.source} (address, login, password)"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServiceError(
                f"Airflow API at {url} is unreachable ({reason}); check {self.source}"
            ) from exc

    def token(self) -> str:
        """A bearer token for this user."""
        if self.username:
            body = {"username": self.username, "password": self.password or ""}
            return str(self._request("POST", "/auth/token", body, None)["access_token"])
        return str(self._request("GET", "/auth/token", None, None)["access_token"])

    def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        """Pause or unpause ``dag_id``; returns the DAG as the API reports it."""
        body = {"is_paused": paused}
        return dict(self._request("PATCH", f"/api/v2/dags/{dag_id}", body, self.token()))

    def set_note(self, dag_id: str, run_id: str, note: str) -> dict[str, Any]:
        """Set the note of run ``run_id`` of ``dag_id`` (at most 1000 characters)."""
        path = (
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}?update_mask=note"
        )
        return dict(self._request("PATCH", path, {"note": note[:1000]}, self.token()))

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a run of ``dag_id`` now with ``conf``; returns the run."""
        body = {"logical_date": None, "conf": dict(conf or {})}
        return dict(self._request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body, self.token()))
