"""``microcheckpoint verify`` on every example pipeline, healthy and damaged, through the
installed console script.

One module-scoped world runs the examples with ``microcheckpoint run`` against the local
broker and the session's Spark Connect server (tests/integration/verify_pipelines.py): the
word count with its file sink on the ``table`` and the ``memory`` backend, Nexmark's two
keyed operators, and the two stages of nexmark_stages (the first ends in a stage sink, a
Kafka sink). Every checkpoint and savepoint of them verifies; damaged copies (a truncated,
corrupt or missing state file, a missing or grown sink part, a garbage or empty
``_metadata``) do not, and the output names the damaged file.
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

from examples import nexmark, nexmark_stages, wordcount
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from tests.integration.cli_support import cli, cli_env
from tests.integration.verify_pipelines import NAMES, topics

pytestmark = pytest.mark.integration

MODULE = "tests.integration.verify_pipelines"
RUN_LINE = r"checkpoint (\d+) completed(?: \([a-z]+\))?: (\d+) records \(attempt 1\)\n"
SINK_DETAIL = "staged sink part, {} bytes, sha256 matches (sink output is not parsed)"


@dataclass
class World:
    """The examples' checkpoints and savepoints in one storage root."""

    root: Path  # the storage root folder
    env: dict[str, str]
    savepoints: dict[str, str]  # pipeline attribute -> savepoint URL
    imported: str  # a `state import` savepoint of the word count (table backend)

    def env_of(self, attr: str, storage: Path | None = None) -> dict[str, str]:
        env = {**self.env, "MICROCHECKPOINT_PIPELINE": NAMES[attr]}
        if storage is not None:
            env["MICROCHECKPOINT_STORAGE"] = storage.as_uri()
        return env


def _produce(bootstrap: str, tag: str) -> None:
    names = topics(tag)
    wordcount.generate(bootstrap, names["lines"], lines=24, seed=5)
    nexmark.generate_bids(bootstrap, names["bids"], n=40, seed=5)
    with KafkaOffsets(bootstrap) as kafka:
        for topic in ("auctions", "stage-bids", "joined"):
            kafka.create_topic(names[topic], 2)
    auctions, bids = nexmark_stages.generate(seed=5, auctions=4, bids=30)
    nexmark_stages.produce(bootstrap, names["auctions"], auctions)
    nexmark_stages.produce(bootstrap, names["stage-bids"], bids)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, spark_connect_url: str
) -> World:
    base = tmp_path_factory.mktemp("verify")
    tag = uuid.uuid4().hex[:8]
    _produce(kafka_bootstrap, tag)
    root = base / "chk"
    env = {
        **cli_env(root.as_uri(), topics(tag)["lines"], kafka_bootstrap, spark_connect_url),
        "VERIFY_TAG": tag,
        "VERIFY_SINK": (base / "out").as_uri(),
        "COLUMNS": "1000",
        # The damaged copies of savepoints are made under the pytest temporary root.
        "MICROCHECKPOINT_SAVEPOINT_ROOTS": f"file://{base.parent}",
    }
    world = World(root, env, {}, "")

    def run(attr: str, config: str = '{"retained": 3}') -> tuple[int, int]:
        """One cycle of ``attr``: ``(checkpoint id, records)`` from the line ``run`` prints."""
        done = cli(world.env_of(attr), "run", "--module", f"{MODULE}:{attr}", "--config", config)
        line = re.fullmatch(RUN_LINE, done.stdout)
        assert line, done.stdout
        return int(line.group(1)), int(line.group(2))

    # Two epochs of the word count on `table` (the second references the first's files).
    assert run("wordcount_table", '{"max_records_per_epoch": 8, "retained": 3}') == (1, 16)
    assert run("wordcount_table") == (2, 8)
    assert run("wordcount_memory") == (1, 24)
    assert run("nexmark_table") == (1, 40)
    assert run("join_stage") == (1, 34)
    assert run("hot_items_stage")[0] == 1
    for attr in NAMES:
        world.savepoints[attr] = cli(world.env_of(attr), "savepoint").stdout.strip()
    counts = base / "counts.parquet"
    env = world.env_of("wordcount_table")
    cli(env, "state", "export", "--uid", "word-counts", "--to", str(counts))
    world.imported = cli(env, "state", "import", "--uid", "word-counts", "--from", str(counts))
    world.imported = world.imported.stdout.strip()
    return world


# ---- what the stored _metadata says, read raw ----------------------------------------------


def _metadata_path(root: Path, pipeline: str, point: str) -> tuple[Path, Path]:
    """``(the _metadata file, the folder its handle keys are relative to)`` of ``point``."""
    if point.startswith("file://"):
        folder = Path(point.removeprefix("file://"))
        # A checkpoint's handles are keys under the storage root; a savepoint's, its folder's.
        return folder / "_metadata", root if folder.name.startswith("chk-") else folder
    return root / pipeline / f"chk-{int(point):010d}" / "_metadata", root


def _handles(metadata: Path) -> list[dict[str, Any]]:
    body = json.loads(metadata.read_bytes())
    return [h for task in body["tasks"].values() for h in task["handles"]]


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ---- healthy points ------------------------------------------------------------------------

# (pipeline attribute, checkpoint ids to verify, sink parts expected)
EXAMPLES = [
    ("wordcount_table", ["1", "2"], True),
    ("wordcount_memory", ["1"], True),
    ("nexmark_table", ["1"], False),
    ("join_stage", ["1"], True),
    ("hot_items_stage", ["1"], False),
]


LATEST = {attr: ids[-1] for attr, ids, _ in EXAMPLES}


@pytest.mark.parametrize(("attr", "ids", "sinks"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_every_checkpoint_and_savepoint_of_an_example_verifies(
    world: World, attr: str, ids: list[str], sinks: bool
) -> None:
    env = world.env_of(attr)
    before = _tree(world.root)
    folder = world.root / NAMES[attr] / f"chk-{int(ids[-1]):010d}"
    points = [*ids, "latest", folder.as_uri(), world.savepoints[attr]]
    if attr == "wordcount_table":
        points.append(world.imported)
    for point in points:
        report = json.loads(cli(env, "verify", point, "--json").stdout)
        assert report["ok"] is True, report
        metadata, folder = _metadata_path(
            world.root, NAMES[attr], ids[-1] if point == "latest" else point
        )
        handles = {(folder / h["key"]).as_uri(): h for h in _handles(metadata)}
        rows = {c["check"]: c for c in report["checks"] if c["check"].startswith("file://")}
        assert set(rows) == set(handles), point
        assert all(row["ok"] and "warning" not in row for row in rows.values())
        parts = {url for url in handles if url.endswith(".jsonl")}
        if attr == "wordcount_table" and point == "2":  # incremental: chk-1's deltas too
            assert any("/chk-0000000001/state/" in url for url in handles), handles
        # A `state import` savepoint holds state only, no staged sink output.
        assert bool(parts) is (sinks and point != world.imported), point
        for url, handle in handles.items():
            detail = rows[url]["detail"]
            if url in parts:
                assert detail == SINK_DETAIL.format(handle["size"]), (point, url)
            else:
                prefix = f"state file, {handle['size']} bytes, sha256 matches, "
                assert detail.startswith(prefix), (point, url)
                assert detail.endswith(" rows"), (point, url)
            assert len(handle["sha256"]) == 64, (point, url)  # written with every file
        (head,) = [c for c in report["checks"] if c["check"] == "_metadata"]
        assert head["ok"] is True and head["detail"].startswith(f"{metadata.as_uri()}: ")
        kafka_rows = [c for c in report["checks"] if ":" in c["check"] and "//" not in c["check"]]
        assert kafka_rows and all(c["ok"] for c in kafka_rows), report
        if point == "latest":
            table = cli(env, "verify", point).stdout
            assert table.rstrip().endswith("VERIFIED") and "FAILED" not in table
    backend = {Path(url).name for url in handles if url not in parts}
    assert backend <= (
        {"state.json"} if attr == "wordcount_memory" else {"base.parquet", "delta.parquet"}
    )
    assert _tree(world.root) == before  # verify writes nothing


# ---- damaged copies ------------------------------------------------------------------------


def _state(handles: list[dict[str, Any]]) -> dict[str, Any]:
    return next(h for h in handles if not h["key"].endswith(".jsonl"))


def _sink(handles: list[dict[str, Any]]) -> dict[str, Any]:
    return next(h for h in handles if h["key"].endswith(".jsonl"))


def _flip_one_bit(data: bytes) -> bytes:
    """``data`` with one bit of its middle byte flipped: same size, and for a Parquet file a
    data page's byte, which its reader may well decode without noticing."""
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x04
    return bytes(flipped)


DAMAGES = {
    # name: (which file, what is done to its bytes; None deletes it, and the detail expected)
    "truncated state file": (_state, lambda data: data[: len(data) // 2], "bytes, its checkpoint"),
    "corrupt state file": (_state, lambda data: b"\x07" * len(data), "has sha256"),
    "one bit flipped in a state file": (_state, _flip_one_bit, "has sha256"),
    "missing state file": (_state, None, "is missing"),
    "missing sink part": (_sink, None, "is missing"),
    "grown sink part": (_sink, lambda data: data + b'{"extra": 1}\n', "bytes, its checkpoint"),
    "one bit flipped in a sink part": (_sink, _flip_one_bit, "has sha256"),
}
METADATA_DAMAGES = {"garbage _metadata": b"\x00not json at all{", "empty _metadata": b""}


def _copy(world: World, attr: str, kind: str, tmp_path: Path) -> tuple[dict[str, str], str, Path]:
    """A copy of the pipeline's latest checkpoint (the whole storage root) or of its
    savepoint: ``(env, point, the copied _metadata)``."""
    if kind == "checkpoint":
        root = tmp_path / "chk"
        shutil.copytree(world.root, root)
        cid = LATEST[attr]
        return world.env_of(attr, root), cid, root / NAMES[attr] / f"chk-{int(cid):010d}/_metadata"
    source = Path(world.savepoints[attr].removeprefix("file://"))
    folder = tmp_path / "copies" / source.name
    shutil.copytree(source, folder)
    return world.env_of(attr), folder.as_uri(), folder / "_metadata"


def _not_restorable(env: dict[str, str], point: str, url: str, table: bool) -> dict[str, Any]:
    """``verify --json`` (and, with ``table``, the table) of a damaged point, naming ``url``."""
    report = json.loads(cli(env, "verify", point, "--json", code=1).stdout)
    assert report["ok"] is False and url in json.dumps(report), report
    if table:
        text = cli(env, "verify", point, code=1).stdout
        assert text.rstrip().endswith("NOT RESTORABLE") and url in text, text
    return report


# Both backends, both kinds of point: the table backend's checkpoint, the memory one's savepoint.
COPIES = [("wordcount_table", "checkpoint"), ("wordcount_memory", "savepoint")]


@pytest.mark.parametrize(("attr", "kind"), COPIES, ids=[f"{a}-{k}" for a, k in COPIES])
def test_a_damaged_copy_is_not_restorable_and_names_the_file(
    world: World, attr: str, kind: str, tmp_path: Path
) -> None:
    for n, (name, (pick, damage, why)) in enumerate(DAMAGES.items()):
        env, point, metadata = _copy(world, attr, kind, tmp_path / str(n))
        folder = metadata.parent if kind == "savepoint" else tmp_path / str(n) / "chk"
        handle = pick(_handles(metadata))
        path = folder / handle["key"]
        if damage is None:
            path.unlink()
        else:
            path.write_bytes(damage(path.read_bytes()))
        report = _not_restorable(env, point, path.as_uri(), table=n == 0)
        failed = [c for c in report["checks"] if not c["ok"]]
        assert [c["check"] for c in failed] == [path.as_uri()], (name, report)
        assert why in failed[0]["detail"], (name, failed[0])
    for n, (name, data) in enumerate(METADATA_DAMAGES.items(), start=len(DAMAGES)):
        env, point, metadata = _copy(world, attr, kind, tmp_path / str(n))
        metadata.write_bytes(data)
        report = _not_restorable(env, point, metadata.as_uri(), table=n == len(DAMAGES))
        (row,) = report["checks"]
        assert row["check"] == "_metadata" and row["ok"] is False, (name, report)
        assert row["detail"].startswith(f"{metadata.as_uri()} is corrupt (not JSON: "), name


def test_latest_falls_back_past_a_corrupt_metadata_with_a_warning(
    world: World, tmp_path: Path
) -> None:
    env, _, _ = _copy(world, "wordcount_table", "checkpoint", tmp_path)
    newest = tmp_path / "chk" / "wordcount" / "chk-0000000002" / "_metadata"
    newest.write_bytes(b"")
    report = json.loads(cli(env, "verify", "latest", "--json").stdout)
    assert report["ok"] is True
    assert report["point"] == (tmp_path / "chk" / "wordcount" / "chk-0000000001").as_uri()
    (warning,) = [c for c in report["checks"] if c.get("warning") and c["check"] == "latest"]
    assert warning["detail"].startswith(
        f"FELL BACK to checkpoint 1 because checkpoint 2: {newest.as_uri()} is corrupt"
    )


# ---- the lineage: verify --from --to -----------------------------------------------------


def _chain(env: dict[str, str], first: int, last: int, code: int = 0) -> dict[str, Any]:
    args = ("verify", "--from", str(first), "--to", str(last))
    report = json.loads(cli(env, *args, "--json", code=code).stdout)
    text = cli(env, *args, code=code).stdout
    print(f"\n$ microcheckpoint {' '.join(args)}\n{text}")
    assert text.rstrip().endswith("CHAIN VERIFIED" if code == 0 else "CHAIN BROKEN"), text
    return report


def test_the_lineage_of_a_real_run_verifies(world: World) -> None:
    env = world.env_of("wordcount_table")
    folder = world.root / NAMES["wordcount_table"]
    first = (folder / "chk-0000000001" / "_metadata").read_bytes()
    second = json.loads((folder / "chk-0000000002" / "_metadata").read_bytes())
    # Checkpoint 2 recorded the bytes of the _metadata it continued from.
    assert second["base"] == 1
    assert second["previous_sha256"] == hashlib.sha256(first).hexdigest()
    before = _tree(world.root)
    report = _chain(env, 1, 2)
    assert report["ok"] is True and report["chain"] == [1, 2], report
    rows = {c["check"]: c for c in report["checks"]}
    assert (
        rows["chk-1"]["detail"].startswith("one writer (")
        and "16 records" in rows["chk-1"]["detail"]
    )
    assert (
        rows["chk-2"]["detail"].startswith("one writer (")
        and "8 records" in rows["chk-2"]["detail"]
    )
    link = rows["chk-1 -> chk-2"]
    assert link["ok"] and "warning" not in link, link
    assert link["detail"] == "sha256 of its _metadata matches; offsets continue on 2 partitions"
    files = {url for m in (first, json.dumps(second).encode()) for url in _urls(world.root, m)}
    assert {c for c in rows if c.startswith("file://")} == files  # each file once
    assert _tree(world.root) == before  # writes nothing
    # Bad ranges are bad input (exit 2), named.
    bad = cli(env, "verify", "--from", "3", "--to", "2", code=2)
    assert "--from 3 is after --to 2" in bad.stderr
    both = cli(env, "verify", "latest", "--from", "1", "--to", "2", code=2)
    assert "give either POINT, or --from and --to" in both.stderr


def _urls(root: Path, metadata: bytes) -> set[str]:
    body = json.loads(metadata)
    return {(root / h["key"]).as_uri() for t in body["tasks"].values() for h in t["handles"]}


def _zombie(data: bytes) -> bytes:
    """A _metadata as a zombie completer of the same checkpoint would have written it:
    the same content under another writer, put over the first (what put-if-absent stops;
    here written by hand, as a store without it would let it through)."""
    body = json.loads(data)
    body["writer"] = "0" * 32
    return json.dumps(body, indent=1, sort_keys=True).encode()


def _gap(data: bytes) -> bytes:
    """The _metadata with partition 0's range starting two offsets later: the offsets
    between the two checkpoints are in neither (as if a range were cut out)."""
    body = json.loads(data)
    name = sorted(body["barrier"])[0]
    body["barrier"][name][0] += 2
    return json.dumps(body, indent=1, sort_keys=True).encode()


CHAIN_DAMAGES = {
    # name: (checkpoint, the file: "state" or "_metadata", the damage, the rows that fail)
    "one bit flipped in a state file": (1, "state", _flip_one_bit, ["<file>"]),
    "a truncated state file": (1, "state", lambda d: d[: len(d) // 2], ["<file>"]),
    "an offsets range cut out": (2, "_metadata", _gap, ["chk-1 -> chk-2"]),
    "a zombie's _metadata replayed": (1, "_metadata", _zombie, ["chk-1", "chk-1 -> chk-2"]),
}


@pytest.mark.parametrize("name", list(CHAIN_DAMAGES))
def test_the_lineage_detects_and_locates_each_damage(
    world: World, name: str, tmp_path: Path
) -> None:
    cid, which, damage, expected = CHAIN_DAMAGES[name]
    root = tmp_path / "chk"
    shutil.copytree(world.root, root)
    env = world.env_of("wordcount_table", root)
    metadata = root / NAMES["wordcount_table"] / f"chk-{cid:010d}" / "_metadata"
    if which == "state":
        own = f"/chk-{cid:010d}/state/"
        path = root / next(h["key"] for h in _handles(metadata) if own in "/" + h["key"])
    else:
        path = metadata
    path.write_bytes(damage(path.read_bytes()))
    report = _chain(env, 1, 2, code=1)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert [c["check"] for c in failed] == [
        path.as_uri() if e == "<file>" else e for e in expected
    ], (name, report)
    details = " ".join(c["detail"] for c in failed)
    print(f"\nCHAIN {name}: " + json.dumps(failed, indent=1))
    if name == "an offsets range cut out":
        assert re.search(
            r"partition \S+:0: checkpoint 1 ended at \d+, checkpoint 2 starts", details
        )
        assert "(a gap: offsets in no checkpoint)" in details
    if name == "a zombie's _metadata replayed":
        assert "was written by writer 00000000, but the COMPLETED claim by" in details
        assert f"{metadata.as_uri()} has sha256" in details and "continued from" in details


# ---- loads check the content hash too ------------------------------------------------------


def test_a_flipped_bit_fails_the_state_reader_and_the_next_epoch_naming_the_file(
    world: World, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The same check as verify's, where state is loaded: ``state export`` (the state
    reader) and the next epoch's restore of the keyed state, through the console script.
    Runs last in this module: it adds lines to the word count's topic."""
    root = tmp_path / "chk"
    shutil.copytree(world.root, root)
    env = world.env_of("wordcount_table", root)
    metadata = root / NAMES["wordcount_table"] / "chk-0000000002" / "_metadata"
    state = [h for h in _handles(metadata) if not h["key"].endswith(".jsonl")]
    damaged = [root / h["key"] for h in state]
    for path in damaged:  # every state file the checkpoint references: any load meets one
        path.write_bytes(_flip_one_bit(path.read_bytes()))
    urls = [p.as_uri() for p in damaged]

    export = cli(
        env, "state", "export", "--uid", "word-counts", "--to", str(tmp_path / "x.pq"), code=1
    )
    assert any(url in export.stderr for url in urls) and "has sha256" in export.stderr, export
    assert not (tmp_path / "x.pq").exists()

    wordcount.generate(kafka_bootstrap, topics(world.env["VERIFY_TAG"])["lines"], lines=8, seed=9)
    before = _tree(root / NAMES["wordcount_table"])
    run = cli(env, "run", "--module", f"{MODULE}:wordcount_table", code=1)
    assert "checkpoint failed" in run.stderr and "has sha256" in run.stderr, run
    # One file named: checkpoint 2's own, or checkpoint 1's delta it references (incremental).
    named = [url for url in urls if url in run.stderr]
    assert len(named) == 1 and "/state/word-counts/" in named[0], run.stderr
    # Nothing of checkpoint 2 changed, and no checkpoint completed on the damaged state.
    after = _tree(root / NAMES["wordcount_table"])
    assert {k: v for k, v in after.items() if k.startswith("chk-0000000002/")} == {
        k: v for k, v in before.items() if k.startswith("chk-0000000002/")
    }
    assert not any(k.startswith("chk-0000000003/_metadata") for k in after)
