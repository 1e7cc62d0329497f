"""``spark_jobs/run_epoch.py`` with bad input: one line naming the argument, its value and
the fix, exit code 2, no traceback, nothing written, and no Spark started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    storage = (tmp_path / "chk").as_uri()
    cmd = [sys.executable, "spark_jobs/run_epoch.py", "--storage", storage]
    cmd += ["--bootstrap", "127.0.0.1:1", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--pipeline", "examples.nope:pipeline"],
            "run_epoch.py: config field 'pipeline module' = 'examples.nope:pipeline' is invalid: "
            "module 'examples.nope' is not importable; give module:attribute of a Pipeline on "
            "the Python path (run from the project root, or set PYTHONPATH)",
        ),
        (
            ["--pipeline", "examples.wordcount:nope"],
            "run_epoch.py: config field 'pipeline module' = 'examples.wordcount:nope' is "
            "invalid: module 'examples.wordcount' has no attribute 'nope'",
        ),
        (
            ["--pipeline", "examples.wordcount:pipeline", "--config", "{timeout: 1}"],
            "run_epoch.py: --config '{timeout: 1}' is not JSON (Expecting property name "
            "enclosed in double quotes: line 1 column 2 (char 1)); give a JSON object, e.g. "
            '\'{"timeout": "10min"}\'',
        ),
        (
            ["--pipeline", "examples.wordcount:pipeline", "--config", "[1]"],
            "run_epoch.py: --config '[1]' is not a JSON object; give one, e.g. '{}'",
        ),
        (
            ["--pipeline", "examples.wordcount:pipeline", "--config", '{"min_paus": "1s"}'],
            "run_epoch.py: config field 'min_paus' = '1s' is invalid: not a setting; did you "
            "mean 'min_pause'? known: ",
        ),
        (
            ["--pipeline", "examples.wordcount:pipeline", "--checkpoint", "7"],
            "run_epoch.py: --checkpoint 7: pipeline 'wordcount' has no pending checkpoint 7 in "
            "{storage} (pending: []); trigger it first, or leave out --checkpoint to run a "
            "whole cycle",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], line: str):
    done = run(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(line.replace("{storage}", (tmp_path / "chk").as_uri()))
    assert done.stdout == ""
    assert not (tmp_path / "chk").exists() or not any((tmp_path / "chk").rglob("*"))
