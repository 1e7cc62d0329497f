"""The modules Airflow's long-lived processes load for the epoch tasks they fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from microcheckpoint_airflow.preload import MODULES, preload

REPO = Path(__file__).resolve().parents[3]


def test_every_preloaded_module_imports_and_none_starts_a_python_thread() -> None:
    # In a fresh interpreter: a Python thread alive at fork time would be lost in the task.
    code = textwrap.dedent(
        """
        import sys, threading
        from microcheckpoint_airflow.preload import MODULES, preload
        missing = preload()
        print(len(MODULES), missing, threading.active_count(),
              all(m in sys.modules for m in MODULES))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [str(len(MODULES)), "[]", "1", "True"]


def test_a_module_that_cannot_be_imported_is_reported_not_raised() -> None:
    assert preload(("json", "microcheckpoint.no_such_module")) == ["microcheckpoint.no_such_module"]


def test_the_local_settings_file_calls_preload() -> None:
    text = (REPO / "docker" / "airflow_local_settings.py").read_text()
    assert "from microcheckpoint_airflow.preload import preload\n\npreload()\n" in text
