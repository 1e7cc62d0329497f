"""The edge contract (issue 25, item 6): every entry point answers bad input the same way.

One table of bad inputs per entry point outside Airflow: each CLI command through the
console script, ``spark_jobs/run_epoch.py`` as a process, and ``PipelineSpec`` in a DAG file
imported as Airflow imports it. Each row asserts one line on stderr naming the thing, the
value and the fix, the exit code (or the import error), and that storage is byte-identical
before and after (every object listed and read). Generated values (parallelism text that
is no integer, integers out of range) come from Hypothesis. The rows that Airflow answers
(each DAG's REST trigger, the Checkpoints page and its JSON routes) are one test in
``tests/e2e/test_airflow_scheduler.py``; older rows live in ``test_cli_edges.py`` and
``tests/unit/test_run_epoch_cli.py`` and are not repeated here. docs/reliability.md
("Edge contract") holds the table of a real run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import string
import subprocess
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.protocol.layout import Layout
from tests.integration.cli_support import REPO, SCRIPT
from tests.unit.conftest import TP0, TP1, Harness

pytestmark = pytest.mark.integration
RANGE = "an integer in 1..128 (the pipeline's max_parallelism)"
CORRUPT = "restore from another checkpoint or savepoint"


@dataclass
class Row:
    """One bad input at one entry point, and what must come back.

    ``args`` and ``line`` may hold ``{root}``, ``{bucket}``, ``{closed}`` and ``{other}``;
    ``line`` is the start of the one stderr line (its end is the fix, when long).
    ``damage`` makes the storage copy bad first (``corrupt`` or ``empty`` _metadata of
    checkpoint 2). ``where`` is ``file`` (a copy of a local root) or ``s3`` (the bucket).
    """

    entry: str
    bad: str
    args: tuple[str, ...]
    line: str
    code: int
    where: str = "file"
    damage: str = ""
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a row gave: its code, its stderr lines, and whether storage stayed the same."""

    row: Row
    code: int
    lines: list[str]
    stdout: str
    untouched: bool

    def problems(self, line: str) -> list[str]:
        found = []
        if self.code != self.row.code:
            found.append(f"exit code {self.code}, not {self.row.code}")
        if len(self.lines) != 1 or any("Traceback" in x for x in self.lines):
            found.append(f"{len(self.lines)} lines: {self.lines[-6:]}")
        elif not self.lines[0].startswith(line):
            found.append(f"line {self.lines[0]!r} does not start with {line!r}")
        if self.stdout:
            found.append(f"stdout {self.stdout[:200]!r}")
        if not self.untouched:
            found.append("storage changed")
        return found


TABLE: list[dict[str, object]] = []  # every row run, for the summary test (and the docs)


def record(outcome: Outcome, line: str) -> list[str]:
    problems = outcome.problems(line)
    TABLE.append(
        {
            "entry": outcome.row.entry,
            "bad": outcome.row.bad,
            "input": shown(outcome.row),
            "code": outcome.code,
            "line": outcome.lines[0] if outcome.lines else "",
            "one_line": len(outcome.lines) == 1,
            "untouched": outcome.untouched,
            "ok": not problems,
        }
    )
    return [
        f"[{outcome.row.entry} | {outcome.row.bad} | {' '.join(outcome.row.args)}] " + p
        for p in problems
    ]


def shown(row: Row) -> str:
    """The row's input as a person would write it."""
    if row.entry != "DAG file":
        return " ".join(row.args)
    checkpointing, spec = row.args
    return f"checkpointing={{{checkpointing}}}" if checkpointing else f"PipelineSpec({spec[:-1]})"


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


class Pipe(Harness):
    """The unit tests' harness, for a pipeline of another name."""

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root)
        self.layout = Layout(name)
        self.name = name

    def config(self, **overrides) -> CheckpointConfig:
        values = {"pipeline": self.name, "storage": self.store.url, **overrides}
        return CheckpointConfig.from_mapping(values)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two completed checkpoints each of ``wordcount`` and ``other`` in one root, written by
    the protocol's coordinator (the CLI reads storage only; no epoch runs here)."""
    root = tmp_path_factory.mktemp("edge") / "chk"
    for name in ("wordcount", "other"):
        pipe = Pipe(root, name)
        coord = pipe.coordinator(retained=5)
        for end in (3, 6):
            pipe.epoch(coord, {TP0: end, TP1: end})
    return root


def damage(root: Path, how: str) -> None:
    meta = root / "wordcount/chk-0000000002/_metadata"
    if how == "corrupt":
        meta.write_bytes(b"{not json")
    elif how == "empty":
        meta.write_bytes(b"")


# ---- the CLI ------------------------------------------------------------------------------

NOT_JSON = "is corrupt (not JSON: "
CLI_ROWS = [
    Row(
        "cli restore",
        "unknown key",
        ("restore", "latest", "--paralelism", "3"),
        "microcheckpoint: No such option: --paralelism (Possible options: --parallelism); "
        "see `microcheckpoint restore --help`",
        2,
    ),
    Row(
        "cli restore",
        "missing point",
        ("restore", "99"),
        "microcheckpoint: checkpoint 99 of 'wordcount' is not a completed checkpoint "
        "(completed: [1, 2])",
        2,
    ),
    Row(
        "cli restore",
        "another pipeline's point",
        ("restore", "{root}/other/chk-0000000002"),
        "microcheckpoint: {root}/other/chk-0000000002 belongs to pipeline 'other', not "
        "'wordcount'; restore a savepoint taken from this pipeline",
        2,
    ),
    Row(
        "cli restore",
        "wrong type",
        ("restore", "7x"),
        "microcheckpoint: config field 'point' = '7x' is invalid: latest, a checkpoint id (7 or "
        "chk-7), or a savepoint folder URL",
        2,
    ),
    Row(
        "cli restore",
        "corrupt _metadata",
        ("restore", "2"),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata " + NOT_JSON,
        1,
        damage="corrupt",
    ),
    Row(
        "cli restore",
        "empty _metadata",
        ("restore", "2"),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata "
        + NOT_JSON
        + "Expecting value: line 1 column 1 (char 0)); "
        + CORRUPT,
        1,
        damage="empty",
    ),
    Row(
        "cli restore",
        "misspelt pipeline",
        ("-p", "wordcont", "restore", "latest"),
        "microcheckpoint: pipeline 'wordcont' has nothing stored in {root}; did you mean "
        "'wordcount'? pipelines there: other, wordcount",
        2,
    ),
    Row(
        "cli show",
        "wrong type",
        ("show", "abc"),
        "microcheckpoint: config field 'checkpoint' = 'abc' is invalid: a checkpoint id (7 or "
        "chk-7)",
        2,
    ),
    Row(
        "cli show",
        "missing point",
        ("show", "99"),
        "microcheckpoint: pipeline 'wordcount' has no checkpoint 99 in {root} (known: [1, 2]); "
        "see `microcheckpoint list`",
        2,
    ),
    Row(
        "cli show",
        "corrupt _metadata",
        ("show", "2"),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata " + NOT_JSON,
        1,
        damage="corrupt",
    ),
    Row(
        "cli show",
        "misspelt pipeline",
        ("-p", "wordcont", "show", "1"),
        "microcheckpoint: pipeline 'wordcont' has nothing stored in {root}; did you mean",
        2,
    ),
    Row(
        "cli show",
        "unknown key",
        ("show", "1", "--jsn"),
        "microcheckpoint: No such option: --jsn (Possible options: --json); see "
        "`microcheckpoint show --help`",
        2,
    ),
    Row(
        "cli savepoint",
        "corrupt _metadata",
        ("savepoint",),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata " + NOT_JSON,
        1,
        damage="corrupt",
    ),
    Row(
        "cli savepoint",
        "empty _metadata",
        ("savepoint",),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata "
        + NOT_JSON
        + "Expecting value",
        1,
        damage="empty",
    ),
    Row(
        "cli savepoint",
        "misspelt pipeline",
        ("-p", "wordcont", "savepoint"),
        "microcheckpoint: pipeline 'wordcont' has nothing stored in {root}; did you mean",
        2,
    ),
    Row(
        "cli savepoint",
        "missing point",
        ("savepoint", "--dispose", "{root}/wordcount/savepoints/sp-x"),
        "microcheckpoint: no _metadata at {root}/wordcount/savepoints/sp-x/_metadata; give the "
        "folder of a savepoint or checkpoint",
        2,
    ),
    Row(
        "cli cancel",
        "misspelt pipeline",
        ("-p", "wordcont", "cancel"),
        "microcheckpoint: pipeline 'wordcont' has nothing stored in {root}; did you mean",
        2,
    ),
    Row(
        "cli cancel",
        "unknown key",
        ("cancel", "--clenup", "DELETE_ON_CANCELLATION"),
        "microcheckpoint: No such option: --clenup (Possible options: --cleanup)",
        2,
    ),
    Row(
        "cli verify",
        "missing point",
        ("verify", "99"),
        "microcheckpoint: checkpoint 99 of 'wordcount' is not a completed checkpoint",
        2,
    ),
    Row(
        "cli verify",
        "another pipeline's point",
        ("verify", "{root}/other/chk-0000000001"),
        "microcheckpoint: {root}/other/chk-0000000001 belongs to pipeline 'other'",
        2,
    ),
    Row(
        "cli verify",
        "broker down",
        ("verify", "1", "--bootstrap", "127.0.0.1:{closed}"),
        "microcheckpoint: Kafka at bootstrap servers '127.0.0.1:{closed}' did not answer while "
        "connecting within request_timeout_ms=30000",
        1,
    ),
    Row(
        "cli state export",
        "corrupt _metadata",
        ("state", "export", "--uid", "agg", "--to", "{tmp}/x.parquet"),
        "microcheckpoint: {root}/wordcount/chk-0000000002/_metadata " + NOT_JSON,
        1,
        damage="corrupt",
    ),
    Row(
        "cli state export",
        "misspelt pipeline",
        ("-p", "wordcont", "state", "export", "--uid", "agg", "--to", "{tmp}/x.parquet"),
        "microcheckpoint: pipeline 'wordcont' has nothing stored in {root}; did you mean",
        2,
    ),
    Row(
        "cli state import",
        "target outside the root",
        (
            "state",
            "import",
            "--uid",
            "agg",
            "--from",
            "{tmp}/in.parquet",
            "--target",
            "file:///tmp/elsewhere/sp",
        ),
        "microcheckpoint: config field 'target' = 'file:///tmp/elsewhere/sp' is invalid: a "
        "location under one of the configured roots ({root})",
        2,
    ),
    Row(
        "cli checkpoint",
        "unknown key",
        (
            "checkpoint",
            "--module",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:{closed}",
            "--config",
            '{"min_paus": 1}',
        ),
        "microcheckpoint: config field 'min_paus' = 1 is invalid: not a setting; did you mean "
        "'min_pause'?",
        2,
    ),
    Row(
        "cli checkpoint",
        "out of range",
        (
            "checkpoint",
            "--module",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:{closed}",
            "--parallelism",
            "999",
        ),
        "microcheckpoint: config field 'parallelism' = 999 is invalid: " + RANGE,
        2,
    ),
    Row(
        "cli checkpoint",
        "misspelt pipeline",
        (
            "-p",
            "wordcont",
            "checkpoint",
            "--module",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:{closed}",
        ),
        "microcheckpoint: config field 'pipeline' = 'wordcont' is invalid: the name of the "
        "pipeline that examples.wordcount:pipeline builds ('wordcount')",
        2,
    ),
    Row(
        "cli pipelines",
        "wrong endpoint",
        ("--s3-endpoint", "http://127.0.0.1:{closed}", "pipelines"),
        "microcheckpoint: listing s3://{bucket}/chk/ failed: S3 endpoint "
        "http://127.0.0.1:{closed} is unreachable",
        1,
        where="s3",
    ),
    Row(
        "cli restore",
        "wrong endpoint",
        ("--s3-endpoint", "http://127.0.0.1:{closed}", "restore", "latest"),
        "microcheckpoint: listing s3://{bucket}/chk/wordcount/ failed: S3 endpoint "
        "http://127.0.0.1:{closed} is unreachable",
        1,
        where="s3",
    ),
    Row(
        "cli savepoint",
        "no credentials",
        ("savepoint",),
        "microcheckpoint: listing s3://{bucket}/chk/wordcount/ needs S3 credentials and found none",
        1,
        where="s3",
        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
    ),
    Row(
        "cli restore",
        "no credentials",
        ("restore", "latest"),
        "microcheckpoint: listing s3://{bucket}/chk/wordcount/ needs S3 credentials and found none",
        1,
        where="s3",
        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
    ),
    Row(
        "cli pipelines",
        "no credentials",
        ("pipelines",),
        "microcheckpoint: listing s3://{bucket}/chk/ needs S3 credentials and found none",
        1,
        where="s3",
        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
    ),
]


@dataclass
class Places:
    """Where rows run: the module's root, a scratch folder, the bucket and a closed port."""

    made: Path
    tmp: Path
    bucket: str
    s3_url: str
    read_bucket: Callable[[], dict[str, bytes]]
    closed: int

    def fill(self, text: str, root: str) -> str:
        """``text`` with its placeholders filled in (JSON braces in it stay)."""
        values = {"root": root, "bucket": self.bucket, "closed": str(self.closed)}
        for name, value in {**values, "tmp": str(self.tmp)}.items():
            text = text.replace("{" + name + "}", value)
        return text


def base_env(places: Places, where: str, row_env: dict[str, str]) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MICROCHECKPOINT_", "WORDCOUNT_"))
    }
    env.update(PYTHONPATH=str(REPO), COLUMNS="200", MICROCHECKPOINT_PIPELINE="wordcount")
    if where == "s3":
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        env.update(
            AWS_CONFIG_FILE="/nonexistent",
            AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
            AWS_EC2_METADATA_DISABLED="true",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            MICROCHECKPOINT_S3_ENDPOINT=places.s3_url,
            MICROCHECKPOINT_STORAGE=f"s3://{places.bucket}/chk",
        )
    for key, value in row_env.items():
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def run_cli_row(places: Places, index: int, row: Row) -> tuple[Outcome, str]:
    """Run one row on its own copy of the root (or on the bucket) and compare storage."""
    if row.where == "s3":
        root_url = f"s3://{places.bucket}/chk"
        read = places.read_bucket
    else:
        copy = places.tmp / f"row-{index}"
        shutil.copytree(places.made, copy)
        damage(copy, row.damage)
        root_url = copy.as_uri()
        read = lambda: files(copy)  # noqa: E731
    env = base_env(places, row.where, row.env)
    if row.where == "file":
        env["MICROCHECKPOINT_STORAGE"] = root_url
    before = read()
    args = [places.fill(a, root_url) for a in row.args]
    done = subprocess.run(
        [str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    outcome = Outcome(row, done.returncode, done.stderr.splitlines(), done.stdout, read() == before)
    return outcome, places.fill(row.line, root_url)


@pytest.fixture(scope="module")
def places(made, tmp_path_factory, s3_endpoint, s3_client) -> Places:
    """The bucket holds a copy of the module's root under ``chk/``."""
    bucket = f"edge-{os.getpid()}-{closed_port()}"
    s3_client.create_bucket(Bucket=bucket)
    for name, data in files(made).items():
        s3_client.put_object(Bucket=bucket, Key=f"chk/{name}", Body=data)

    def read_bucket() -> dict[str, bytes]:
        pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        keys = sorted(o["Key"] for page in pages for o in page.get("Contents", []))
        return {k: s3_client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}

    tmp = tmp_path_factory.mktemp("rows")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"key": ['"a"'], "state": ["1"]}), tmp / "in.parquet")
    return Places(made, tmp, bucket, s3_endpoint.url, read_bucket, closed_port())


def test_every_cli_command_answers_bad_input_in_one_line_and_writes_nothing(places) -> None:
    # The rows run three at a time (the broker-down row waits out Kafka's 30 s timeout);
    # each has its own copy of the root, so a write is the row's own.
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda ir: run_cli_row(places, *ir), enumerate(CLI_ROWS)))
    problems = [p for outcome, line in done for p in record(outcome, line)]
    assert not problems, "\n".join(problems)
    assert not Path("/tmp/elsewhere").exists()


def not_an_integer() -> st.SearchStrategy[str]:
    """Parallelism text that no edge may take as a number."""

    def is_int(text: str) -> bool:
        try:
            int(text.strip())
        except ValueError:
            return False
        return True

    alphabet = string.ascii_letters + string.digits + ".,+-_ é"
    return st.text(alphabet, min_size=1, max_size=6).filter(
        lambda t: t.strip() not in ("", "None") and not is_int(t)
    )


OUT_OF_RANGE = st.one_of(st.integers(max_value=0), st.integers(min_value=129, max_value=10**9))
FEW = settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    database=None,
)


def parallelism_rows(value: str | int) -> tuple[list[Row], str]:
    shown = repr(value) if isinstance(value, str) else str(value)
    bad = "wrong type" if isinstance(value, str) else "out of range"
    line = f"config field 'parallelism' = {shown} is invalid: {RANGE}"
    rows = [
        Row(
            "cli restore",
            bad,
            ("restore", "latest", f"--parallelism={value}"),
            "microcheckpoint: " + line,
            2,
        ),
        Row(
            "run_epoch.py",
            bad,
            (
                "--pipeline",
                "examples.wordcount:pipeline",
                "--bootstrap",
                "127.0.0.1:1",
                f"--parallelism={value}",
            ),
            "run_epoch.py: " + line,
            2,
        ),
    ]
    return rows, line


def run_epoch_row(places: Places, index: int, row: Row) -> tuple[Outcome, str]:
    copy = places.tmp / f"epoch-{index}"
    shutil.copytree(places.made, copy)
    before = files(copy)
    env = base_env(places, "file", {})
    command = [sys.executable, "spark_jobs/run_epoch.py", "--storage", copy.as_uri(), *row.args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    outcome = Outcome(
        row, done.returncode, done.stderr.splitlines(), done.stdout, files(copy) == before
    )
    return outcome, places.fill(row.line, copy.as_uri())


def check_parallelism(places: Places, value: str | int, tag: str) -> None:
    (cli_row, epoch_row), _ = parallelism_rows(value)
    with ThreadPoolExecutor(2) as pool:
        cli = pool.submit(run_cli_row, places, f"{tag}-cli", cli_row)
        epoch = pool.submit(run_epoch_row, places, tag, epoch_row)
        problems = record(*cli.result()) + record(*epoch.result())
    assert not problems, "\n".join(problems)


@FEW
@given(value=not_an_integer())
def test_a_parallelism_that_is_no_integer_is_refused_alike(places, value: str) -> None:
    check_parallelism(places, value, f"nan-{len(TABLE)}")


@FEW
@given(value=OUT_OF_RANGE)
def test_a_parallelism_out_of_range_is_refused_alike(places, value: int) -> None:
    check_parallelism(places, value, f"range-{len(TABLE)}")


# ---- spark_jobs/run_epoch.py --------------------------------------------------------------

EPOCH_ROWS = [
    Row(
        "run_epoch.py",
        "unknown key",
        (
            "--pipeline",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:1",
            "--paralelism",
            "3",
        ),
        "run_epoch.py: unrecognized arguments: --paralelism 3; see --help",
        2,
    ),
    Row(
        "run_epoch.py",
        "wrong type",
        (
            "--pipeline",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:1",
            "--checkpoint",
            "x",
        ),
        "run_epoch.py: argument --checkpoint: invalid int value: 'x'; see --help",
        2,
    ),
    Row(
        "run_epoch.py",
        "out of range",
        (
            "--pipeline",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:1",
            "--cycles",
            "0",
        ),
        "run_epoch.py: --cycles 0: an integer >= 1, and 1 with --checkpoint; see --help",
        2,
    ),
    Row(
        "run_epoch.py",
        "misspelt pipeline",
        ("--pipeline", "examples.wordcont:pipeline", "--bootstrap", "127.0.0.1:1"),
        "run_epoch.py: config field 'pipeline module' = 'examples.wordcont:pipeline' is "
        "invalid: module 'examples.wordcont' is not importable",
        2,
    ),
    Row(
        "run_epoch.py",
        "missing point",
        (
            "--pipeline",
            "examples.wordcount:pipeline",
            "--bootstrap",
            "127.0.0.1:1",
            "--checkpoint",
            "3",
        ),
        "run_epoch.py: --checkpoint 3: pipeline 'wordcount' has no pending checkpoint 3 in "
        "{root} (pending: []); trigger it first",
        2,
    ),
]


def test_run_epoch_answers_bad_input_in_one_line_before_spark(places) -> None:
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda ir: run_epoch_row(places, *ir), enumerate(EPOCH_ROWS)))
    problems = [p for outcome, line in done for p in record(outcome, line)]
    assert not problems, "\n".join(problems)


# ---- PipelineSpec in a DAG file ------------------------------------------------------------

DAG_FILE = """
from datetime import datetime
from microcheckpoint_airflow import PipelineSpec, pipeline_dags

spec = PipelineSpec(
    name="wordcount",
    pipeline="examples.wordcount:pipeline",
    checkpointing={{"storage": {storage!r}, "interval": "60s", {checkpointing}}},
    {spec}
)
globals().update(pipeline_dags(spec, start_date=datetime(2026, 1, 1)))
"""
# Each DAG file is imported as Airflow's DAG processor imports it; the last line of the
# import error is what `airflow dags list-import-errors` ends with.
IMPORT = """
import json, runpy, sys, traceback
for path in sys.argv[1:]:
    try:
        found = runpy.run_path(path)
        print(json.dumps([path, "imported", sorted(k for k in found if k.endswith("_pipeline"))]))
    except Exception as exc:
        print(json.dumps([path, "import error", traceback.format_exception_only(exc)[-1].strip()]))
"""
DAG_ROWS = [
    Row(
        "DAG file",
        "unknown key",
        ('"min_paus": "1s"', ""),
        "microcheckpoint.errors.ConfigError: config field 'min_paus' = '1s' is invalid: not a "
        "setting; did you mean 'min_pause'?",
        0,
    ),
    Row(
        "DAG file",
        "unknown key",
        ("", "paralelism=3,"),
        "TypeError: PipelineSpec.__init__() got an unexpected keyword argument 'paralelism'",
        0,
    ),
    Row(
        "DAG file",
        "wrong type",
        ("", 'parallelism="2",'),
        "microcheckpoint.errors.ConfigError: config field 'parallelism' = '2' is invalid: an "
        "integer in 1..128",
        0,
    ),
    Row(
        "DAG file",
        "wrong type",
        ('"timeout": "soon"', ""),
        "microcheckpoint.errors.ConfigError: config field 'timeout' = 'soon' is invalid: a "
        "duration",
        0,
    ),
    Row(
        "DAG file",
        "out of range",
        ("", "parallelism=999,"),
        "microcheckpoint.errors.ConfigError: config field 'parallelism' = 999 is invalid: an "
        "integer in 1..128",
        0,
    ),
    Row(
        "DAG file",
        "out of range",
        ('"retained": 0', ""),
        "microcheckpoint.errors.ConfigError: config field 'retained' = 0 is invalid:",
        0,
    ),
    Row(
        "DAG file",
        "target outside the root",
        ("", 'savepoint_roots=("/tmp/sp",),'),
        "microcheckpoint.errors.ConfigError: config field 'savepoint_roots' = '/tmp/sp' is "
        "invalid: URLs s3://bucket[/prefix] or file:///path",
        0,
    ),
]


def test_a_dag_file_with_a_bad_pipeline_spec_is_one_import_error(places, tmp_path: Path) -> None:
    copy = tmp_path / "chk"
    shutil.copytree(places.made, copy)
    before = files(copy)
    paths = []
    for i, row in enumerate(DAG_ROWS):
        checkpointing, spec = row.args
        path = tmp_path / f"bad_{i}.py"
        path.write_text(
            DAG_FILE.format(storage=copy.as_uri(), checkpointing=checkpointing, spec=spec)
        )
        paths.append(str(path))
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MICROCHECKPOINT_", "AIRFLOW"))}
    env.update(
        PYTHONPATH=str(REPO),
        AIRFLOW_HOME=str(home),
        MICROCHECKPOINT_REGISTRY=str(tmp_path / "registry"),
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IMPORT), *paths],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    answers = {
        path: (state, last) for path, state, last in map(json.loads, done.stdout.splitlines())
    }
    untouched = files(copy) == before
    problems = []
    for path, row in zip(paths, DAG_ROWS, strict=True):
        state, last = answers[path]
        outcome = Outcome(row, 0, [last] if state == "import error" else [], "", untouched)
        found = record(outcome, row.line)
        TABLE[-1]["code"] = state
        if state != "import error":
            found.append(f"imported: {last}")
        problems += found
    assert not problems, "\n".join(problems)


# ---- the table ---------------------------------------------------------------------------


def test_the_table_covers_every_entry_point_and_every_row_held() -> None:
    """Last in the module: the counts docs/reliability.md quotes (run with ``-s`` to see the
    table)."""
    fixed = len(CLI_ROWS) + len(EPOCH_ROWS) + len(DAG_ROWS)
    assert len(TABLE) >= fixed + 4, "run the whole module: the table is filled by its tests"
    entries = sorted({str(r["entry"]) for r in TABLE})
    print(f"\nedge contract: {len(TABLE)} cases, {len(entries)} entry points: {entries}")
    for r in TABLE:
        print(
            f"| {r['entry']} | {r['bad']} | `{r['input']}` | {r['code']} | "
            f"{'yes' if r['one_line'] else 'NO'} | {'yes' if r['untouched'] else 'NO'} | "
            f"{r['line']} |"
        )
    print(
        f"all one line: {all(r['one_line'] for r in TABLE)}; "
        f"all storage-untouched: {all(r['untouched'] for r in TABLE)}"
    )
    assert all(r["ok"] for r in TABLE)
    assert entries == [
        "DAG file",
        "cli cancel",
        "cli checkpoint",
        "cli pipelines",
        "cli restore",
        "cli savepoint",
        "cli show",
        "cli state export",
        "cli state import",
        "cli verify",
        "run_epoch.py",
    ]
