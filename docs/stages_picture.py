"""Draws docs/stages.svg, the picture in docs/stages.md: ``python docs/stages_picture.py``.

Top: barrier markers flowing from stage 1 through an internal topic to stage 2. Below: where
stage 2's checkpoint n cuts each channel in the three modes. Standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from svgdraw import BLUE, GREEN, GREY, ORANGE, Canvas

W, H = 980, 540
STEP = 24
X0 = 300


def lane(c: Canvas, y: float, items: str, label: str) -> dict[int, float]:
    """A partition: ``r`` a record, a digit a marker of that epoch, ``.`` nothing yet.
    Returns the x of each item by index."""
    c.text(X0 - 14, y, label, 11, anchor="end")
    c.line(X0, y, X0 + STEP * len(items), y, "#c8c8c8", 1)
    xs = {}
    for i, item in enumerate(items):
        x = X0 + STEP * i + STEP / 2
        xs[i] = x
        if item == "r":
            c.rect(x - 6, y - 6, 12, 12, "#d9d9d9", GREY)
        elif item.isdigit():
            c.line(x, y - 9, x, y + 9, BLUE, 4)
            c.text(x - 9, y - 11, item, 9, BLUE, bold=True)
    return xs


def cut(c: Canvas, x: float, y: float) -> None:
    c.line(x, y - 10, x, y + 10, GREEN, 2.5)


def mode(c: Canvas, top: float, title: str, p0: str, p1: str, cuts: tuple, note: str,
         inflight: tuple[int, int] | None = None) -> None:  # fmt: skip
    c.panel(10, top, W - 20, 108, GREY, title)
    xs0 = lane(c, top + 48, p0, "partition 0")
    if inflight is not None:
        first, last = inflight
        c.rect(X0 + STEP * first, top + 71, STEP * (last - first), 18, "#fde2c8")
    xs1 = lane(c, top + 80, p1, "partition 1")
    cut(c, xs0[cuts[0]] + STEP / 2, top + 48)
    cut(c, xs1[cuts[1]] + STEP / 2, top + 80)
    c.text(X0 + STEP * 17 + 10, top + 64, note, 11, anchor="start")


def draw() -> str:
    c = Canvas(W, H)
    # How markers travel.
    c.panel(10, 10, W - 20, 150, BLUE, "Barrier markers flow with the data")
    c.box(150, 95, 230, 62, "stage 1 (its own Spark job)\nsource → operators → StageSink\ncheckpoint n commits",
          "#ffffff", ORANGE)  # fmt: skip
    lane(c, 75, "rr1rrr2rr", "")
    lane(c, 115, "rrr1rr2r", "")
    c.text(X0 + STEP * 4.5, 142, "internal topic, 2 partitions (channels)", 10, "#3c3c3c")
    c.box(840, 95, 230, 62, "stage 2 (its own Spark job)\nStageSource → operators\ncheckpoint n ends at marker n",
          "#ffffff", ORANGE)  # fmt: skip
    c.arrow([(265, 95), (292, 95)], color=ORANGE)
    c.arrow([(X0 + STEP * 9 + 8, 95), (722, 95)], color=ORANGE)
    c.text(742, 32, "blue bar n: the marker of stage 1's checkpoint n, in every partition", 10,
           BLUE, anchor="end")  # fmt: skip
    # Where stage 2's checkpoint 2 cuts each channel; partition 1's marker 2 is late.
    mode(c, 176, "aligned (EXACTLY_ONCE, the default)", "rr1rrr2rr", "rrr1rr2r", (6, 6),
         "waits until every channel has marker 2, then cuts\n"
         "after it everywhere: a consistent cut")  # fmt: skip
    mode(c, 292, "unaligned (unaligned: true, or past aligned_timeout)", "rr1rrr2rr",
         "rrr1rr....", (6, 5),
         "cuts partition 0 at marker 2 and partition 1 where\n"
         "it is; its rest up to marker 2 stays in flight,\n"
         "kept as offsets, and is read first next time", inflight=(6, 10))  # fmt: skip
    mode(c, 408, "at-least-once (AT_LEAST_ONCE)", "rr1rrr2rr", "rrr1rr2r", (8, 7),
         "no alignment: every channel is read to its end;\n"
         "replays after a failure may count twice")  # fmt: skip
    c.text(W - 20, H - 12, "green bar: where stage 2's checkpoint 2 ends in that channel", 10,
           GREEN, anchor="end")  # fmt: skip
    return c.svg()


if __name__ == "__main__":
    Path(__file__).with_name("stages.svg").write_text(draw())
