"""A few SVG drawing primitives for the pictures in docs/ (standard library only)."""

from __future__ import annotations

from xml.sax.saxutils import escape

FONT = "Helvetica, Arial, sans-serif"
BLUE, ORANGE, GREEN, GREY, INK = "#017cee", "#e2711d", "#2e7d32", "#51504f", "#1f2328"
FILL = {BLUE: "#e8f0fe", ORANGE: "#fef3e8", GREEN: "#edf7ee", GREY: "#f3f3f3"}


class Canvas:
    """Shapes in drawing order; ``svg()`` gives the document."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = []

    def text(
        self,
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
            self.parts.append(
                f'<text x="{x}" y="{top + i * (size + 2) + size / 3:.1f}" font-family="{FONT}" '
                f'font-size="{size}" font-weight="{weight}" fill="{color}" '
                f'text-anchor="{anchor}">{escape(row)}</text>'
            )

    def panel(self, x: float, y: float, w: float, h: float, color: str, title: str) -> None:
        self.parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="10" fill="{FILL[color]}" '
            f'stroke="{color}" stroke-width="1.5"/>'
        )
        self.text(x + 12, y + 16, title, 13, color, bold=True, anchor="start")

    def box(
        self,
        cx: float,
        cy: float,
        w: float,
        h: float,
        label: str,
        fill: str = "#ffffff",
        color: str = GREY,
    ) -> None:
        self.parts.append(
            f'<rect x="{cx - w / 2}" y="{cy - h / 2}" width="{w}" height="{h}" rx="7" '
            f'fill="{fill}" stroke="{color}" stroke-width="1"/>'
        )
        self.text(cx, cy, label, 11)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, stroke: str = "none") -> None:
        self.parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}" stroke="{stroke}"/>'
        )

    def arrow(
        self,
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
        self.parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.3"{dash} '
            f'marker-end="url(#head-{color[1:]})"/>'
        )
        if label:
            (x1, y1), (x2, y2) = points[at], points[at + 1]
            self.text((x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy, label, 10, "#3c3c3c", anchor=anchor)

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str, width: float) -> None:
        self.parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" '
            f'stroke-width="{width}"/>'
        )

    def svg(self) -> str:
        heads = "".join(
            f'<marker id="head-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            f'fill="{c}"/></marker>'
            for c in (BLUE, ORANGE, GREEN, GREY)
        )
        w, h = self.width, self.height
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}"><defs>{heads}</defs>'
            f'<rect width="{w}" height="{h}" fill="white"/>{"".join(self.parts)}</svg>\n'
        )
