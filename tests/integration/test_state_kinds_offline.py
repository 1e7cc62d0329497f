"""``state export`` and ``state import`` of a keyed process function's state of every kind,
timers and key-group entries included, through the console script: the export shows each
key's states decoded per kind with their ttl timestamps and its timers; export, import and
export again are equal; and the pipeline restored from the imported savepoint fires the same
timers, with the same state, as the run that never left the engine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.savepoints import read_savepoint
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.keygroups import spark_key_group
from microcheckpoint.state.kinds import LATE_KEY
from microcheckpoint.state.offline import table_of
from microcheckpoint.state.reader import keyed_table_of, state_dataframe
from microcheckpoint.storage import FileStore
from tests.integration import evolution_pipeline as evo
from tests.integration.cli_support import REPO, cli
from tests.integration.test_state_evolution import T0, epoch, write_files

pytestmark = pytest.mark.integration

NAME = "evolving"  # the name test_state_evolution.epoch configures
T = [int((T0 + 60 * e) * 1000) for e in range(3)]  # each epoch's trigger (processing) time


def entry(value, ttl_ts: int) -> dict:
    return {"value": value, "ttl_ts": ttl_ts}


EXPORTED = [
    {
        "key": '"a"',
        "state": {
            "count": entry(3, T[1]),
            "recent": [entry(100, T[0]), entry(101, T[0]), entry(120, T[1])],
            "last": entry({"ts": 120}, T[1]),
            "seen": [{"key": 0, **entry(120, T[1])}, {"key": 1, **entry(100, T[0])},
                     {"key": 2, **entry(101, T[0])}],
            "top": entry(120, T[1]),
            "mean": {"accumulator": [321, 3], "ttl_ts": T[1]},
        },
        "timers": [[151, "event"], [170, "event"]],
    },
    {
        "key": '"b"',
        "state": {
            "count": entry(2, T[1]),
            "recent": [entry(103, T[0]), entry(104, T[1])],
            "last": entry({"ts": 104}, T[1]),
            "seen": [{"key": 1, **entry(103, T[0])}, {"key": 2, **entry(104, T[1])}],
            "top": entry(104, T[1]),
            "mean": {"accumulator": [207, 2], "ttl_ts": T[1]},
        },
        "timers": [[153, "event"], [154, "event"]],
    },
]  # fmt: skip
FIRED = [
    (151, "a", 4, json.dumps({"ts": 301})),
    (153, "b", 2, json.dumps({"ts": 104})),
    (154, "b", 2, json.dumps({"ts": 104})),
    (170, "a", 4, json.dumps({"ts": 301})),
]


def rows(path: Path) -> list[dict]:
    return [
        {**r, "state": json.loads(r["state"]), "timers": json.loads(r["timers"])}
        for r in pq.read_table(path).to_pylist()
    ]


def test_every_kind_and_the_timers_export_import_and_fire_the_same(spark, tmp_path) -> None:
    write_files(tmp_path / "in")
    store = FileStore((tmp_path / "chk").as_uri())
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MICROCHECKPOINT_STORAGE": store.url,
        "MICROCHECKPOINT_PIPELINE": NAME,
        "EVOLUTION_INPUT": str(tmp_path / "in"),
    }
    v1 = evo.pipeline("v1", NAME, str(tmp_path / "in"))
    assert [epoch(spark, v1, store, e) for e in (0, 1)] == [[], []]

    # Export: per key its states decoded per kind, ttl timestamps, timers; c@90 was late.
    path = tmp_path / "tally.parquet"
    done = cli(env, "state", "export", "--uid", "tally", "--to", str(path))
    assert done.stdout == f"wrote 2 keys of tally (4 timers) to {path}\n"
    assert rows(path) == EXPORTED
    meta = pq.read_table(path).schema.metadata
    assert json.loads(meta[b"microcheckpoint.descriptors"]) == [
        json.loads(json.dumps(d.schema(), sort_keys=True)) for d in evo.VERSIONS["v1"]
    ]
    late_kg = str(spark_key_group("c", 128))
    assert json.loads(meta[b"microcheckpoint.key_groups"]) == {late_kg: {LATE_KEY: 1}}
    frame = state_dataframe(spark, store, NAME, "tally").orderBy("key").collect()
    assert [r.asDict() for r in frame] == pq.read_table(path).to_pylist()
    # The source's watermarks are a pseudo key too: no key rows, one key-group entry.
    source = tmp_path / "files.parquet"
    assert cli(env, "state", "export", "--uid", "files", "--to", str(source)).stdout == (
        f"wrote 0 keys of files to {source}\n"
    )
    marks = json.loads(pq.read_table(source).schema.metadata[b"microcheckpoint.key_groups"])
    assert list(marks) == ["0"] and list(marks["0"]) == ["\u0000watermarks"]

    # Import, and export the imported savepoint again: equal, metadata included.
    url = cli(env, "state", "import", "--uid", "tally", "--from", str(path)).stdout.strip()
    saved = read_savepoint(store, url.removeprefix(store.url + "/"))
    again = table_of(keyed_table_of(store, saved.metadata, "tally", prefix=saved.prefix))
    first = pq.read_table(path)
    assert again.to_pylist() == first.to_pylist()
    assert again.schema.metadata == first.schema.metadata

    # Restored from the imported savepoint, epoch 2 fires the same timers as a run that
    # never left the engine, and leaves the same state.
    assert cli(env, "restore", url).stdout == f"restored {NAME} from {url}\n"
    assert epoch(spark, v1, store, 2) == FIRED
    reference = FileStore((tmp_path / "ref").as_uri())
    assert [epoch(spark, v1, reference, e) for e in range(3)] == [[], [], FIRED]
    ours = table_of(keyed_table_of(store, _latest(store), "tally"))
    theirs = table_of(keyed_table_of(reference, _latest(reference), "tally"))
    assert ours.to_pylist() == theirs.to_pylist()


def _latest(store):
    view = scan(store, Layout(NAME))
    return view.metadata(view.latest_completed)
