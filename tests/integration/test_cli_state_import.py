"""``microcheckpoint state import`` as a person uses it: the installed console script against
the local broker, Spark Connect and checkpoint folders. The imported state must be what the
engine itself would have written: a restore from it, then a run over new input, gives the
imported state folded with the new records, at any parallelism."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples import wordcount
from tests.integration.cli_support import cli, cli_env

pytestmark = pytest.mark.integration

NOTE = "imported {keys} keys of word-counts into {p} subtasks (128 key groups){others}; offsets: {offsets}. Next: microcheckpoint restore {url}\n"
TABLE = "a Parquet file with the string columns key and state (JSON text), as `state export` writes"


def write_table(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def write_counts(path: Path, counts: dict[str, int]) -> Path:
    """A table in the format of ``state export``, built by hand."""
    keys = sorted(counts)
    return write_table(
        path, {"key": [json.dumps(k) for k in keys], "state": [json.dumps(counts[k]) for k in keys]}
    )


def export(env: dict[str, str], path: Path) -> dict[str, int]:
    cli(env, "state", "export", "--uid", "word-counts", "--to", str(path))
    return {json.loads(r["key"]): json.loads(r["state"]) for r in pq.read_table(path).to_pylist()}


def metadata(url: str) -> dict:
    return json.loads((Path(url.removeprefix("file://")) / "_metadata").read_text())


def test_state_import_bootstraps_a_savepoint_that_restores_and_runs_on(
    tmp_path: Path, kafka_bootstrap: str, spark_connect_url: str
) -> None:
    topic = f"import-{uuid.uuid4().hex[:6]}"
    lines = wordcount.lines_for(40, seed=5)
    wordcount.produce(kafka_bootstrap, topic, lines)  # line i: partition i % 2, offset i // 2
    storage = (tmp_path / "chk").as_uri()
    env = cli_env(storage, topic, kafka_bootstrap, spark_connect_url)
    run = ["run", "--module", "examples.wordcount:pipeline", "--config"]
    first = cli(env, *run, '{"max_records_per_epoch": 12}')
    assert first.stdout == "checkpoint 1 completed: 24 records (attempt 1)\n"
    counts = export(env, tmp_path / "counts.parquet")
    assert counts == wordcount.expected(lines[:24])

    # The counts, changed: one raised, one dropped, one new key the input never has.
    changed = {**counts, "to": counts["to"] + 1000, "zebra": 5}
    del changed["question"]
    assert "question" in wordcount.expected(lines[24:])  # so dropping it shows
    table = write_counts(tmp_path / "changed.parquet", changed)

    # Import into the same storage with 3 subtasks: checkpoint 1 gives the offsets and the
    # source's state; the savepoint holds the table's state split into key groups.
    done = cli(
        env, "state", "import", "--uid", "word-counts", "--from", str(table), "--parallelism", "3"
    )
    url = done.stdout.strip()
    assert url.startswith(f"{storage}/wordcount/savepoints/bootstrap-word-counts-")
    assert done.stderr == NOTE.format(
        keys=len(changed),
        p=3,
        others="; lines-source from checkpoint 1",
        offsets="those of checkpoint 1",
        url=url,
    )
    saved = metadata(url)
    assert saved["kind"] == "savepoint" and saved["relative"] is True
    assert saved["offsets"] == {f"{topic}:0": 12, f"{topic}:1": 12}
    assert sorted(saved["tasks"]) == ["lines-source#0", *(f"word-counts#{i}" for i in range(3))]
    groups = [set(saved["tasks"][f"word-counts#{i}"]["handles"][0]["key_groups"]) for i in range(3)]
    assert len(groups) == 3 and not set.intersection(*groups)

    # Restore it and run with the default 2 subtasks over the rest of the input. It lies in
    # the pipeline's storage, so it is restored where it is: no copy.
    before = sorted(p.name for p in Path(url.removeprefix("file://")).parent.iterdir())
    restored = cli(env, "restore", url).stdout
    assert restored == f"restored wordcount from {url}\n"
    assert sorted(p.name for p in Path(url.removeprefix("file://")).parent.iterdir()) == before
    second = cli(env, *run, "{}")
    assert second.stdout == "checkpoint 2 completed: 16 records (attempt 1)\n"
    final = export(env, tmp_path / "final.parquet")
    expected = Counter(changed)
    expected.update(wordcount.expected(lines[24:]))
    assert final == dict(expected)
    assert final["zebra"] == 5 and final["question"] == wordcount.expected(lines[24:])["question"]

    # Bad input: one line naming the thing, the value and the fix; nothing written.
    savepoints = sorted((tmp_path / "chk" / "wordcount" / "savepoints").iterdir())
    missing = tmp_path / "missing.parquet"
    columns = write_table(tmp_path / "columns.parquet", {"word": ["to"], "count": [1]})
    bare = write_table(tmp_path / "bare.parquet", {"key": ["to"], "state": ["1"]})
    importing = ["state", "import", "--uid", "word-counts", "--from"]
    for args, message in [
        (
            [*importing, str(missing)],
            f"config field 'from' = '{missing}' is invalid: {TABLE}; there is no such file",
        ),
        (
            [*importing, str(columns)],
            f"config field 'from' = '{columns}' is invalid: {TABLE}; its columns are word string, count int64",
        ),
        (
            [*importing, str(bare)],
            f"row 1 of {bare}: key 'to' is not JSON (Expecting value: line 1 column 1 (char 0)); write keys as JSON: \"to\" with quotes, as `state export` does",
        ),
        (
            ["state", "import", "--uid", "lines-source", "--from", str(table)],
            "config field 'uid' = 'lines-source' is invalid: a keyed operator uid of 'wordcount' (checkpoint 2): ['word-counts']",
        ),
        (
            [*importing, str(table), "--parallelism", "129"],
            "config field 'parallelism' = 129 is invalid: an integer from 1 to max_parallelism (128); raise max_parallelism only for a new pipeline, since it fixes the key groups of stored state",
        ),
        (
            [*importing, str(table), "--offsets", f"{topic}:0"],
            f"config field 'offsets' = '{topic}:0' is invalid: checkpoint (the latest checkpoint's), startup (the pipeline's startup_mode decides), or TOPIC:PARTITION=OFFSET pairs separated by commas, e.g. lines:0=42,lines:1=40",
        ),
        (
            [*importing, str(table), "--offsets", "other:0=3"],
            f"config field 'offsets' = 'other:0=3' is invalid: partitions of the pipeline's topics ['{topic}'], not ['other:0']",
        ),
    ]:
        failed = cli(env, *args, code=2)
        assert failed.stderr == f"microcheckpoint: {message}\n"
        assert failed.stdout == ""
    assert sorted((tmp_path / "chk" / "wordcount" / "savepoints").iterdir()) == savepoints

    # Round trip into a fresh storage: export -> import -> export is identical. A first
    # import carries no source offsets: the source starts at its startup offsets (here the
    # log end, so the epoch reads nothing).
    fresh = {**env, "MICROCHECKPOINT_STORAGE": (tmp_path / "fresh").as_uri()}
    done = cli(
        fresh, "state", "import", "--uid", "word-counts", "--from", str(tmp_path / "final.parquet")
    )
    url = done.stdout.strip()
    assert done.stderr == NOTE.format(
        keys=len(final),
        p=2,
        others="",
        offsets="none (the source starts at its startup offsets)",
        url=url,
    )
    assert metadata(url)["offsets"] == {}
    assert sorted(metadata(url)["tasks"]) == ["word-counts#0", "word-counts#1"]
    cli(fresh, "restore", url)
    empty = cli(fresh, *run, '{"startup_mode": "latest"}')
    assert empty.stdout == "checkpoint 1 completed: 0 records (attempt 1)\n"
    again = tmp_path / "again.parquet"
    export(fresh, again)
    assert pq.read_table(again).equals(pq.read_table(tmp_path / "final.parquet"))

    # Explicit offsets, into another folder: a restore starts each partition there. The
    # folder must lie under a savepoint root, as for `savepoint --target`.
    elsewhere = (tmp_path / "elsewhere").as_uri()
    given = f"{topic}:0=16,{topic}:1=20"
    refused = cli(fresh, *importing, str(table), "--target", elsewhere, code=2)
    assert "is invalid: a location under one of the configured roots" in refused.stderr
    fresh = {**fresh, "MICROCHECKPOINT_SAVEPOINT_ROOTS": elsewhere}
    done = cli(fresh, *importing, str(table), "--offsets", given, "--target", elsewhere)
    assert done.stdout.startswith(f"{elsewhere}/bootstrap-word-counts-")
    assert metadata(done.stdout.strip())["offsets"] == {f"{topic}:0": 16, f"{topic}:1": 20}
