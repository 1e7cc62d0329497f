"""Draws docs/architecture.svg, the picture in README.md: ``python docs/architecture.py``.

Airflow runs one checkpoint per DAG run (top); Spark, Kafka and S3 (bottom) are what its
tasks touch. Standard library only; every box and arrow is placed by hand below.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from svgdraw import BLUE, GREEN, GREY, ORANGE, Canvas

W, H = 980, 470


def draw() -> str:
    canvas = Canvas(W, H)
    panel, box, arrow, text = canvas.panel, canvas.box, canvas.arrow, canvas.text
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

    return canvas.svg()


if __name__ == "__main__":
    Path(__file__).with_name("architecture.svg").write_text(draw())
