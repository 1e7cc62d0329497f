"""Draws docs/architecture.svg, the picture in README.md: ``python docs/architecture.py``.

Airflow runs one checkpoint per DAG run (top); Spark, Kafka and S3 (bottom) are what its
tasks touch. Standard library only; every box and arrow is placed by hand below.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from xml.sax.saxutils import escape

W, H = 980, 470
FONT = "Helvetica, Arial, sans-serif"
BLUE, ORANGE, GREEN, GREY, INK = "#017cee", "#e2711d", "#2e7d32", "#51504f", "#1f2328"
FILL = {BLUE: "#e8f0fe", ORANGE: "#fef3e8", GREEN: "#edf7ee", GREY: "#f3f3f3"}

parts: list[str] = []


def text(
    x: float,
    y: float,
    lines: str,
    size: int = 12,
    color: str = INK,
    bold: bool = False,
    anchor: str = "middle",
) -> None:
    weight = "bold" if bold else "normal"
    rows = lines.split("\n")
    top = y - (len(rows) - 1) * (size + 2) / 2
    for i, row in enumerate(rows):
        parts.append(
            f'<text x="{x}" y="{top + i * (size + 2) + size / 3:.1f}" font-family="{FONT}" '
            f'font-size="{size}" font-weight="{weight}" fill="{color}" '
            f'text-anchor="{anchor}">{escape(row)}</text>'
        )


def panel(x: float, y: float, w: float, h: float, color: str, title: str) -> None:
    parts.append(
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="10" fill="{FILL[color]}" '
        f'stroke="{color}" stroke-width="1.5"/>'
    )
    text(x + 12, y + 16, title, 13, color, bold=True, anchor="start")


def box(
    cx: float, cy: float, w: float, h: float, label: str, fill: str = "#ffffff", color: str = GREY
) -> tuple[float, float, float, float]:
    parts.append(
        f'<rect x="{cx - w / 2}" y="{cy - h / 2}" width="{w}" height="{h}" rx="7" '
        f'fill="{fill}" stroke="{color}" stroke-width="1"/>'
    )
    text(cx, cy, label, 11)
    return cx, cy, w, h


def arrow(
    points: list[tuple[float, float]],
    label: str = "",
    color: str = GREY,
    dashed: bool = False,
    at: int = 0,
    dx: float = 6,
    dy: float = 0,
    anchor: str = "start",
) -> None:
    path = " ".join(f"{x},{y}" for x, y in points)
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    parts.append(
        f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.3"{dash} '
        f'marker-end="url(#head-{color[1:]})"/>'
    )
    if label:
        (x1, y1), (x2, y2) = points[at], points[at + 1]
        text((x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy, label, 10, "#3c3c3c", anchor=anchor)


def draw() -> str:
    # Airflow: one DAG run is one checkpoint.
    panel(10, 10, W - 20, 120, BLUE, "Airflow — one run of the pipeline DAG is one checkpoint")
    steps = [
        ("sensors\nmin pause · max concurrent", "#f7fbff"),
        ("1 trigger\nbarrier n = [start, end)\nper partition", "#ffffff"),
        ("2 process_epoch\nruns the epoch plan\nin Spark", "#ffffff"),
        ("3 acks\nall in acks/ in storage\ntimeout → EXPIRED", "#f7fbff"),
        ("4 complete\nthe global ack", "#ffffff"),
        ("5 notify\nsinks · offsets · retention", "#ffffff"),
    ]
    xs = [95 + i * 158 for i in range(len(steps))]
    for x, (label, fill) in zip(xs, steps, strict=True):
        box(x, 75, 142, 54, label, fill, BLUE)
    for a, b in itertools.pairwise(xs):
        arrow([(a + 71, 75), (b - 73, 75)], color=BLUE)

    # The three systems the tasks touch.
    panel(10, 200, 250, 260, GREY, "Kafka")
    panel(280, 200, 330, 260, ORANGE, "Spark executors")
    panel(630, 200, W - 640, 260, GREEN, "S3: <pipeline>/chk-<n>/")
    box(135, 255, 200, 36, "source topics")
    box(135, 345, 200, 36, "consumer group offsets")
    box(135, 420, 200, 44, "sink output: a Kafka topic,\nan Iceberg table, files")
    box(445, 255, 280, 36, "read each partition's range [start, end)", color=ORANGE)
    box(
        445,
        335,
        280,
        50,
        "keyed subtasks: restore state,\nfn(key, rows, state), snapshot, ack",
        color=ORANGE,
    )
    box(445, 420, 280, 36, "sinks stage their output, ack", color=ORANGE)
    arrow([(445, 273), (445, 308)], color=ORANGE)
    arrow([(445, 360), (445, 400)], color=ORANGE)
    box(800, 250, 300, 34, "_pending — barrier n (put-if-absent)")
    box(800, 305, 300, 34, "state/ and sink/ files, unique per attempt")
    box(800, 360, 300, 34, "acks/<attempt>/<uid#subtask>.json")
    box(800, 420, 300, 40, "_metadata — the commit point\n(put-if-absent)", "#d7efd9", GREEN)

    # What each step reads and writes (xs: the centres of the six steps).
    _, trigger, process, _, complete, notify = xs
    arrow([(215, 237), (215, 103)], "end offsets", dashed=True, at=0, dx=6, dy=-8)
    arrow(
        [(trigger + 40, 103), (trigger + 40, 168), (700, 168), (700, 233)],
        "writes barrier n",
        at=1,
        dx=60,
        dy=-6,
        anchor="middle",
    )
    arrow([(process, 103), (process, 237)], "the epoch plan", ORANGE, at=0, dx=6, dy=48)
    arrow([(235, 255), (305, 255)], "records", at=0, dx=0, dy=-8, anchor="middle")
    arrow([(585, 326), (650, 305)], "snapshot", at=0, dx=-28, dy=-8)
    arrow([(585, 344), (650, 360)], "ack", at=0, dx=-4, dy=12)
    arrow([(585, 420), (650, 310)])
    arrow(
        [(complete, 103), (complete, 184), (962, 184), (962, 420), (950, 420)],
        "writes _metadata",
        GREEN,
        at=1,
        dx=20,
        dy=-6,
        anchor="middle",
    )
    arrow(
        [(notify, 103), (notify, 145), (22, 145), (22, 345), (35, 345)],
        "commits the barrier's ends as group offsets",
        at=1,
        dx=120,
        dy=-6,
        anchor="middle",
    )
    arrow([(22, 345), (22, 420), (35, 420)])
    text(26, 385, "publishes", 10, "#3c3c3c", anchor="start")

    heads = "".join(
        f'<marker id="head-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/>'
        "</marker>"
        for c in (BLUE, ORANGE, GREEN, GREY)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}"><defs>{heads}</defs>'
        f'<rect width="{W}" height="{H}" fill="white"/>{"".join(parts)}</svg>\n'
    )


if __name__ == "__main__":
    Path(__file__).with_name("architecture.svg").write_text(draw())
