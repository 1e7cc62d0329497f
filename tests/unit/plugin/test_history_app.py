"""The Checkpoints page without a server: the registry the DAG files write at parse time,
the short cache of storage reads, and the HTML drawn from a stored history (counts, a
corrupt checkpoint as one row, plots with one point per checkpoint)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history
from microcheckpoint_airflow import pipeline_dags
from microcheckpoint_airflow.history_app import TimedCache
from microcheckpoint_airflow.history_page import duration, render_page, size
from microcheckpoint_airflow.registry import register, registered
from tests.unit.conftest import TP0, TP1
from tests.unit.plugin.test_factory import make_spec


def test_parsing_a_dag_file_registers_its_pipeline_once(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "registry"
    monkeypatch.setenv("MICROCHECKPOINT_REGISTRY", str(folder))
    pipeline_dags(make_spec("s3://bucket/chk"), start_date=datetime(2026, 1, 1))
    path = folder / "wc.json"
    assert json.loads(path.read_text()) == {
        "after": None,
        "dag_id": "wc_pipeline",
        "kafka_conn_id": "microcheckpoint_kafka",
        "name": "wc",
        "restore_dag_id": "wc_restore",
        "savepoint_dag_id": "wc_savepoint",
        "storage": "s3://bucket/chk",
        "storage_conn_id": "microcheckpoint_storage",
    }
    stamp = path.stat().st_mtime_ns
    pipeline_dags(make_spec("s3://bucket/chk"), start_date=datetime(2026, 1, 1))
    assert path.stat().st_mtime_ns == stamp  # a parse with nothing changed writes nothing
    register(make_spec("s3://bucket/other"), folder)
    assert registered(folder)["wc"]["storage"] == "s3://bucket/other"
    (folder / "broken.json").write_text("{")
    assert sorted(registered(folder)) == ["wc"]  # an unreadable entry is skipped
    assert registered(tmp_path / "absent") == {}


def test_storage_reads_are_cached_briefly() -> None:
    ttl = [60.0]
    cache = TimedCache(lambda: ttl[0])
    calls = []
    make = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert [cache.get("k", make), cache.get("k", make)] == [1, 1]
    assert cache.get("other", make) == 2
    ttl[0] = 0.0
    assert cache.get("k", make) == 3


def test_units() -> None:
    assert [size(None), size(512), size(1536), size(5 * 2**20)] == [
        "\u2013",
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
    ]
    assert [duration(850), duration(3200), duration(125_000)] == ["850 ms", "3.2 s", "2m 05s"]


def test_the_page_shows_counts_plots_and_a_corrupt_checkpoint_as_one_row(h) -> None:
    coord = h.coordinator(retained=10)
    for end in (3, 6, 9):
        h.epoch(coord, {TP0: end, TP1: end})
    h.store.put(h.layout.metadata(CheckpointId(2)), b"\x00garbage")
    data = checkpoint_history(h.store, "pipe")
    page = render_page(["pipe"], "pipe", data, detail=checkpoint_detail(h.store, "pipe", 3))
    counts = dict(re.findall(r'data-count="(\w+)"><div class="n">(\d+)<', page))
    assert counts == {
        "triggered": "3",
        "in_progress": "0",
        "completed": "3",
        "failed": "0",
        "restored": "0",
        "unreadable": "1",
    }
    rows = re.findall(r"<tr><td[^>]*><a href=[^>]*>#(\d+)</a></td><td[^>]*>(.*?)</td>", page)
    assert [(cid, "UNREADABLE" in cell) for cid, cell in rows] == [
        ("3", False),
        ("2", True),
        ("1", False),
    ]
    assert "_metadata is corrupt (not JSON" in page
    # One point per readable checkpoint in each plot.
    assert re.findall(r'aria-label="([^"]+)" data-points="(\d+)"', page) == [
        ("End-to-end duration", "2"),
        ("Full checkpoint size", "2"),
        ("Records per checkpoint", "2"),
    ]
    assert "Checkpoint #3" in page and "<code>agg#0</code>" in page  # the subtasks
    assert "cdn" not in page.lower() and "<script src" not in page  # nothing from elsewhere


def test_a_storage_error_is_said_on_the_page() -> None:
    page = render_page(["pipe"], "pipe", None, error="cannot read the checkpoints of 'pipe'")
    assert 'data-error="1"' in page and "cannot read the checkpoints of &#x27;pipe&#x27;" in page
    assert "No pipelines" in render_page([], None, None)
