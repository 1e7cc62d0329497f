"""The Makefile's first-run install says what it is doing (it takes minutes), and a failing
install still fails the target through the filter that shortens pip's output."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_first_install_shows_its_steps_and_each_package(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["make", "-n", "venv", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith('echo "==> ')]
    assert [s.split("]")[0] for s in steps[:4]] == [
        'echo "==> [1/4', 'echo "==> [2/4', 'echo "==> [3/4', 'echo "==> [4/4'
    ]  # fmt: skip
    install = next(line for line in done.stdout.splitlines() if "requirements-dev.txt" in line)
    assert "--quiet" not in install  # one line per package, not two minutes of silence


def test_a_failing_install_fails_make(tmp_path: Path) -> None:
    # The recipe's shell runs with pipefail: pip's failure is not hidden by the filter.
    makefile = tmp_path / "Makefile"
    head = (REPO / "Makefile").read_text().split("PYTHON ?=")[0]
    makefile.write_text(head + "t:\n\tfalse | { grep x || true; }\n")
    done = subprocess.run(["make", "-f", str(makefile), "t"], capture_output=True, text=True)
    assert done.returncode != 0
