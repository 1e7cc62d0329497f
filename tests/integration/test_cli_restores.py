"""``microcheckpoint restores``, as a person uses it: the installed console script on a real
word count (Kafka, Spark Connect, a checkpoint folder) restores with another parallelism,
runs, cancels, falls back, runs again, and the restores history shows each step exactly."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from examples import wordcount
from microcheckpoint import formatting
from tests.integration.cli_support import cli, cli_env

pytestmark = pytest.mark.integration

RUN = ["run", "--module", "examples.wordcount:pipeline", "--config"]
SETTINGS = '{"max_records_per_epoch": 12, "retained": 3}'
# What only the clock decides; every other field is compared exactly.
TIMED = ("id", "at_ms", "time_to_first_checkpoint_ms")


def as_json(env: dict[str, str], *args: str) -> dict:
    return json.loads(cli(env, *args, "--json").stdout)


def fixed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMED}


def test_restores_shows_every_restore_rescale_cancel_and_fallback(
    tmp_path: Path, kafka_bootstrap: str, spark_connect_url: str
) -> None:
    topic = f"restores-{uuid.uuid4().hex[:6]}"
    wordcount.produce(kafka_bootstrap, topic, wordcount.lines_for(40, seed=7))
    root = tmp_path / "chk"
    storage = root.as_uri()
    chk = f"{storage}/wordcount/chk-000000000"
    # The user a restore from the command line is recorded as (getpass reads LOGNAME first).
    env = {**cli_env(storage, topic, kafka_bootstrap, spark_connect_url), "LOGNAME": "ada"}
    assert cli(env, *RUN, SETTINGS).stdout == "checkpoint 1 completed: 24 records (attempt 1)\n"
    assert cli(env, *RUN, SETTINGS).stdout == "checkpoint 2 completed: 16 records (attempt 1)\n"

    # A pipeline that was never restored: no rows.
    none = {"restore": 0, "rescale": 0, "fallback": 0, "cancel": 0}
    assert as_json(env, "restores") == {
        "pipeline": "wordcount",
        "restores": [],
        "summary": {"count": 0, "by_kind": none, "time_to_first_checkpoint_ms": None},
    }
    assert cli(env, "restores").stdout.endswith("\nrestores: 0\n")

    # A rescale: checkpoint 1 at 3 subtasks; checkpoint 2 read 16 records past it.
    cli(env, "restore", "1", "--parallelism", "3")
    (rescale,) = as_json(env, "restores")["restores"]
    two = {"lines-source": 1, "word-counts": 2}
    three = {"lines-source": 1, "word-counts": 3}
    expected_rescale = {
        "kind": "rescale",
        "after_id": 2,
        "from": chk + "1",
        "checkpoint_id": 1,
        "point_kind": "checkpoint",
        "claim_mode": "NO_CLAIM",
        "parallelism_before": two,
        "parallelism": 3,
        "records_to_replay": 16,
        "who": "cli:ada",
        "note": "",
        "labels": {"by": "microcheckpoint CLI", "user": "ada"},
        "parallelism_after": None,
        "first_checkpoint": None,
    }
    assert fixed(rescale) == expected_rescale
    assert rescale["time_to_first_checkpoint_ms"] is None
    # The next run is the first checkpoint after it: at 3 subtasks, and its time is known.
    assert cli(env, *RUN, SETTINGS).stdout == "checkpoint 3 completed: 16 records (attempt 1)\n"
    (rescale,) = as_json(env, "restores")["restores"]
    assert fixed(rescale) == {**expected_rescale, "parallelism_after": three, "first_checkpoint": 3}
    third = next(c for c in as_json(env, "list")["checkpoints"] if c["id"] == 3)
    assert rescale["time_to_first_checkpoint_ms"] == third["end_time_ms"] - rescale["at_ms"] > 0

    # A cancel that keeps the checkpoints, then a state file of checkpoint 3 is lost and a
    # restore of latest falls back to checkpoint 2 (at the runner's default parallelism).
    cli(env, "cancel")
    lost = next((root / "wordcount/chk-0000000003/state/word-counts").rglob("*.parquet"))
    lost.unlink()
    fell = cli(env, "restore", "latest")
    assert fell.stdout == f"restored wordcount from {chk}2\n"
    assert "\nnote: FELL BACK to checkpoint 2 because " in fell.stderr, fell.stderr
    assert cli(env, *RUN, SETTINGS).stdout == "checkpoint 4 completed: 0 records (attempt 1)\n"

    got = as_json(env, "restores")
    fallback, cancel, rescale = got["restores"]
    assert fixed(rescale) == {**expected_rescale, "parallelism_after": three, "first_checkpoint": 3}
    assert fixed(cancel) == {
        "kind": "cancel",
        "after_id": 3,
        "from": chk + "3",
        "checkpoint_id": 3,
        "point_kind": "checkpoint",
        "claim_mode": None,
        "parallelism_before": three,
        "parallelism": None,
        "records_to_replay": None,
        "who": "cli:ada",
        "note": "RETAIN_ON_CANCELLATION; aborted: none; deleted 0 objects",
        "labels": {"by": "microcheckpoint CLI", "user": "ada"},
        "parallelism_after": None,
        "first_checkpoint": None,
    }
    assert cancel["time_to_first_checkpoint_ms"] is None
    assert fallback["note"].startswith("FELL BACK to checkpoint 2 because ")
    assert fixed(fallback) == {
        "kind": "fallback",
        "after_id": 3,
        "from": chk + "2",
        "checkpoint_id": 2,
        "point_kind": "checkpoint",
        "claim_mode": "NO_CLAIM",
        "parallelism_before": three,
        "parallelism": None,
        "records_to_replay": 0,  # checkpoints 2 and 3 end at the same offsets
        "who": "cli:ada",
        "note": fallback["note"],
        "labels": {"by": "microcheckpoint CLI", "user": "ada"},
        "parallelism_after": two,
        "first_checkpoint": 4,
    }
    fourth = next(c for c in as_json(env, "list")["checkpoints"] if c["id"] == 4)
    assert fallback["time_to_first_checkpoint_ms"] == fourth["end_time_ms"] - fallback["at_ms"]
    times = sorted(
        [rescale["time_to_first_checkpoint_ms"], fallback["time_to_first_checkpoint_ms"]]
    )
    assert got["summary"] == {
        "count": 3,
        "by_kind": {"restore": 0, "rescale": 1, "fallback": 1, "cancel": 1},
        "time_to_first_checkpoint_ms": {
            "count": 2,
            "p50": times[0],
            "p90": times[1],
            "max": times[1],
        },
    }

    # The table: one line per row, newest first, and the summary.
    table = cli(env, "restores").stdout
    lines = table.splitlines()
    assert lines[0].strip() == f"restores of wordcount ({storage})"
    rows = [line for line in lines if line.startswith("│ 20")]
    assert [r.split("│")[2].strip() for r in rows] == ["fallback", "cancel", "rescale"]
    cells = [c.strip() for c in rows[2].split("│")[1:-1]]
    assert cells[1:] == [
        "rescale",
        "chk-0000000001",
        "NO_CLAIM",
        "lines-source 1, word-counts 2→3",
        "cli:ada",
        "16",
        "3",
        formatting.duration(rescale["time_to_first_checkpoint_ms"]),
    ]
    assert cells[0] == formatting.timestamp(rescale["at_ms"])
    shown = ", ".join(
        f"{q} {formatting.duration(got['summary']['time_to_first_checkpoint_ms'][q])}"
        for q in ("p50", "p90", "max")
    )
    assert lines[-1] == (
        f"restores: 3 (rescale 1, fallback 1, cancel 1); time to the first checkpoint: {shown} "
        "over 2"
    )
