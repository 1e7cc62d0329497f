"""The test harness's REST client against a small HTTP server that answers as Airflow 3.3's
API server did on SQLite: calls refused for a locked database, a backfill creation that
answered an error although it was stored, and one that was stored with only some of its
runs (Airflow commits the backfill before its runs, and its cleanup after a lock is
best-effort)."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import ThreadingHTTPServer

import pytest

from harness.airflow_stack import BACKFILL_REQUEST, AirflowClient
from microcheckpoint.errors import ServiceError
from tests.unit.jsonhttp import JsonHandler

FROM, TO = "2026-03-01T01:00:00+00:00", "2026-03-01T02:00:00+00:00"
HOURS = ["2026-03-01T01:00:00Z", "2026-03-01T02:00:00Z"]
LOCKED_500 = (500, {"detail": {"reason": "Database error", "orig_error": "database is locked"}})
LOCKED_503 = (503, {"detail": "Database is locked. Backfill creation is not supported"})
RUNNING_409 = (409, {"detail": "There is already a running backfill for dag d"})
BROKEN_500 = (500, {"detail": {"reason": "Database error", "orig_error": "no such column"}})
ALL = -1  # a creation stored with all of its runs


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


class FakeAirflow:
    """An hourly DAG. POST /api/v2/backfills follows a script of (error or None, runs
    stored: None for nothing, ALL, or how many of its first runs); while a stored backfill
    is unfinished, creations answer 409, and the first 409 finishes it (as the scheduler
    does once its runs are done)."""

    def __init__(self, script: list[tuple[tuple[int, dict] | None, int | None]]) -> None:
        self.script = list(script)
        self.posts: list[dict] = []
        self.stored: list[dict] = [{"id": 1, "from_date": FROM, "to_date": TO, "completed_at": "x"}]
        self.runs: list[dict] = []  # one per run a backfill created, with its conf
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def client(self) -> AirflowClient:
        client = AirflowClient(f"http://127.0.0.1:{self.server.server_port}", "admin", "pw")
        client.retry_pause_s = 0.01
        return client

    def hours(self, body: dict) -> list[str]:
        start, end = _parse(body["from_date"]), _parse(body["to_date"])
        count = int((end - start) / timedelta(hours=1)) + 1
        return [(start + timedelta(hours=h)).isoformat() for h in range(count)]

    def replayed(self) -> list[datetime]:
        return sorted(_parse(r["logical_date"]) for r in self.runs)

    def _handler(self):
        fake = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path.endswith("/dagRuns"):
                    query = urllib.parse.parse_qs(url.query)
                    assert query["run_type"] == ["backfill"]
                    self.answer(200, {"dag_runs": fake.runs, "total_entries": len(fake.runs)})
                    return
                self.answer(200, {"backfills": fake.stored, "total_entries": len(fake.stored)})

            def do_POST(self) -> None:
                body = self.body()
                if self.path == "/auth/token":
                    self.answer(201, {"access_token": "t"})
                    return
                if self.path.endswith("/dry_run"):
                    dates = [{"logical_date": h} for h in fake.hours(body)]
                    self.answer(200, {"backfills": dates, "total_entries": len(dates)})
                    return
                fake.posts.append(body)
                running = [b for b in fake.stored if b["completed_at"] is None]
                if running:
                    for b in running:
                        b["completed_at"] = "done"
                    self.answer(*RUNNING_409)
                    return
                error, stored = fake.script.pop(0)
                made = {
                    "id": len(fake.stored) + 1,
                    "from_date": body["from_date"],
                    "to_date": body["to_date"],
                    "completed_at": None,
                }
                if stored is not None:
                    fake.stored.append(made)
                    hours = fake.hours(body)
                    for hour in hours if stored == ALL else hours[:stored]:
                        fake.runs.append({"logical_date": hour, "conf": body["dag_run_conf"]})
                self.answer(*(error or (200, made)))

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake(request) -> Iterator[FakeAirflow]:
    server = FakeAirflow(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("fake", [[(LOCKED_500, ALL)]], indirect=True)
def test_a_creation_that_answered_an_error_but_was_stored_whole_is_not_made_again(fake) -> None:
    made = fake.client.backfill("d", FROM, TO, reprocess="completed")
    assert ([b["id"] for b in made], len(fake.posts)) == ([2], 1)
    assert fake.replayed() == [_parse(h) for h in HOURS]
    assert fake.posts[0]["reprocess_behavior"] == "completed"


@pytest.mark.parametrize("fake", [[(LOCKED_503, 1), (None, ALL)]], indirect=True)
def test_a_creation_stored_with_part_of_its_runs_is_completed_by_another(fake) -> None:
    made = fake.client.backfill("d", FROM, TO, reprocess="completed")
    assert [b["id"] for b in made] == [2, 3]
    # Each hour runs exactly once, in order: the second backfill waited for the first.
    assert fake.replayed() == [_parse(h) for h in HOURS]
    first, waited, rest = fake.posts
    assert (_parse(first["from_date"]), _parse(first["to_date"])) == (_parse(FROM), _parse(TO))
    assert (_parse(rest["from_date"]), _parse(rest["to_date"])) == (_parse(HOURS[1]),) * 2
    assert (waited["from_date"], waited["to_date"]) == (rest["from_date"], rest["to_date"])
    assert rest["reprocess_behavior"] == "completed"
    # Every creation tags its runs anew: the first's runs are not taken for the second's.
    assert len({p["dag_run_conf"][BACKFILL_REQUEST] for p in fake.posts}) == 3


@pytest.mark.parametrize("fake", [[(LOCKED_503, 0), (None, ALL)]], indirect=True)
def test_a_creation_stored_without_runs_is_made_again_once_it_is_finished(fake) -> None:
    made = fake.client.backfill("d", FROM, TO)
    assert [b["id"] for b in made] == [2, 3]
    assert fake.replayed() == [_parse(h) for h in HOURS]
    assert [_parse(p["from_date"]) for p in fake.posts] == [_parse(FROM)] * 3


@pytest.mark.parametrize(
    "fake",
    [
        [(LOCKED_503, None), (None, ALL)],
        [(LOCKED_500, None), (None, ALL)],
        [(RUNNING_409, None), (RUNNING_409, None), (None, ALL)],
    ],
    indirect=True,
)
def test_a_refused_creation_that_stored_nothing_is_retried_once_stored(fake) -> None:
    made = fake.client.backfill("d", FROM, TO)
    assert [b["id"] for b in made] == [2]
    assert fake.script == []  # every refusal was retried, and the success taken
    assert [b["id"] for b in fake.stored] == [1, 2]
    assert fake.replayed() == [_parse(h) for h in HOURS]


@pytest.mark.parametrize("fake", [[(BROKEN_500, None)]], indirect=True)
def test_another_database_error_is_raised_with_its_cause(fake) -> None:
    with pytest.raises(ServiceError, match=r"answered 500: .*no such column"):
        fake.client.backfill("d", FROM, TO)
    assert (len(fake.posts), len(fake.stored), fake.runs) == (1, 1, [])


@pytest.mark.parametrize("fake", [[(LOCKED_503, None)], [(LOCKED_500, 1)]], indirect=True)
def test_on_postgresql_no_sqlite_work_around_hides_an_error(fake) -> None:
    # On PostgreSQL a refused or partly stored creation is a real failure: raised at once,
    # not retried nor completed as on SQLite.
    client = fake.client
    client.sqlite = False
    with pytest.raises(ServiceError, match=r"answered 50[03]: .*locked"):
        client.backfill("d", FROM, TO)
    assert len(fake.posts) == 1


@pytest.mark.parametrize("fake", [[]], indirect=True)
def test_a_range_without_runs_is_refused_before_any_creation(fake) -> None:
    with pytest.raises(
        ServiceError, match=r"no run to backfill for d from .* reprocess behavior 'none'"
    ):
        fake.client.backfill("d", TO, FROM)
    assert (fake.posts, len(fake.stored)) == ([], 1)


def test_quiesce_lets_a_run_caught_by_the_pause_finish_then_pauses(monkeypatch) -> None:
    # `make demo` ends this way: a paused DAG's runs are not scheduled, so a run in flight
    # at the pause would be left half done (and fail when Airflow stops).
    client = AirflowClient("http://127.0.0.1:9", "admin", "pw")
    listings = iter(
        [
            [{"dag_run_id": "a", "state": "success"}, {"dag_run_id": "b", "state": "running"}],
            [{"dag_run_id": "a", "state": "success"}, {"dag_run_id": "b", "state": "success"}],
        ]
    )
    calls: list[tuple] = []
    monkeypatch.setattr(client, "runs", lambda dag_id: next(listings))
    monkeypatch.setattr(client, "set_paused", lambda dag_id, p: calls.append(("paused", p)))
    monkeypatch.setattr(
        client, "wait_run", lambda dag_id, run_id, t: calls.append(("wait", run_id)) or "success"
    )
    assert client.quiesce("wordcount_pipeline") == ["success", "success"]
    assert calls == [("paused", True), ("paused", False), ("wait", "b"), ("paused", True)]
