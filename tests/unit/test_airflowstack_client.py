"""The test harness's REST client against a small HTTP server that answers as Airflow's
API server did on SQLite: calls refused for a locked database, and a backfill creation that
answered an error although it was stored."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from microcheckpoint.airflowstack import AirflowClient
from microcheckpoint.errors import ServiceError

FROM, TO = "2026-03-01T01:00:00+00:00", "2026-03-01T02:00:00+00:00"
LOCKED_500 = (500, {"detail": {"reason": "Database error", "orig_error": "database is locked"}})
LOCKED_503 = (503, {"detail": "Database is locked. Backfill creation is not supported"})
RUNNING_409 = (409, {"detail": "There is already a running backfill for dag d"})
BROKEN_500 = (500, {"detail": {"reason": "Database error", "orig_error": "no such column"}})


class FakeAirflow:
    """Answers POST /api/v2/backfills from a script: (status, body, stored?) per call."""

    def __init__(self, script: list[tuple[tuple[int, dict] | None, bool]]) -> None:
        self.script = list(script)
        self.posts = 0
        self.stored: list[dict] = [{"id": 1, "from_date": FROM, "to_date": TO, "completed_at": "x"}]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def client(self) -> AirflowClient:
        return AirflowClient(f"http://127.0.0.1:{self.server.server_port}", "admin", "pw")

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._send(200, {"backfills": fake.stored, "total_entries": len(fake.stored)})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/auth/token":
                    self._send(201, {"access_token": "t"})
                    return
                fake.posts += 1
                error, store = fake.script.pop(0)
                made = {
                    "id": len(fake.stored) + 1,
                    "from_date": body["from_date"].replace("+00:00", "Z"),
                    "to_date": body["to_date"].replace("+00:00", "Z"),
                    "completed_at": None,
                }
                if store:
                    fake.stored.append(made)
                self._send(*(error or (200, made)))

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake(request) -> Iterator[FakeAirflow]:
    server = FakeAirflow(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("fake", [[(LOCKED_500, True)]], indirect=True)
def test_a_creation_that_answered_an_error_but_was_stored_is_not_made_again(fake) -> None:
    made = fake.client.backfill("d", FROM, TO, reprocess="completed")
    assert (made["id"], fake.posts) == (2, 1)
    assert len(fake.stored) == 2


@pytest.mark.parametrize(
    "fake",
    [
        [(LOCKED_503, False), (None, True)],
        [(LOCKED_500, False), (None, True)],
        [(RUNNING_409, False), (RUNNING_409, False), (None, True)],
    ],
    indirect=True,
)
def test_a_refused_creation_that_stored_nothing_is_retried_once_stored(fake) -> None:
    made = fake.client.backfill("d", FROM, TO)
    assert made["id"] == 2
    assert fake.script == []  # every refusal was retried, and the success taken
    assert [b["id"] for b in fake.stored] == [1, 2]


@pytest.mark.parametrize("fake", [[(BROKEN_500, False)]], indirect=True)
def test_another_database_error_is_raised_with_its_cause(fake) -> None:
    with pytest.raises(ServiceError, match=r"answered 500: .*no such column"):
        fake.client.backfill("d", FROM, TO)
    assert (fake.posts, len(fake.stored)) == (1, 1)
