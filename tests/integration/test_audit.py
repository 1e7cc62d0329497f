"""``microcheckpoint audit N`` through the installed console script, on real runs.

One module-scoped world runs three pipelines of tests/integration/audit_pipelines.py over the
same 24 lines in two epochs (16 records, then 8) with ``microcheckpoint run`` against the
local broker and the session's Spark Connect server: the built-in word count, a word count by
a user's function, and that function with a fresh UUID in the state of one word. Each audit
must replay its epoch exactly (key counts from the ground truth), change nothing in storage
or the sink's folder, and flag the one key of the one epoch that is not deterministic.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from examples import wordcount
from microcheckpoint.state.backends import canonical_key
from tests.integration.audit_pipelines import NOISY
from tests.integration.cli_support import cli, cli_env

pytestmark = pytest.mark.integration

MODULE = "tests.integration.audit_pipelines"
RUN_LINE = r"checkpoint (\d+) completed: (\d+) records \(attempt 1\)\n"
PIPELINES = {
    "wordcount_pipeline": "wordcount",
    "counted": "counted",
    "stamped": "stamped",
    "echoed": "echoed",
}
KEYED = {"wordcount_pipeline": "word-counts", "counted": "word-state"}


@dataclass
class World:
    root: Path  # the storage root
    sink: Path  # the file sinks' folder
    env: dict[str, str]
    lines: list[str]  # every line produced, in order

    def env_of(self, attr: str) -> dict[str, str]:
        return {**self.env, "MICROCHECKPOINT_PIPELINE": PIPELINES[attr]}

    def audit(self, attr: str, *args: str, code: int = 0) -> Any:
        done = cli(self.env_of(attr), "audit", *args, "--module", f"{MODULE}:{attr}", code=code)
        return done

    def epoch_lines(self, epoch: int) -> list[str]:
        """Epoch 1 read 8 lines of each of the 2 partitions (lines 0-15, produced round
        robin), epoch 2 the other 8."""
        return self.lines[:16] if epoch == 1 else self.lines[16:]


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, spark_connect_url: str
) -> World:
    base = tmp_path_factory.mktemp("audit")
    topic = f"audit-{uuid.uuid4().hex[:8]}"
    lines = wordcount.generate(kafka_bootstrap, topic, lines=24, seed=11)
    env = {
        **cli_env((base / "chk").as_uri(), topic, kafka_bootstrap, spark_connect_url),
        "AUDIT_TOPIC": topic,
        "AUDIT_SINK": (base / "out").as_uri(),
        "COLUMNS": "1000",
    }
    world = World(base / "chk", base / "out", env, lines)
    for attr in PIPELINES:
        for epoch, (config, records) in enumerate(
            [('{"max_records_per_epoch": 8, "retained": 3}', 16), ('{"retained": 3}', 8)], 1
        ):
            done = cli(
                world.env_of(attr), "run", "--module", f"{MODULE}:{attr}", "--config", config
            )
            assert re.fullmatch(RUN_LINE, done.stdout).groups() == (str(epoch), str(records))
    return world


def _files(*folders: Path) -> dict[str, str]:
    """Every file under ``folders``: path -> SHA-256 of its bytes."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _operators(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["uid"]: o for o in report["operators"]}


# The built-in aggregation from its base, a user's function from no base (``counted`` epoch
# 2 is the text test's).
@pytest.mark.parametrize(("attr", "epoch"), [("wordcount_pipeline", 2), ("counted", 1)])
def test_a_deterministic_epoch_replays_equal_and_changes_nothing(
    world: World, attr: str, epoch: int
) -> None:
    before = _files(world.root, world.sink)
    report = json.loads(world.audit(attr, str(epoch), "--json").stdout)
    assert _files(world.root, world.sink) == before  # nothing published, committed or kept
    assert report["ok"] is True
    assert (report["checkpoint"], report["base"]) == (epoch, None if epoch == 1 else 1)
    assert report["records"] == len(world.epoch_lines(epoch))  # Kafka records: lines
    ops = _operators(report)
    assert set(ops) == {"lines-source", KEYED[attr], "word-totals"}
    assert all(o["differing"] == 0 and o["differences"] == [] for o in ops.values())
    # Every word seen up to this epoch is a key that was compared.
    seen = world.lines[: 16 if epoch == 1 else 24]
    assert ops[KEYED[attr]]["keys"] == len(wordcount.expected(seen))
    assert ops[KEYED[attr]]["compared"] >= 1
    assert (ops["word-totals"]["compared"], ops["word-totals"]["unit"]) == (2, "parts")
    assert (ops["lines-source"]["compared"], ops["lines-source"]["unit"]) == (1, "tasks")


def test_a_function_that_is_not_deterministic_is_flagged_at_its_epoch_and_key(
    world: World,
) -> None:
    """The noisy word is in epoch 1's lines and not in epoch 2's: epoch 1 differs at that
    key, epoch 2 restores its state from checkpoint 1 unchanged and replays equal."""
    touched = {e: NOISY in " ".join(world.epoch_lines(e)).split() for e in (1, 2)}
    assert touched == {1: True, 2: False}, "seed 11 puts the noisy word in epoch 1 only"
    before = _files(world.root, world.sink)
    report = json.loads(world.audit("stamped", "1", "--json", code=1).stdout)
    assert _files(world.root, world.sink) == before
    ops = _operators(report)
    assert report["ok"] is False
    keyed = ops["word-state"]
    assert (keyed["differing"], len(keyed["differences"])) == (1, 1)
    (diff,) = keyed["differences"]
    assert diff["key"] == canonical_key(NOISY)
    assert re.fullmatch(r"kg \d+", diff["where"])
    assert diff["committed"]["seen"] != diff["replayed"]["seen"]
    assert diff["committed"]["n"] == diff["replayed"]["n"]
    # Its outputs (word, count) are deterministic: the sink's parts are equal.
    assert (ops["word-totals"]["differing"], ops["lines-source"]["differing"]) == (0, 0)
    text = world.audit("stamped", "1", code=1).stdout
    assert "DIFFERS" in text and f"key {canonical_key(NOISY)}" in text
    # Epoch 2 did not process the noisy word: nothing differs there.
    report = json.loads(world.audit("stamped", "2", "--json").stdout)
    assert report["ok"] is True and _operators(report)["word-state"]["differing"] == 0


def test_output_that_is_not_deterministic_is_flagged_at_its_sink_part_and_row(
    world: World,
) -> None:
    report = json.loads(world.audit("echoed", "1", "--json", code=1).stdout)
    ops = _operators(report)
    assert ops["word-state"]["differing"] == 0  # the state is right
    sink = ops["word-totals"]
    assert (sink["compared"], sink["differing"]) == (2, 1)
    # The part holding the noisy word has its committed row and the replayed one, once each.
    assert len(sink["differences"]) == 2
    assert len({d["where"] for d in sink["differences"]}) == 1
    assert re.fullmatch(r"word-totals#[01]", sink["differences"][0]["where"])
    assert {(d["committed"], d["replayed"]) for d in sink["differences"]} == {(None, 1), (1, None)}
    rows = [json.loads(d["key"]) for d in sink["differences"]]
    assert {r["word"] for r in rows} == {NOISY}
    assert rows[0]["count"] != rows[1]["count"]


def test_the_text_report_says_deterministic(world: World) -> None:
    text = world.audit("counted", "2").stdout
    assert "audit of epoch 2" in text and text.rstrip().endswith("DETERMINISTIC")
    assert "epoch 2 from checkpoint 1: 8 records" in text


def test_bad_input_is_one_line_and_changes_nothing(world: World) -> None:
    before = _files(world.root, world.sink)
    done = world.audit("counted", "9", code=2)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "no completed checkpoint 9" in done.stderr and "completed: [1, 2]" in done.stderr
    # The module's pipeline is not the one named by --pipeline.
    done = cli(world.env_of("counted"), "audit", "2", "--module", f"{MODULE}:stamped", code=2)
    assert done.stderr.count("\n") == 1 and "stamped" in done.stderr
    assert _files(world.root, world.sink) == before


def test_epochs_that_cannot_be_replayed_are_refused_in_one_line(
    world: World, tmp_path: Path
) -> None:
    """On copies of the storage root: a base retention deleted, an at-least-once epoch, the
    first epoch after a restore. Each is one line, exit 2, and the copy is unchanged."""

    def refused(root: Path, epoch: str, expected: str) -> None:
        env = {**world.env_of("counted"), "MICROCHECKPOINT_STORAGE": root.as_uri()}
        before = _files(root)
        done = cli(env, "audit", epoch, "--module", f"{MODULE}:counted", code=2)
        assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
        assert _files(root) == before

    def copy(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(world.root, root)
        return root

    gone = copy("gone")
    shutil.rmtree(gone / "counted" / "chk-0000000001")
    refused(gone, "2", "continued from checkpoint 1, which retention deleted")
    loose = copy("loose")
    metadata = loose / "counted" / "chk-0000000002" / "_metadata"
    body = json.loads(metadata.read_text())
    body["config"]["mode"] = "AT_LEAST_ONCE"
    metadata.write_text(json.dumps(body))
    refused(loose, "2", "an exactly-once epoch")
    restored = copy("restored")
    env = {**world.env_of("counted"), "MICROCHECKPOINT_STORAGE": restored.as_uri()}
    cli(env, "restore", "1")
    refused(restored, "1", "this one began from a restore")
