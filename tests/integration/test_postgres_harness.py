"""The PostgreSQL the Airflow harness runs on: started on loopback, answers, stopped by pid."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import pytest

from harness.postgres import start_postgres

pytestmark = pytest.mark.integration


def test_postgres_starts_answers_and_stops_with_nothing_left(tmp_path: Path) -> None:
    server = start_postgres(tmp_path / "logs")
    try:
        host_port = server.url.split("@", 1)[1].split("/", 1)[0]
        host, port = host_port.split(":")
        assert host == "127.0.0.1"
        db = psycopg2.connect(host=host, port=int(port), user="postgres", dbname="airflow")
        cursor = db.cursor()
        cursor.execute("show fsync")
        assert cursor.fetchone() == ("off",)
        cursor.execute("select current_database()")
        assert cursor.fetchone() == ("airflow",)
        pid = server.service.pid
        # A client still connected does not hold the stop up (a fast shutdown).
    finally:
        server.stop()
    assert not server.service.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not server.data_dir.exists()
