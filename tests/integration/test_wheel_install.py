"""The distribution as a user installs it: the built wheel in fresh virtual environments.

The sdist and the wheel are built with ``python -m build`` (the wheel from the sdist, so
both are proven). The wheel goes into two new virtual environments, with nothing from this
repository on their path (no ``PYTHONPATH``, working directory outside it):

- ``microcheckpoint[airflow]`` next to the pinned ``apache-airflow==3.3.2``, with a DAG file
  calling ``pipeline_dags`` and its pipeline module beside it in the DAGs folder (the
  repository's ``examples/`` are not part of the distribution). Airflow's own CLI parses
  the file, lists the plugin and the provider's connection types, and its API server
  serves the Checkpoints page behind the login;
- ``microcheckpoint[cli]`` alone: the console script answers ``--help``, and a command that
  needs another extra says which one in one line.

``uv`` (pinned in requirements-dev.txt) creates and fills the environments: about 13 s
for Airflow's 260 packages with a cold cache, 9 s warm, where pip took 61 s with a warm
cache. It fetches from PyPI, so a fresh clone needs the network, as ``make venv`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.services import _http_ok, _spawn, _wait_until, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AIRFLOW = "apache-airflow==3.3.2"
DAG_IDS = ["sales_cancel", "sales_pipeline", "sales_restore", "sales_savepoint"]
CONN_TYPES = {
    "microcheckpoint_storage": "microcheckpoint_airflow.hooks.CheckpointStorageHook",
    "microcheckpoint_kafka": "microcheckpoint_airflow.hooks.KafkaHook",
    "microcheckpoint_api": "microcheckpoint_airflow.hooks.AirflowApiHook",
}
PIPELINE_MODULE = '''\
"""Running totals per region over Parquet files (imported when a task runs)."""

from microcheckpoint.engine.api import FileSource, Pipeline, running_sum

pipeline = Pipeline("sales", FileSource("orders", "file:///srv/orders")).then(
    running_sum("totals", key="region")
)
'''
DAG_FILE = """\
from datetime import datetime

from microcheckpoint_airflow import PipelineSpec, pipeline_dags

spec = PipelineSpec(
    name="sales",
    pipeline="sales_pipeline:pipeline",
    checkpointing={"storage": "file:///srv/checkpoints", "interval": "5min"},
)
globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1)))
"""


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a non-zero exit fails the test with its output."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-4000:])
    return done


@dataclass(frozen=True)
class Venv:
    """A fresh virtual environment and the environment its commands run with."""

    root: Path
    env: dict[str, str]

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` from this environment's ``bin``, run from outside the repository."""
        return subprocess.run(
            [str(self.root / "bin" / argv[0]), *argv[1:]],
            env=self.env,
            cwd=self.root.parent,
            capture_output=True,
            text=True,
            timeout=300,
        )


def clean_environment(venv: Path) -> dict[str, str]:
    """This process's environment less everything that points into the repository or
    configures Airflow or microcheckpoint; the venv's ``bin`` first on ``PATH``."""
    dropped = ("AIRFLOW", "_AIRFLOW", "MICROCHECKPOINT", "PYTHON", "VIRTUAL_ENV", "SPARK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and str(REPO) not in p]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def make_venv(folder: Path, *requirements: str) -> Venv:
    """A new venv of this Python's base interpreter (not the repository's .venv) with
    ``requirements`` installed by uv."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    env = clean_environment(folder)
    run(
        [str(BIN / "uv"), "venv", "--quiet", "--python", str(base), str(folder)], env, folder.parent
    )
    python = str(folder / "bin" / "python")
    run(
        [str(BIN / "uv"), "pip", "install", "--quiet", "--python", python, *requirements],
        env,
        folder.parent,
    )
    return Venv(folder, env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from this checkout; the wheel's path."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    run(
        [sys.executable, "-m", "build", "--installer", "uv", "--outdir", str(out), str(REPO)],
        env,
        REPO,
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == ["microcheckpoint-0.1.0-py3-none-any.whl", "microcheckpoint-0.1.0.tar.gz"]
    return out / names[0]


@dataclass(frozen=True)
class AirflowInstall:
    """What the fresh Airflow said: its CLI's outputs and the API server's address."""

    venv: Venv
    outputs: dict[str, subprocess.CompletedProcess[str]]
    url: str


@pytest.fixture(scope="module")
def airflow(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowInstall]:
    """Airflow and the wheel in a new venv, a DAGs folder, a migrated database, the API
    server on a free loopback port (stopped by its process id at the end).

    Steps: 1. the venv; 2. the DAGs folder and ``airflow db migrate``; 3. the API server
    started, and meanwhile the CLI commands the tests read, run side by side; 4. the API
    server waited for.
    """
    # Step 1: the venv, with the distribution's [airflow] extra next to the pinned Airflow.
    top = tmp_path_factory.mktemp("airflow")
    venv = make_venv(top / "venv", f"microcheckpoint[airflow] @ {wheel.as_uri()}", AIRFLOW)
    # Step 2: a DAG file and its pipeline module, a home of its own, the database.
    dags = top / "dags"
    dags.mkdir()
    (dags / "sales_pipeline.py").write_text(PIPELINE_MODULE)
    (dags / "sales.py").write_text(DAG_FILE)
    venv.env.update(
        AIRFLOW_HOME=str(top / "home"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    migrated = venv.run("airflow", "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr[-4000:]
    # Step 3: the API server, and the CLI commands side by side while it starts.
    port = free_port()
    argv = ["airflow", "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = _spawn(
        "api-server",
        [str(venv.root / "bin" / argv[0]), *argv[1:]],
        venv.env,
        top,
        f"127.0.0.1:{port}",
    )
    try:
        commands = {
            "import-errors": ["airflow", "dags", "list-import-errors", "--local", "-o", "json"],
            "dags": ["airflow", "dags", "list", "--local", "-o", "json"],
            "plugins": ["airflow", "plugins", "-o", "json"],
            "hooks": ["airflow", "providers", "hooks", "-o", "json"],
            "providers": ["airflow", "providers", "list", "-o", "json"],
            "where": ["python", "-c", "import microcheckpoint_airflow as m; print(m.__file__)"],
            # The file SparkSubmit mode hands spark-submit must be in the installed package.
            "job": [
                "python",
                "-c",
                "from microcheckpoint_airflow.operators import RUN_EPOCH as j; "
                "print(j, j.is_file())",
            ],
        }
        running = {
            name: subprocess.Popen(
                [str(venv.root / "bin" / cmd[0]), *cmd[1:]],
                env=venv.env,
                cwd=top,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, cmd in commands.items()
        }
        outputs = {}
        for name, process in running.items():
            out, err = process.communicate(timeout=300)
            outputs[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
        # Step 4: the API server answers its health check.
        _wait_until(server, lambda: _http_ok(f"http://127.0.0.1:{port}/api/v2/monitor/health"), 180)
        yield AirflowInstall(venv, outputs, f"http://127.0.0.1:{port}")
    finally:
        server.stop()


def output(install: AirflowInstall, name: str) -> Any:
    """A command's JSON output (the command must have succeeded): its last line, as Airflow
    writes its log warnings (an absent graphviz) to standard output too."""
    done = install.outputs[name]
    assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-4000:])
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        pytest.fail(f"`{name}` printed no JSON: {last!r}; stderr: {done.stderr[-2000:]}")


def test_the_package_airflow_imports_is_the_installed_one(airflow: AirflowInstall) -> None:
    where = airflow.outputs["where"]
    assert where.returncode == 0, where.stderr
    site = airflow.venv.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert where.stdout.strip() == str(
        site / "site-packages" / "microcheckpoint_airflow" / "__init__.py"
    )


def test_the_spark_submit_job_is_a_file_of_the_installed_package(
    airflow: AirflowInstall,
) -> None:
    job = airflow.outputs["job"]
    assert job.returncode == 0, job.stderr
    site = airflow.venv.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert job.stdout.split() == [
        str(site / "site-packages" / "microcheckpoint" / "run_epoch.py"),
        "True",
    ]


def test_the_dag_file_parses_into_the_pipeline_dags(airflow: AirflowInstall) -> None:
    assert output(airflow, "import-errors") == []
    dags = output(airflow, "dags")
    assert sorted(d["dag_id"] for d in dags) == DAG_IDS


def test_the_plugin_is_listed_with_its_page(airflow: AirflowInstall) -> None:
    plugins = output(airflow, "plugins")
    assert [p["name"] for p in plugins] == ["microcheckpoint"]
    assert plugins[0]["fastapi_apps"] == [
        {
            "app": "fastapi.applications.FastAPI",
            "url_prefix": "/microcheckpoint",
            "name": "Checkpoints",
        }
    ]


def test_the_provider_registers_its_connection_types_without_warnings(
    airflow: AirflowInstall,
) -> None:
    providers = output(airflow, "providers")
    ours = [p for p in providers if p["package_name"] == "microcheckpoint"]
    assert [p["version"] for p in ours] == ["0.1.0"]
    hooks = output(airflow, "hooks")
    found = {
        h["connection_type"]: h["class"] for h in hooks if h["package_name"] == "microcheckpoint"
    }
    assert found == CONN_TYPES
    for name in ("hooks", "providers"):
        stderr = airflow.outputs[name].stderr
        assert "Inconsistency" not in stderr and "microcheckpoint" not in stderr, stderr


def status_of(url: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET of ``url`` that follows no redirect."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    try:
        with opener.open(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_checkpoints_page_needs_a_login(airflow: AirflowInstall) -> None:
    # The JSON API answers an anonymous client 401; the page sends a person to the login.
    status, _, body = status_of(f"{airflow.url}/microcheckpoint/api/pipelines")
    assert (status, body) == (401, b'{"detail":"Not authenticated"}')
    status, headers, _ = status_of(f"{airflow.url}/microcheckpoint/")
    assert (status, headers["location"]) == (307, "/auth/login?next=%2Fmicrocheckpoint%2F")
    # The page's stylesheet is the wheel's file (public: it holds no data).
    status, _, body = status_of(f"{airflow.url}/microcheckpoint/static/checkpoints.css")
    assert (status, body) == (
        200,
        (REPO / "microcheckpoint_airflow/static/checkpoints.css").read_bytes(),
    )


def test_the_cli_extra_alone_gives_the_command(wheel: Path, tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "venv", f"microcheckpoint[cli] @ {wheel.as_uri()}")
    shown = venv.run("microcheckpoint", "--help")
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    assert "Usage: microcheckpoint [OPTIONS] COMMAND [ARGS]..." in shown.stdout
    # No boto3 here: an s3:// root is one line naming the extra, not a traceback.
    listed = venv.run("microcheckpoint", "--storage", "s3://bucket/checkpoints", "pipelines")
    assert (listed.returncode, listed.stdout, listed.stderr) == (
        1,
        "",
        "microcheckpoint: this command needs the package 'boto3', which is not installed; "
        "install it with: pip install 'microcheckpoint[s3]'\n",
    )
