"""The modules Airflow's long-lived processes load for the epoch tasks they fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from microcheckpoint_airflow.preload import MODULES, preload

REPO = Path(__file__).resolve().parents[3]


def _fresh_interpreter(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter with only the repository on its path."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )


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
    out = _fresh_interpreter(code)
    assert out.stdout.split() == [str(len(MODULES)), "[]", "1", "True"]


def test_a_module_that_cannot_be_imported_is_reported_not_raised() -> None:
    assert preload(("json", "microcheckpoint.no_such_module")) == ["microcheckpoint.no_such_module"]


def test_the_local_settings_file_calls_preload() -> None:
    text = (REPO / "docker" / "airflow_local_settings.py").read_text()
    assert "from microcheckpoint_airflow.preload import preload\n\npreload()\n" in text


@pytest.mark.parametrize("preloaded", [True, False], ids=["preloaded", "not-preloaded"])
def test_a_task_forked_after_the_preload_parses_no_s3_model(preloaded: bool) -> None:
    """The first S3 client of a forked task reads no botocore JSON file when its parent
    preloaded (``adapters.s3.load_models``); without the preload it has to."""
    code = textwrap.dedent(
        f"""
        import os, botocore.loaders
        from microcheckpoint_airflow.preload import MODULES, preload
        preload(MODULES if {preloaded} else ())
        from microcheckpoint.adapters.s3 import make_client
        pid = os.fork()
        if pid == 0:
            def read(*args, **kwargs):
                raise AssertionError("a botocore JSON file was read")
            botocore.loaders.JSONFileLoader.load_file = read
            try:
                make_client("http://127.0.0.1:9", "eu-west-1", "key", "secret")
            except Exception as exc:
                print(type(exc).__name__, exc)
                os._exit(3)
            os._exit(0)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    out = _fresh_interpreter(code)
    assert out.stdout.splitlines()[-1] == ("child 0" if preloaded else "child 3"), out.stdout
