"""Credentials that must never reach a log: find them in the log files of a run.

``find_leaks(folders, secrets)`` reads every file under ``folders`` whose name looks like a
log (``*.log``, ``*.out``, ``*.err``, Airflow's task logs) and reports each secret value
found in one, by name, never by value. The end-to-end tests and ``make demo`` check the
logs of their Airflow, Tansu, SeaweedFS, Spark and PostgreSQL this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["find_leaks", "log_files"]

LOG_SUFFIXES = (".log", ".out", ".err")


def log_files(folders: Iterable[Path]) -> list[Path]:
    """Every log file under ``folders`` (missing folders are skipped)."""
    found = []
    for folder in folders:
        if folder.is_dir():
            found += [p for p in folder.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES]
    return sorted(found)


def find_leaks(folders: Iterable[Path], secrets: Mapping[str, str]) -> list[str]:
    """``"<file>: <secret name>"`` for each secret (of at least 8 characters) in a log."""
    wanted = {name: value.encode() for name, value in secrets.items() if len(value) >= 8}
    short = sorted(name for name, value in secrets.items() if len(value) < 8)
    if short:
        raise ValueError(f"secrets {short} are too short to search for reliably (< 8 chars)")
    leaks = []
    for path in log_files(folders):
        data = path.read_bytes()
        leaks += [f"{path}: {name}" for name, value in wanted.items() if value in data]
    return leaks
