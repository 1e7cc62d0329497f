"""The README and docs/: short, pictured, and every link inside the repository."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_shows_the_picture_on_its_first_screen() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    first_screen = readme.splitlines()[:30]
    assert any("](docs/architecture.svg)" in line for line in first_screen)


@pytest.mark.parametrize("doc", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_link_points_at_a_file_in_the_repository(doc: Path) -> None:
    text = doc.read_text()
    for target in LINK.findall(text):
        if "://" in target:
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(REPO), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing file: {target}"
    assert "DESIGN.md" not in text and "../shared" not in text


@pytest.mark.parametrize(
    ("source", "picture"),
    [("architecture.py", "architecture.svg"), ("stages_picture.py", "stages.svg")],
)
def test_each_picture_is_drawn_from_its_source(source: str, picture: str) -> None:
    drawn = runpy.run_path(str(REPO / "docs" / source))["draw"]()
    assert (REPO / "docs" / picture).read_text() == drawn
