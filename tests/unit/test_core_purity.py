"""The core never imports its edges: no Airflow, Spark, boto3 or Kafka client (docs/testing.md)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Every module of the protocol, storage and state packages, found by walking them, so a new
# module is covered the day it lands; then the shared vocabulary and the engine's pure parts.
PURE_PACKAGES = ["microcheckpoint.protocol", "microcheckpoint.storage", "microcheckpoint.state"]
PURE_MODULES = [
    "microcheckpoint.errors",
    "microcheckpoint.ids",
    "microcheckpoint.config",
    "microcheckpoint.run_conf",
    "microcheckpoint.faults",
    "microcheckpoint.adapters.decoding",
    # The executor side of the engine imports no Spark either.
    "microcheckpoint.engine.api",
    "microcheckpoint.engine.keyed",
    "microcheckpoint.engine.sinkstage",
    "microcheckpoint.engine.operator_state",
    "microcheckpoint.engine.operator_subtask",
]


def _walk(package: str) -> list[str]:
    root = REPO.joinpath(*package.split("."))
    found = [package]
    for info in pkgutil.walk_packages([str(root)], prefix=package + "."):
        found.append(info.name)
    return found


PURE_CORE = sorted({m for p in PURE_PACKAGES for m in _walk(p)} | set(PURE_MODULES))

BLOCKER = textwrap.dedent(
    """
    import importlib, sys

    BLOCKED = ("airflow", "pyspark", "boto3", "botocore", "kafka")

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked edge package {name!r}")
            return None

    sys.meta_path.insert(0, Refuse())
    for name in sys.argv[1:]:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("imported", len(sys.argv) - 1)
    """
)


def run_blocked(*modules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_walk_finds_the_protocol_modules() -> None:
    assert {
        "microcheckpoint.protocol.coordinator",
        "microcheckpoint.protocol.records.checkpoint",
        "microcheckpoint.protocol.recovery",
        "microcheckpoint.storage.file",
        "microcheckpoint.state.chains",
    } <= set(PURE_CORE)


def test_pure_core_imports_without_edge_packages() -> None:
    result = run_blocked(*PURE_CORE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"imported {len(PURE_CORE)}"


@pytest.mark.parametrize("edge", ["boto3", "botocore.config", "kafka", "pyspark.sql", "airflow"])
def test_blocker_refuses_edge_packages(edge: str) -> None:
    result = run_blocked(edge)
    assert result.returncode == 1
    assert f"ImportError: blocked edge package {edge.split('.')[0]!r}" in result.stderr


def test_blocker_catches_an_edge_adapter() -> None:
    result = run_blocked("microcheckpoint.adapters.s3")
    assert result.returncode == 1
    assert "ImportError: blocked edge package 'boto3'" in result.stderr
