"""The Checkpoints page without a server: the registry the DAG files write at parse time,
the short cache of storage reads, and the HTML drawn from a stored history (counts, a
corrupt checkpoint as one row, plots with one point per checkpoint)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history
from microcheckpoint_airflow import pipeline_dags
from microcheckpoint_airflow.history_app import TimedCache
from microcheckpoint_airflow.history_page import STATIC, TEMPLATES, render_page
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
    # Nothing from elsewhere: the CSS and the script are the plugin's own static files.
    assert re.findall(r'(?:src|href)="([^"?#]+\.(?:css|js))"', page) == [
        "static/checkpoints.css",
        "static/checkpoints.js",
    ]
    assert {p.name for p in STATIC.iterdir()} == {"checkpoints.css", "checkpoints.js"}
    assert "<style" not in page and " onclick=" not in page and page.count("<script") == 1


def test_a_storage_error_is_said_on_the_page() -> None:
    page = render_page(["pipe"], "pipe", None, error="cannot read the checkpoints of 'pipe'")
    assert 'data-error="1"' in page and "cannot read the checkpoints of &#39;pipe&#39;" in page
    assert "No pipelines" in render_page([], None, None)


SCRIPT = "<script>alert(1)</script>"


def test_markup_in_a_name_label_or_error_is_shown_as_text(h) -> None:
    """The page is rendered by an autoescaping template: a pipeline, a run label, a reason or
    a setting holding markup is text on the page, never a script."""
    assert TEMPLATES.joinpath("checkpoints.html").is_file()
    coord = h.coordinator(retained=10)
    h.epoch(coord, {TP0: 3, TP1: 3})
    data = checkpoint_history(h.store, "pipe")
    data["checkpoints"][0]["labels"] = {"dag_id": SCRIPT, "run_id": SCRIPT}
    data["checkpoints"][0]["reason"] = SCRIPT
    data["config"]["topics"] = [SCRIPT]
    data["storage"] = SCRIPT
    name = f"pipe{SCRIPT}"
    page = render_page([name], name, data, error=SCRIPT, warnings=[{"message": SCRIPT}])
    assert "<script>alert" not in page
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    # the tab, the title, the error, the storage, the run link (twice: title and text),
    # the reason, the replay box and the topics setting
    assert page.count(escaped) == 10
    assert page.count("<script") == 1  # the page's own script file


def test_the_configuration_reads_in_words_with_units(h) -> None:
    coord = h.coordinator(retained=10)
    h.epoch(coord, {TP0: 3, TP1: 3})
    data = checkpoint_history(h.store, "pipe")
    config = {"pipeline": "pipe", "storage": "s3://bucket/chk", "topics": ["lines"]}
    data["config"] = CheckpointConfig.from_mapping(
        {**config, "timeout": "10min", "min_pause": 0, "interval": "90s"}
    ).to_mapping()
    page = render_page(["pipe"], "pipe", data)
    shown = dict(re.findall(r'<tr data-setting="[^"]*"><td>([^<]*)</td><td>([^<]*)</td>', page))
    assert shown == {
        "Pipeline": "pipe",
        "Checkpoint storage": "s3://bucket/chk",
        "Topics": "lines",
        "Kafka group id": "microcheckpoint-pipe (default)",
        "Mode": "exactly once",
        "Checkpoint interval": "90 s",
        "Checkpoint timeout": "10 min",
        "Min pause": "0 s",
        "Max concurrent checkpoints": "1",
        "Tolerable failed checkpoints": "0",
        "Retained checkpoints": "1",
        "Externalized checkpoint cleanup": "retain on cancellation",
        "Unaligned checkpoints": "off",
        "Aligned checkpoint timeout": "0 s",
        "Max parallelism": "128",
        "Max records per checkpoint": "no limit",
        "Barrier policy": "latest",
        "Incremental checkpoints": "on",
        "Startup mode": "group offsets",
        "Startup timestamp": "\u2013",
    }


def test_a_checkpoints_details_show_each_subtasks_times_and_per_operator(h) -> None:
    coord = h.coordinator(retained=10)
    meta = h.epoch(coord, {TP0: 3, TP1: 3})
    detail = checkpoint_detail(h.store, "pipe", meta.checkpoint_id.value)
    detail["subtasks"][0].update(end_to_end_ms=1500, sync_ms=12.5, async_ms=0.25)
    data = checkpoint_history(h.store, "pipe")
    page = render_page(["pipe"], "pipe", data, detail=detail)
    task = detail["subtasks"][0]["task"]
    row = re.search(rf'<tr data-task="{task}">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r'<td class="r" data-part="(\w+)" data-ms="([^"]+)">([^<]*)</td>', row[1])
    assert cells == [
        ("end_to_end_ms", "1500", "1.5 s"),
        ("sync_ms", "12.5", "12 ms"),
        ("async_ms", "0.25", "0.25 ms"),
    ]
    assert re.findall(r'<tr data-operator="([^"]+)">', page) == sorted(detail["operators"])


def test_a_checkpoints_details_name_the_slowest_subtask_and_a_failed_task(h) -> None:
    coord = h.coordinator(retained=10)
    meta = h.epoch(coord, {TP0: 3, TP1: 3})
    detail = checkpoint_detail(h.store, "pipe", meta.checkpoint_id.value)
    phases = {
        "waiting to start": 700.0,
        "read": 118.0,
        "keyed": 50.0,
        "snapshot upload": 30.0,
        "ack": 2.0,
    }
    detail["slowest"] = {
        "task": "agg#0",
        "end_to_end_ms": 900,
        "phases": phases,
        "why": "waiting to start",
        "why_ms": 700.0,
    }
    page = render_page(["pipe"], "pipe", checkpoint_history(h.store, "pipe"), detail=detail)
    panel = re.search(
        r'<div class="panel" data-slowest="agg#0" data-why="waiting to start">(.*?)</div>',
        page,
        re.S,
    )
    assert panel is not None
    cells = re.findall(
        r'<td class="r" data-part="([\w ]+)" data-ms="([^"]+)">([^<]*)</td>', panel[1]
    )
    assert cells == [
        ("end_to_end_ms", "900", "900 ms"),
        ("waiting to start", "700.0", "700 ms"),
        ("read", "118.0", "118 ms"),
        ("keyed", "50.0", "50 ms"),
        ("snapshot upload", "30.0", "30 ms"),
        ("ack", "2.0", "2 ms"),
    ]
    assert "<strong>waiting to start</strong> (700 ms)" in panel[1]
    # A failed checkpoint names the task and the cause above its details.
    failed = {"id": 2, "status": "ABORTED", "reason": "DECLINED", "detail": "task agg#1: E: x",
              "failed_task": "agg#1", "cause": "ValueError: bad row 3"}  # fmt: skip
    page = render_page(["pipe"], "pipe", checkpoint_history(h.store, "pipe"), detail=failed)
    assert (
        '<div class="warn err" data-failed-task="agg#1">Failed: task <code>agg#1</code>: '
        "ValueError: bad row 3</div>"
    ) in page


def test_the_restores_section_lists_each_restore_and_cancel_with_what_followed(
    h, monkeypatch
) -> None:
    from types import SimpleNamespace

    from microcheckpoint.formatting import NONE
    from microcheckpoint.ops import cancel_pipeline
    from microcheckpoint.protocol import savepoints
    from tests.unit.ops.test_operations import target
    from tests.unit.protocol.test_restores import CLI, epoch, restore

    monkeypatch.setattr(savepoints, "time", SimpleNamespace(time=lambda: h.t[0]))
    empty = render_page(["pipe"], "pipe", checkpoint_history(h.store, "pipe"))
    assert 'data-restores="0"' in empty and "data-restores-summary" not in empty
    epoch(h, 10, 2)
    epoch(h, 25, 2)
    h.t[0] = 1010.0
    restore(h, "1", {"dag_id": "pipe_restore", "run_id": "manual__1"}, parallelism=3)
    h.t[0] = 1020.0
    epoch(h, 30, 3)
    h.t[0] = 1030.0
    cancel_pipeline(target(h, retained=5), labels=CLI, now=lambda: h.t[0])
    page = render_page(["pipe"], "pipe", checkpoint_history(h.store, "pipe"))
    rows = re.findall(r'<tr data-restore="[^"]+" data-kind="(\w+)"[^>]*>(.*?)</tr>', page, re.S)
    assert [kind for kind, _ in rows] == ["cancel", "rescale"]
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[1][1], re.S)
    ]
    assert cells == [
        "1970-01-01 00:16:50",
        "rescale",
        "chk-0000000001",
        "NO_CLAIM",
        "agg 2→3, source 1",
        "manual__1",  # the Airflow run, linked
        "15",
        "#3",
        "12.5 s",
    ]
    assert '<a href="/dags/pipe_restore/runs/manual__1"' in rows[1][1]
    assert 'data-ms="12500"' in rows[1][1]
    cancel = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)
    ]
    assert cancel[1:8] == [
        "cancel",
        "chk-0000000003",
        NONE,
        "agg 3, source 1",
        "cli:alice",
        NONE,
        NONE,
    ]
    assert len(cancel) == 9
    # A note has a row of its own under its event, as wide as the columns after the time.
    notes = re.findall(
        r'<tr data-restore-note="([^"]+)"><td></td><td colspan="8"[^>]*>(.*?)</td>', page
    )
    assert [(i, re.sub(r"<[^>]+>", "", n)) for i, n in notes] == [
        (re.search(r'<tr data-restore="([^"]+)" data-kind="cancel"', page).group(1),
         "RETAIN_ON_CANCELLATION; aborted: none; deleted 0 objects"),
    ]  # fmt: skip
    assert 'data-kind="cancel" class="noted"' in page
    summary = re.search(r"<p class=\"muted\" data-restores-summary>(.*?)</p>", page, re.S)
    assert summary is not None and summary.group(1) == (
        "2 in all: rescale 1, cancel 1 · time to the first checkpoint after a restore: "
        "p50 12.5 s, p90 12.5 s, max 12.5 s (over 1)"
    )
