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


# Top-level folders with Python files that no suite, demo or bench process imports from
# the checkout: the pictures' scripts (run by `make picture` with the system Python) and the
# Docker image's files (the harness copies airflow_local_settings.py into Airflow's home).
NOT_COMPILED = {"docs", "docker"}


def _compiled_folders() -> list[str]:
    done = subprocess.run(["make", "-n", "bytecode"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "compileall" in x)
    words = line.split(">")[0].split()
    words = words[words.index("compileall") + 1 :]
    return [w for i, w in enumerate(words) if not w.startswith("-") and words[i - 1] != "-j"]


def test_bytecode_compiles_every_folder_of_the_projects_modules() -> None:
    # With PYTHONDONTWRITEBYTECODE set no process writes a .pyc: a folder left out is
    # compiled from source by every process that imports it.
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    holding_python = {path.split("/")[0] for path in tracked if "/" in path}
    assert set(_compiled_folders()) == holding_python - NOT_COMPILED


def test_the_suite_the_demo_and_the_bench_compile_before_they_start() -> None:
    for target, starts in (("test", "-m pytest"), ("demo", "harness.demo"), ("bench", "bench.")):
        done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        compiled = next(i for i, x in enumerate(lines) if "compileall" in x)
        started = next(i for i, x in enumerate(lines) if starts in x)
        assert compiled < started, (target, lines)
