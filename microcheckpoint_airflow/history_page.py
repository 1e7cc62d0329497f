"""The Checkpoints page as HTML: ``checkpoint_history`` data rendered by an autoescaping
Jinja2 template (``templates/checkpoints.html``); pure functions, no I/O but the template.

Flink's Checkpoints tab, with Airflow 3's look: an overview, the latest checkpoints, plots
of duration, size and records over time (inline SVG), the history with offsets on demand,
a summary, the configuration in words with units, the savepoints, the restores (Flink's
Rescales tab: every restore, rescale, fallback and cancel), and one checkpoint's
subtasks with Flink's end to end, sync and async times and their min / avg / max per
operator. The CSS and the refresh script are files in ``static/``, served by the plugin's
app (nothing is loaded from elsewhere). Every value reaches the HTML through the
template's escaping, so a pipeline, label or error holding markup shows as text.

Numbers are formatted by ``microcheckpoint.formatting`` (the CLI's formatter too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2

from microcheckpoint.formatting import (
    NONE,
    duration,
    parallelism_change,
    point_name,
    settings,
    size,
    timestamp,
)

__all__ = ["STATIC", "TEMPLATES", "render_page"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _filter(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    """``fmt`` as a template filter: a value the row does not have is no value (a dash)."""
    return lambda value: fmt(None if isinstance(value, jinja2.Undefined) else value)


_ENV.filters.update(size=_filter(size), duration=_filter(duration), when=_filter(timestamp))

PLOT_WIDTH, PLOT_HEIGHT, PLOT_LEFT, PLOT_BOTTOM, PLOT_TOP = 330, 150, 62, 22, 8
COUNTS = [
    ("triggered", "Triggered"),
    ("in_progress", "In progress"),
    ("completed", "Completed"),
    ("failed", "Failed"),
    ("restored", "Restored"),
]


def run_link(labels: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The Airflow run recorded in ``labels`` as ``{href, text, title}`` (None: no run)."""
    labels = labels or {}
    dag, run = labels.get("dag_id"), labels.get("run_id")
    if not dag or not run:
        return None
    href = f"/dags/{quote(str(dag), safe='')}/runs/{quote(str(run), safe='')}"
    return {"href": href, "text": str(run), "title": str(dag)}


def plot(title: str, points: list[tuple[int, float, str]], fmt: Callable[[float], str]) -> dict:
    """A small line plot of ``(checkpoint id, value, status)`` over checkpoint ids: the
    geometry the template draws as SVG, its axis labelled in ``fmt`` units (failed
    checkpoints are red dots off the line). No points: ``count`` 0 and no geometry."""
    if not points:
        return {"title": title, "count": 0}
    ids = [p[0] for p in points]
    high = max(p[1] for p in points) or 1.0
    lo_id, hi_id = min(ids), max(ids)
    span = max(1, hi_id - lo_id)
    inner = PLOT_WIDTH - PLOT_LEFT - 10

    def x(cid: int) -> float:
        return round(PLOT_LEFT + inner * ((cid - lo_id) / span if hi_id > lo_id else 0.5), 1)

    def y(value: float) -> float:
        return round(PLOT_TOP + (PLOT_HEIGHT - PLOT_TOP - PLOT_BOTTOM) * (1 - value / high), 1)

    return {
        "title": title,
        "count": len(points),
        "width": PLOT_WIDTH,
        "height": PLOT_HEIGHT,
        "left": PLOT_LEFT,
        "line": " ".join(f"{x(c)},{y(v)}" for c, v, s in points if s == "COMPLETED"),
        "dots": [
            {"x": x(c), "y": y(v), "status": s, "title": f"#{c}: {fmt(v)} ({s})"}
            for c, v, s in points
        ],
        "grid": [{"y": y(high * f), "label": fmt(high * f)} for f in (0, 0.5, 1)],
        "axis": [{"x": x(c), "label": f"#{c}"} for c in sorted({lo_id, hi_id})],
    }


def _plots(data: Mapping[str, Any]) -> list[dict]:
    rows = [c for c in reversed(data["checkpoints"]) if "error" not in c]
    timed = [(c["id"], float(c["duration_ms"]), c["status"]) for c in rows if "duration_ms" in c]
    done = [c for c in rows if c["status"] == "COMPLETED"]
    sizes = [(c["id"], float(c["full_size"] or 0), c["status"]) for c in done if "full_size" in c]
    records = [(c["id"], float(c.get("records") or 0), c["status"]) for c in rows]
    return [
        plot("End-to-end duration", timed, duration),
        plot("Full checkpoint size", sizes, size),
        plot("Records per checkpoint", records, lambda v: f"{v:.0f}"),
    ]


def _latest(data: Mapping[str, Any]) -> list[dict]:
    """The rows of the Latest table: completed, failed, savepoint, restore."""
    latest = data["latest"]
    rows = []
    for key, label in (("completed", "Completed checkpoint"), ("failed", "Failed checkpoint")):
        item = latest.get(key)
        rows.append(
            {
                "label": label,
                "item": item,
                "what": None if item is None else f"#{item.get('id')}",
                "reason": None if item is None else item.get("reason"),
                "detail": None if item is None else item.get("detail") or item.get("error"),
            }
        )
    sp, rs = latest.get("savepoint"), latest.get("restore")
    rows.append(
        {
            "label": "Savepoint",
            "item": sp,
            "code": None if sp is None else sp.get("url"),
            "detail": None if sp is None else f"from checkpoint #{sp.get('checkpoint_id')}",
        }
    )
    note = None
    if rs is not None:
        parallelism = f" parallelism {rs['parallelism']}" if rs.get("parallelism") else ""
        note = (rs.get("note") or "") + parallelism
    rows.append({"label": "Restore", "item": rs, "code": rs and rs.get("source"), "detail": note})
    for row in rows:
        item = row["item"] or {}
        row.update(time=item.get("time_ms"), run=run_link(item.get("labels")))
    return rows


def _history(data: Mapping[str, Any]) -> list[dict]:
    """The History table's rows, newest first (an unreadable checkpoint: its error only)."""
    rows = []
    for c in data["checkpoints"]:
        got = c.get("acknowledged")
        rows.append(
            {
                **c,
                "acked": f"{NONE if got is None else got}/{c.get('total', '?')}",
                "run": run_link(c.get("labels")),
                "offsets": [
                    (tp, lo, hi) for tp, (lo, hi) in sorted((c.get("ranges") or {}).items())
                ],
            }
        )
    return rows


def _summary(data: Mapping[str, Any]) -> list[dict]:
    formats: dict[str, tuple[str, Callable[[float], str]]] = {
        "duration_ms": ("End-to-end duration", duration),
        "checkpointed_size": ("Checkpointed data size", size),
        "full_size": ("Full checkpoint size", size),
        "records": ("Records", lambda v: f"{v:.0f}"),
    }
    rows = []
    for key, (label, fmt) in formats.items():
        s = data["summary"].get(key)
        values = [NONE] * 4 if s is None else [fmt(s[k]) for k in ("min", "avg", "max", "p99")]
        rows.append({"label": label, "values": values, "count": 0 if s is None else s["count"]})
    return rows


def _restores(data: Mapping[str, Any]) -> list[dict]:
    """The Restores table's rows, newest first (Flink's Rescales tab); an unreadable event
    is its error only."""
    rows = []
    for r in data.get("restores") or []:
        if "error" in r:
            rows.append(r)
            continue
        before, after = r.get("parallelism_before"), r.get("parallelism_after")
        rows.append(
            {
                **r,
                "point": point_name(r.get("from")),
                "parallelism_text": parallelism_change(before, after, r.get("parallelism")),
                "run": run_link(r.get("labels")),
            }
        )
    return rows


def _restores_summary(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The line under the Restores table: counts per kind and the time to the first
    checkpoint's p50 / p90 / max (None: no restores)."""
    summary = data.get("restores_summary")
    if not summary or not summary.get("count"):
        return None
    kinds = [f"{kind} {n}" for kind, n in summary["by_kind"].items() if n]
    times = summary.get("time_to_first_checkpoint_ms")
    return {
        "count": summary["count"],
        "kinds": ", ".join(kinds),
        "times": None if not times else [(q, duration(times[q])) for q in ("p50", "p90", "max")],
        "timed": 0 if not times else times["count"],
    }


def _view(data: Mapping[str, Any], current: str) -> dict[str, Any]:
    counts = data["counts"]
    shown = COUNTS + ([("unreadable", "Unreadable")] if counts.get("unreadable") else [])
    return {
        "base": "?" + urlencode({"pipeline": current}),
        "counts": [(key, label, counts.get(key, 0)) for key, label in shown],
        "latest": _latest(data),
        "plots": _plots(data),
        "history": _history(data),
        "summary": _summary(data),
        "settings": settings(data.get("config") or {}),
        "savepoints": [{**s, "run": run_link(s.get("labels"))} for s in data["savepoint_details"]],
        "restores": _restores(data),
        "restores_summary": _restores_summary(data),
    }


def _replay(warnings: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The replayability box: one line that counts the warnings, each on demand (open when
    Kafka already deleted records a point would replay)."""
    if not warnings:
        return None
    lost = sum(1 for w in warnings if w.get("severity") == "lost")
    points = {str(w.get("point")) for w in warnings if "point" in w}
    head = str(warnings[0].get("message"))
    if points:
        head = (
            f"Replayability: {len(points)} retained point(s) would replay Kafka records that "
            f"retention deleted ({lost}) or deletes within a day ({len(warnings) - lost})"
        )
    items = [str(w.get("message")) for w in warnings if "point" in w]
    return {"head": head, "items": items, "count": len(warnings) if items else 0, "open": lost}


def render_page(
    names: Sequence[str],
    current: str | None,
    data: Mapping[str, Any] | None,
    error: str | None = None,
    detail: Mapping[str, Any] | None = None,
    warnings: Sequence[Mapping[str, Any]] = (),
    static: str = "static",
) -> str:
    """The whole page: tabs for ``names``, and ``current``'s history (or its ``error``).

    Args:
        names: the pipelines this user may read, in tab order.
        current: the pipeline shown (None: none to show).
        data: ``checkpoint_history`` of ``current`` (None when it could not be read).
        error: said above the data, e.g. a storage error or an unknown pipeline.
        detail: ``checkpoint_detail`` of the checkpoint asked for, if any.
        warnings: the replayability warnings of ``current``'s retained points.
        static: the URL path of the plugin's static files (its CSS and script).
    """
    return _ENV.get_template("checkpoints.html").render(
        names=names,
        current=current,
        data=data,
        view=None if data is None or current is None else _view(data, current),
        error=error,
        detail=detail,
        replay=_replay(warnings),
        static=static.rstrip("/"),
        now_ms=datetime.now(UTC).timestamp() * 1000,
        NONE=NONE,
    )
