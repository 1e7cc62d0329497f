"""The core never imports its edges: no Airflow, Spark, boto3 or Kafka client (STYLE, DESIGN §2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PURE_CORE = [
    "microcheckpoint.errors",
    "microcheckpoint.ids",
    "microcheckpoint.config",
    "microcheckpoint.protocol.barrier",
    "microcheckpoint.protocol.pending",
    "microcheckpoint.protocol.metadata",
    "microcheckpoint.protocol.layout",
    "microcheckpoint.protocol.view",
    "microcheckpoint.protocol.coordinator",
    "microcheckpoint.protocol.retention",
    "microcheckpoint.protocol.savepoints",
    "microcheckpoint.protocol.history",
    "microcheckpoint.storage",
    "microcheckpoint.storage.port",
    "microcheckpoint.storage.file",
    "microcheckpoint.state.keygroups",
    "microcheckpoint.state.backends",
    "microcheckpoint.state.chains",
    "microcheckpoint.state.reader",
    # The executor side of the engine imports no Spark either.
    "microcheckpoint.engine.api",
    "microcheckpoint.engine.keyed",
]

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
