"""State evolution across a savepoint, through the console script: a keyed process function's
savepoint (local Spark, a file source, file storage) restored into versions of the function
that change its state. A changed type or a dropped state is refused in one line and
changes no stored file; an added field reads its default; a dropped state, allowed, stays
in its keys unread; ``verify`` lists the descriptors against the pipeline's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.savepoints import create_savepoint
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore
from tests.integration import evolution_pipeline as evo
from tests.integration.cli_support import REPO, cli

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
NAME = "evolving"
MODULE = "tests.integration.evolution_pipeline"
# Epoch 0 registers timers 151 (a) and 153 (b); epoch 1 adds 170 (a) and 154 (b), c@90 is
# late (watermark 97); epoch 2's watermark 295 fires all four.
FILES = [
    [("a", 100), ("b", 103), ("a", 101)],
    [("a", 120), ("b", 104), ("c", 90)],
    [("c", 300), ("a", 301)],
]


def write_files(folder: Path) -> None:
    folder.mkdir(parents=True)
    for i, rows in enumerate(FILES):
        table = pa.table({"k": [k for k, _ in rows], "ts": [t for _, t in rows]})
        pq.write_table(table, folder / f"part-{i:05d}.parquet")


def epoch(spark, pipeline, store, e: int) -> list[tuple]:
    config = CheckpointConfig.from_mapping({"pipeline": NAME, "storage": store.url})
    done = run_cycle(
        spark, pipeline, config, store, bootstrap="", parallelism=2, collect=True,
        clock=lambda: T0 + 60 * e,
    )  # fmt: skip
    return sorted((r["at"], r["k"], r["count"], r["last"]) for r in done.outputs)


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def world(spark, tmp_path: Path):
    """Epochs 0 and 1 of version v1, a savepoint of checkpoint 2, and the script's env."""
    write_files(tmp_path / "in")
    store = FileStore((tmp_path / "chk").as_uri())
    v1 = evo.pipeline("v1", NAME, str(tmp_path / "in"))
    assert [epoch(spark, v1, store, e) for e in (0, 1)] == [[], []]
    url = create_savepoint(store, NAME, CheckpointId(2)).rstrip("/")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "250",
        "MICROCHECKPOINT_STORAGE": store.url,
        "MICROCHECKPOINT_PIPELINE": NAME,
        "EVOLUTION_INPUT": str(tmp_path / "in"),
    }
    return store, url, env, tmp_path


def refused(env, url: str, version: str, *more: str) -> str:
    done = cli(env, "restore", url, "--module", f"{MODULE}:{version}", *more, code=2)
    assert done.stdout == ""
    return done.stderr


def test_a_changed_type_and_a_dropped_state_are_refused_and_nothing_changes(world) -> None:
    _, url, env, tmp_path = world
    before = files_of(tmp_path / "chk")
    assert refused(env, url, "retyped", "--allow-non-restored-state") == (
        "microcheckpoint: state 'count' of operator 'tally' is a value state of long in "
        f"{url} and the pipeline declares a value state of string; keep its type, or declare "
        "the new one under another name (restore with allow_non_restored_state to drop the "
        "old one)\n"
    )
    assert refused(env, url, "dropped") == (
        f"microcheckpoint: {url} holds state 'recent' of operator 'tally' that the pipeline "
        "no longer declares; restore with allow_non_restored_state to leave it unread, or "
        "declare it again\n"
    )
    assert files_of(tmp_path / "chk") == before


def test_verify_lists_the_points_descriptors_against_the_pipelines(world) -> None:
    _, url, env, _ = world
    done = cli(env, "verify", url, "--json", "--module", f"{MODULE}:dropped")
    rows = [c for c in json.loads(done.stdout)["checks"] if c["check"].startswith("state ")]
    assert rows == [
        {"check": "state tally/count", "ok": True, "detail": "value state of long"},
        {
            "check": "state tally/recent",
            "ok": True,
            "warning": True,
            "detail": "dropped: list state of json, ttl 3600000 ms (kept unread): restore with "
            "allow_non_restored_state",
        },
        {"check": "state tally/last", "ok": True, "detail": "value state of json, fields ts"},
        {"check": "state tally/seen", "ok": True, "detail": "map state of json"},
        {"check": "state tally/top", "ok": True, "detail": "reducing state of json"},
        {"check": "state tally/mean", "ok": True, "detail": "aggregating state of json"},
    ]
    retyped = cli(env, "verify", url, "--json", "--module", f"{MODULE}:retyped", code=1)
    failed = [c for c in json.loads(retyped.stdout)["checks"] if not c["ok"]]
    assert failed == [
        {
            "check": "state tally/count",
            "ok": False,
            "detail": "type changed: value state of long -> value state of string",
        }
    ]


def test_an_added_field_reads_its_default_after_the_restore(spark, world) -> None:
    store, url, env, tmp_path = world
    done = cli(env, "restore", url, "--module", f"{MODULE}:field_added")
    assert (done.stdout, done.stderr) == (f"restored {NAME} from {url}\n", "")
    field_added = evo.pipeline("field_added", NAME, str(tmp_path / "in"))
    last = lambda ts: json.dumps({"src": "file", "ts": ts}, sort_keys=True)  # noqa: E731
    assert epoch(spark, field_added, store, 2) == [
        (151, "a", 4, last(301)),
        (153, "b", 2, last(104)),
        (154, "b", 2, last(104)),
        (170, "a", 4, last(301)),
    ]


def test_a_dropped_state_allowed_stays_unread_in_its_keys(spark, world) -> None:
    store, url, env, tmp_path = world
    done = cli(env, "restore", url, "--module", f"{MODULE}:dropped", "--allow-non-restored-state")
    assert done.stderr == "states left unread: tally/recent\n"
    dropped = evo.pipeline("dropped", NAME, str(tmp_path / "in"))
    last = lambda ts: json.dumps({"ts": ts})  # noqa: E731
    assert epoch(spark, dropped, store, 2) == [
        (151, "a", 4, last(301)),
        (153, "b", 2, last(104)),
        (154, "b", 2, last(104)),
        (170, "a", 4, last(301)),
    ]
    state = read_keyed_state(store, NAME, "tally")
    # "a" was written in epoch 2, "b" not: both keep the list of epochs 0 and 1, unread
    assert [v[0] for v in state["a"]["s"]["recent"]] == [100, 101, 120]
    assert [v[0] for v in state["b"]["s"]["recent"]] == [103, 104]
    assert [v[0] for v in state["c"]["s"].get("recent", [])] == []
