"""The Checkpoints page as HTML, from ``checkpoint_history`` data: pure functions, no I/O.

Flink's Checkpoints tab, with Airflow 3's look (Chakra's system font stack, its gray,
blue, green and red scales, state badges, rounded cards): an overview, the latest
checkpoints, plots of duration, size and records over time (inline SVG: nothing is loaded
from elsewhere), the history with offsets on demand, a summary, the configuration, the
savepoints, and one checkpoint's subtasks. Links to runs open in Airflow's own UI.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["duration", "render_page", "size"]

NONE = "\u2013"  # an en dash: no value

STATUS_COLOURS = {
    "COMPLETED": "#16a34a",
    "ABORTED": "#dc2626",
    "PENDING": "#0891b2",
    "COMPLETING": "#0d9488",
    "UNREADABLE": "#ea580c",
}
STYLE = """
:root{--fg:#111827;--muted:oklch(0.45 0.055 251);--border:oklch(0.915 0.01 253);
--panel:#fff;--bg:oklch(0.985 0.004 253);--brand:oklch(0.469 0.084 257.657);
--brand-soft:oklch(0.962 0.012 249.46);--red:#dc2626;--orange:#ea580c}
@media (prefers-color-scheme: dark){:root{--fg:oklch(0.985 0.004 253);--muted:oklch(0.75 0.025 252);
--border:oklch(0.35 0.045 251);--panel:oklch(0.18 0.03 251);--bg:oklch(0.11 0.025 251);
--brand:oklch(0.705 0.066 256.378);--brand-soft:oklch(0.259 0.062 265.566)}}
*{box-sizing:border-box}
body{margin:0;padding:20px 24px;background:var(--bg);color:var(--fg);line-height:1.5;
font:14px ui-sans-serif,system-ui,-apple-system,BlinkMacSystemFont,'Segoe UI',Roboto,
'Helvetica Neue',Arial,'Noto Sans',sans-serif}
h1{font-size:22px;margin:0 0 4px;font-weight:600}h2{font-size:16px;margin:24px 0 8px;font-weight:600}
a{color:var(--brand)}code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.muted{color:var(--muted)}.bar{display:flex;gap:12px;align-items:center;flex-wrap:wrap}
.tabs{display:flex;gap:4px;border-bottom:1px solid var(--border);margin:12px 0 16px}
.tabs a{padding:6px 12px;text-decoration:none;color:var(--muted);border-bottom:2px solid transparent}
.tabs a.on{color:var(--fg);border-color:var(--brand);font-weight:600}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(130px,1fr));gap:12px}
.card{background:var(--panel);border:1px solid var(--border);border-radius:8px;padding:10px 14px}
.card .n{font-size:24px;font-weight:600}.card .l{color:var(--muted);font-size:12px;text-transform:uppercase}
.panel{background:var(--panel);border:1px solid var(--border);border-radius:8px;padding:4px 0;overflow-x:auto}
table{border-collapse:collapse;width:100%}
th{text-align:left;font-weight:600;color:var(--muted);font-size:12px;padding:8px 12px;border-bottom:1px solid var(--border);white-space:nowrap}
td{padding:6px 12px;border-bottom:1px solid var(--border);vertical-align:top}
tr:last-child td{border-bottom:none}td.r,th.r{text-align:right;white-space:nowrap}
.badge{display:inline-block;border-radius:4px;padding:0 6px;color:#fff;font-size:12px;font-weight:600}
.warn{border-left:4px solid var(--orange);background:var(--panel);padding:8px 12px;margin:8px 0;border-radius:4px}
.err{color:var(--red)}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:12px}
.plot{background:var(--panel);border:1px solid var(--border);border-radius:8px;padding:8px}
.plot h3{font-size:13px;margin:0 0 4px;font-weight:600}
button,select{font:inherit;border:1px solid var(--border);background:var(--panel);color:var(--fg);border-radius:6px;padding:4px 10px;cursor:pointer}
details summary{cursor:pointer;color:var(--brand)}
"""
SCRIPT = """
const key='mcp-refresh',sel=document.getElementById('auto');
sel.value=localStorage.getItem(key)||'0';
function arm(){clearTimeout(window.mcpTimer);const s=+sel.value;
 if(s>0){window.mcpTimer=setTimeout(()=>location.reload(),s*1000);}}
sel.onchange=()=>{localStorage.setItem(key,sel.value);arm();};arm();
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def size(n: float | None) -> str:
    """Bytes with a unit: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n is None:
        return NONE
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def duration(ms: float | None) -> str:
    """Milliseconds for people: ``850 ms``, ``3.2 s``, ``2m 05s``."""
    if ms is None:
        return NONE
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{int(ms // 60_000)}m {int(ms % 60_000 // 1000):02d}s"


def when(ms: Any) -> str:
    if ms is None:
        return NONE
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def badge(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "#6b7280")
    return f'<span class="badge" style="background:{colour}">{esc(status)}</span>'


def run_link(labels: Mapping[str, Any] | None) -> str:
    """A link to the Airflow run recorded in ``labels`` (it opens in the UI, not the frame)."""
    labels = labels or {}
    dag, run = labels.get("dag_id"), labels.get("run_id")
    if not dag or not run:
        return NONE
    href = f"/dags/{quote(str(dag), safe='')}/runs/{quote(str(run), safe='')}"
    return f'<a href="{esc(href)}" target="_top" title="{esc(dag)}">{esc(run)}</a>'


def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: set[int] = frozenset()) -> str:
    """An HTML table of already-escaped cells; columns in ``right`` are right-aligned. A row
    with fewer cells than ``head`` spans its last cell over the rest."""
    th = "".join(f'<th class="{"r" if i in right else ""}">{h}</th>' for i, h in enumerate(head))

    def cells(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            span = len(head) - i if i == len(row) - 1 and len(row) < len(head) else 1
            attrs = f' colspan="{span}"' if span > 1 else f' class="{"r" if i in right else ""}"'
            out.append(f"<td{attrs}>{c}</td>")
        return "".join(out)

    body = "".join(f"<tr>{cells(row)}</tr>" for row in rows)
    return f'<div class="panel"><table><tr>{th}</tr>{body}</table></div>'


def plot(title: str, points: list[tuple[int, float, str]], fmt: Callable[[float], str]) -> str:
    """A small SVG line plot of ``(checkpoint id, value, status)`` points over checkpoint
    ids, with its axis labelled in ``fmt`` units (failed checkpoints in red)."""
    width, height, left, bottom, top = 330, 150, 62, 22, 8
    if not points:
        return f'<div class="plot"><h3>{esc(title)}</h3><p class="muted">no data yet</p></div>'
    ids = [p[0] for p in points]
    high = max(p[1] for p in points) or 1.0
    lo_id, hi_id = min(ids), max(ids)
    span = max(1, hi_id - lo_id)

    def x(cid: int) -> float:
        return left + (width - left - 10) * ((cid - lo_id) / span if hi_id > lo_id else 0.5)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - value / high)

    done = [(x(c), y(v)) for c, v, s in points if s == "COMPLETED"]
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in done)
    dots = "".join(
        f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="3" fill="{STATUS_COLOURS.get(s, "#6b7280")}">'
        f"<title>#{c}: {esc(fmt(v))} ({esc(s)})</title></circle>"
        for c, v, s in points
    )
    grid = "".join(
        f'<line x1="{left}" x2="{width - 10}" y1="{y(high * f):.1f}" y2="{y(high * f):.1f}" '
        f'stroke="currentColor" stroke-opacity="0.15"/>'
        f'<text x="{left - 6}" y="{y(high * f) + 4:.1f}" text-anchor="end">{esc(fmt(high * f))}</text>'
        for f in (0, 0.5, 1)
    )
    axis = f'<text x="{x(lo_id):.1f}" y="{height - 4}" text-anchor="middle">#{lo_id}</text>' + (
        f'<text x="{x(hi_id):.1f}" y="{height - 4}" text-anchor="middle">#{hi_id}</text>'
        if hi_id != lo_id
        else ""
    )
    svg = (
        f'<svg role="img" aria-label="{esc(title)}" data-points="{len(points)}" '
        f'viewBox="0 0 {width} {height}" width="100%" font-size="10" fill="currentColor">'
        f"{grid}{axis}"
        f'<polyline points="{line}" fill="none" stroke="var(--brand)" stroke-width="2"/>{dots}</svg>'
    )
    return f'<div class="plot"><h3>{esc(title)}</h3>{svg}</div>'


def _overview(data: Mapping[str, Any]) -> str:
    counts = data["counts"]
    names = [
        ("triggered", "Triggered"),
        ("in_progress", "In progress"),
        ("completed", "Completed"),
        ("failed", "Failed"),
        ("restored", "Restored"),
    ]
    if counts.get("unreadable"):
        names.append(("unreadable", "Unreadable"))
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card" data-count="{key}"><div class="n">{counts.get(key, 0)}</div>'
            f'<div class="l">{label}</div></div>'
            for key, label in names
        )
        + "</div>"
    )


def _latest(data: Mapping[str, Any]) -> str:
    latest = data["latest"]

    def row(label: str, item: Mapping[str, Any] | None, what: str, detail: str) -> list[str]:
        if item is None:
            return [label, "none", NONE, NONE, ""]
        return [label, what, when(item.get("time_ms")), run_link(item.get("labels")), detail]

    rows = []
    for key, label in (("completed", "Completed checkpoint"), ("failed", "Failed checkpoint")):
        item = latest.get(key) or {}
        what = f"#{item.get('id')}" + (f" · {esc(item['reason'])}" if item.get("reason") else "")
        detail = esc(item.get("detail") or item.get("error") or "")
        rows.append(row(label, latest.get(key), what, detail))
    sp, rs = latest.get("savepoint") or {}, latest.get("restore") or {}
    rows.append(
        row(
            "Savepoint",
            latest.get("savepoint"),
            f"<code>{esc(sp.get('url'))}</code>",
            f"from checkpoint #{sp.get('checkpoint_id')}",
        )
    )
    parallelism = f" parallelism {rs['parallelism']}" if rs.get("parallelism") else ""
    rows.append(
        row(
            "Restore",
            latest.get("restore"),
            f"<code>{esc(rs.get('source'))}</code>",
            esc(rs.get("note") or "") + parallelism,
        )
    )
    return table(["", "Latest", "Time (UTC)", "Airflow run", "Detail"], rows)


def _history_rows(data: Mapping[str, Any], base: str) -> list[list[str]]:
    rows = []
    for c in data["checkpoints"]:
        link = f'<a href="{esc(base)}&amp;checkpoint={c["id"]}">#{c["id"]}</a>'
        if "error" in c:
            rows.append(
                [
                    link,
                    badge("UNREADABLE"),
                    f'<span class="err">{esc(c["error"])}</span>',
                ]
            )
            continue
        got = c.get("acknowledged")
        acked = f"{NONE if got is None else got}/{c.get('total', '?')}"
        reason = ""
        if c.get("reason"):
            reason = f"{esc(c['reason'])}<br><span class='muted'>{esc(c.get('detail'))}</span>"
        offsets = "".join(
            f"<div><code>{esc(tp)}</code> {lo} → {hi}</div>"
            for tp, (lo, hi) in sorted((c.get("ranges") or {}).items())
        )
        rows.append(
            [
                link,
                badge(c["status"]),
                acked,
                when(c.get("trigger_time_ms")),
                when(c.get("latest_ack_ms")),
                duration(c.get("duration_ms")),
                size(c.get("checkpointed_size")),
                size(c.get("full_size")),
                str(c.get("records", NONE)),
                str(c.get("attempt", NONE)),
                run_link(c.get("labels")),
                (f"<details><summary>offsets</summary>{offsets}</details>" if offsets else "")
                + reason,
            ]
        )
    return rows


def _summary(data: Mapping[str, Any]) -> str:
    formats = {
        "duration_ms": ("End-to-end duration", duration),
        "checkpointed_size": ("Checkpointed data size", size),
        "full_size": ("Full checkpoint size", size),
        "records": ("Records", lambda v: f"{v:.0f}"),
    }
    rows = []
    for key, (label, fmt) in formats.items():
        s = data["summary"].get(key)
        if s is None:
            rows.append([label, NONE, NONE, NONE, NONE, "0"])
        else:
            rows.append(
                [label, *(esc(fmt(s[k])) for k in ("min", "avg", "max", "p99")), str(s["count"])]
            )
    return table(["", "Minimum", "Average", "Maximum", "p99", "Checkpoints"], rows, {1, 2, 3, 4, 5})


def _plots(data: Mapping[str, Any]) -> str:
    rows = [c for c in reversed(data["checkpoints"]) if "error" not in c]
    timed = [(c["id"], float(c["duration_ms"]), c["status"]) for c in rows if "duration_ms" in c]
    done = [c for c in rows if c["status"] == "COMPLETED"]
    sizes = [(c["id"], float(c["full_size"] or 0), c["status"]) for c in done if "full_size" in c]
    records = [(c["id"], float(c.get("records") or 0), c["status"]) for c in rows]
    return (
        '<div class="plots">'
        + plot("End-to-end duration", timed, duration)
        + plot("Full checkpoint size", sizes, size)
        + plot("Records per checkpoint", records, lambda v: f"{v:.0f}")
        + "</div>"
    )


def _detail(detail: Mapping[str, Any]) -> str:
    if "error" in detail:
        return f'<p class="err">{esc(detail["error"])}</p>'
    subtasks = detail.get("subtasks") or []
    rows = [
        [
            f"<code>{esc(s['task'])}</code>",
            when(s.get("acked_at_ms")),
            duration(s.get("ack_duration_ms")),
            size(s.get("checkpointed_size")),
            size(s.get("full_size")),
            str(s.get("files", 0)),
            duration(s.get("alignment_duration_ms")) if "alignment_duration_ms" in s else NONE,
            esc(s.get("unaligned", NONE)),
        ]
        for s in subtasks
    ]
    head = [
        "Subtask",
        "Acknowledged",
        "Ack duration",
        "Checkpointed",
        "Full size",
        "Files",
        "Alignment",
        "Unaligned",
    ]
    offsets = [
        [f"<code>{esc(tp)}</code>", str(o)] for tp, o in (detail.get("offsets") or {}).items()
    ]
    parts = [
        f"<h2>Checkpoint #{detail['id']} · {badge(detail['status'])}</h2>",
        table(head, rows, {2, 3, 4, 5})
        if rows
        else '<p class="muted">no subtask details (only completed checkpoints have them)</p>',
    ]
    if offsets:
        parts += ["<h2>Offsets (next to read)</h2>", table(["Partition", "Offset"], offsets, {1})]
    return "".join(parts)


def _replay_box(warnings: Sequence[Mapping[str, Any]]) -> str:
    """The replayability warnings: one line that counts them, each one on demand (open
    when Kafka already deleted records a point would replay)."""
    lost = sum(1 for w in warnings if w.get("severity") == "lost")
    points = {str(w.get("point")) for w in warnings if "point" in w}
    if points:
        head = (
            f"Replayability: {len(points)} retained point(s) would replay Kafka records that "
            f"retention deleted ({lost}) or deletes within a day ({len(warnings) - lost})"
        )
    else:
        head = esc(warnings[0].get("message"))
    items = "".join(f"<li>{esc(w.get('message'))}</li>" for w in warnings if "point" in w)
    if not items:
        return f'<div class="warn" data-replay="0">{head}</div>'
    return (
        f'<div class="warn" data-replay="{len(warnings)}"><details{" open" if lost else ""}>'
        f"<summary>{head}</summary><ul>{items}</ul></details></div>"
    )


def render_page(
    names: Sequence[str],
    current: str | None,
    data: Mapping[str, Any] | None,
    error: str | None = None,
    detail: Mapping[str, Any] | None = None,
    warnings: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The whole page: tabs for ``names``, and ``current``'s history (or its ``error``)."""
    tabs = "".join(
        f'<a class="{"on" if n == current else ""}" href="?{urlencode({"pipeline": n})}">{esc(n)}</a>'
        for n in names
    )
    body = (
        [
            '<p class="muted">No pipelines: a DAG file declares one with '
            "<code>pipeline_dags(...)</code>.</p>"
        ]
        if not names
        else []
    )
    if current is not None and error is not None:
        body.append(f'<div class="warn err" data-error="1">{esc(current)}: {esc(error)}</div>')
    if current is not None and data is not None:
        base = "?" + urlencode({"pipeline": current})
        notes = []
        if data.get("stopped"):
            notes.append(f"Triggering is stopped: {esc(data['stopped'].get('reason'))}")
        if data.get("restore_note"):
            notes.append(f"Restore note: {esc(data['restore_note'])}")
        body += [f'<div class="warn">{n}</div>' for n in notes]
        if warnings:
            body.append(_replay_box(warnings))
        body += [
            f'<p class="muted">Storage <code>{esc(data["storage"])}</code> · DAGs '
            + " · ".join(
                f'<a href="/dags/{esc(d)}" target="_top">{esc(d)}</a>' for d in data.get("dags", [])
            )
            + "</p>",
            "<h2>Overview</h2>",
            _overview(data),
            "<h2>Latest</h2>",
            _latest(data),
        ]
        if detail is not None:
            body.append(_detail(detail))
        body += [
            "<h2>Over time</h2>",
            _plots(data),
            "<h2>History</h2>",
            table(
                [
                    "ID",
                    "Status",
                    "Acknowledged",
                    "Trigger time",
                    "Latest ack",
                    "End to end",
                    "Checkpointed",
                    "Full size",
                    "Records",
                    "Attempt",
                    "Airflow run",
                    "",
                ],
                _history_rows(data, base),
                {2, 5, 6, 7, 8, 9},
            ),
            "<h2>Summary</h2>",
            _summary(data),
            "<h2>Configuration</h2>",
            table(
                ["Setting", "Value"],
                [
                    [esc(k), f"<code>{esc(json.dumps(v))}</code>"]
                    for k, v in sorted(data["config"].items())
                ],
            )
            if data.get("config")
            else '<p class="muted">none yet (stored with the first completed checkpoint)</p>',
            "<h2>Savepoints</h2>",
            table(
                ["Savepoint", "From checkpoint", "Taken (UTC)", "Airflow run", "Full size"],
                [
                    [
                        f"<code>{esc(s['url'])}</code>",
                        f'<span class="err">{esc(s["error"])}</span>'
                        if "error" in s
                        else f"#{s.get('checkpoint_id')}",
                        when(s.get("time_ms")),
                        run_link(s.get("labels")),
                        size(s.get("full_size")),
                    ]
                    for s in data.get("savepoint_details", [])
                ],
                {4},
            )
            if data.get("savepoint_details")
            else '<p class="muted">none</p>',
            '<p class="muted">This history is read from checkpoint storage, so it survives '
            "restarts of Airflow and of the pipeline (Flink's Checkpoints tab starts empty "
            "after a JobManager failover). Retention keeps the newest checkpoints only.</p>",
        ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Checkpoints</title>'
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>'
        '<div class="bar"><h1>Checkpoints</h1><span style="flex:1"></span>'
        f'<span class="muted">as of {when(datetime.now(UTC).timestamp() * 1000)} UTC</span>'
        '<button onclick="location.reload()">Refresh</button>'
        '<select id="auto" title="refresh every"><option value="0">auto-refresh off</option>'
        '<option value="10">every 10 s</option><option value="30">every 30 s</option></select></div>'
        f'<nav class="tabs">{tabs}</nav>{"".join(body)}<script>{SCRIPT}</script></body></html>'
    )
