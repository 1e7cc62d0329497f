"""Running the installed ``microcheckpoint`` console script as a person would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "microcheckpoint"


def cli_env(storage: str, topic: str, bootstrap: str, spark_connect: str) -> dict[str, str]:
    """The environment of a shell working on pipeline ``wordcount`` reading ``topic``."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "WORDCOUNT_TOPIC": topic,
        "MICROCHECKPOINT_STORAGE": storage,
        "MICROCHECKPOINT_PIPELINE": "wordcount",
        "MICROCHECKPOINT_KAFKA_BOOTSTRAP": bootstrap,
        "MICROCHECKPOINT_SPARK_CONNECT": spark_connect,
    }


def cli(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    """Run the script with ``args``; its exit code must be ``code``."""
    done = subprocess.run(
        [str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done
