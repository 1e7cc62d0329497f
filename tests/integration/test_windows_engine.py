"""Windows on the real engine (local Spark, a file source with event time, file storage):
every firing of tumbling, sliding and session windows, epoch by epoch, equals a plain-Python
computation from Flink's rules; a restore from a savepoint at another parallelism, taken
with windows pending, gives the same firings as the run without one.

Each epoch reads one Parquet file. The rows come out of order, some behind the watermark
(still accepted by a kept window, or too late), and the last file's row moves the watermark
past every window.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import (
    Aggregator,
    EventTime,
    FileSource,
    Pipeline,
    count_rows,
    session_window,
    sliding_window,
    sum_of,
    tumbling_window,
)
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.protocol import savepoints
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.reader import read_keyed_table
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

BOUND = 20  # the source's max out-of-orderness, ms
KEYS = ["a", "b", "c", "d"]
Row = tuple[str, int, int]  # key, event time, value


@dataclass(frozen=True)
class Kind:
    """A window operator and the rules the plain-Python computation applies."""

    name: str
    size: int = 0
    slide: int = 0
    gap: int = 0
    lateness: int = 0
    side_output: bool = False

    def operator(self) -> Any:
        late = "side_output" if self.side_output else "drop"
        opts = {"allowed_lateness_ms": self.lateness, "late": late}
        if self.name == "tumbling":
            return tumbling_window("w", "k", self.size, sum_of("v"), **opts)
        if self.name == "sliding":
            return sliding_window("w", "k", self.size, self.slide, count_rows(), **opts)
        return session_window("w", "k", self.gap, _count_and_top(), output=SESSION, **opts)

    def result(self, rows: list[tuple]) -> tuple:
        if self.name == "tumbling":
            return (sum(r[2] for r in rows),)
        if self.name == "sliding":
            return (len(rows),)
        return (len(rows), max(r[2] for r in rows))


SESSION = "n long, top long"


def _count_and_top() -> Aggregator:
    return Aggregator(
        lambda: [0, None],
        lambda acc, row: [acc[0] + 1, row["v"] if acc[1] is None else max(acc[1], row["v"])],
        lambda acc: {"n": acc[0], "top": acc[1]},
        lambda a, b: [a[0] + b[0], max(x for x in (a[1], b[1]) if x is not None)],
    )


TUMBLING = Kind("tumbling", size=50, slide=50, lateness=30, side_output=True)
SLIDING = Kind("sliding", size=60, slide=20)
SESSIONS = Kind("session", gap=8, lateness=50, side_output=True)


def _files(folder: Path, epochs: int, seed: int) -> list[list[Row]]:
    """File i: rows around ``100 i`` ms, some up to 120 ms behind; then one row far ahead."""
    rng = random.Random(seed)
    files = []
    for i in range(epochs):
        rows = [
            (rng.choice(KEYS), i * 100 + rng.randrange(100), rng.randrange(1000)) for _ in range(24)
        ]
        rows += [
            (rng.choice(KEYS), i * 100 - rng.randrange(120), rng.randrange(1000)) for _ in range(4)
        ]
        files.append(rows)
    files.append([("z", 100_000, 0)])
    folder.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(files):
        table = pa.table(
            {"k": [r[0] for r in rows], "ts": [r[1] for r in rows], "v": [r[2] for r in rows]}
        )
        pq.write_table(table, folder / f"part-{i:05d}.parquet")
    return files  # fmt: skip


def _fixed_windows(kind: Kind, ts: int) -> list[tuple[int, int]]:
    first = (ts - kind.size) // kind.slide * kind.slide  # a start at or before any window's
    return [(s, s + kind.size) for s in range(first, ts + 1, kind.slide) if s <= ts < s + kind.size]


def _sessions(rows: list[tuple], gap: int) -> list[list[tuple]]:
    """Rows grouped into sessions: sorted by time, a new one after a gap over ``gap``."""
    groups: list[list[tuple]] = []
    for row in sorted(rows, key=lambda r: r[1]):
        if groups and row[1] - groups[-1][-1][1] <= gap:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _expected(kind: Kind, files: list[list[Row]]) -> tuple[list[list[tuple]], list[dict]]:
    """Per epoch, the sorted output rows and the timers pending per key, by Flink's rules: a row joins its windows still kept
    (``end - 1 + lateness`` above the watermark the epoch started with); a window fires when
    the watermark first reaches ``end - 1``, and again in each later epoch a row joins it;
    it is cleared when the watermark reaches ``end - 1 + lateness``."""
    mark: int | None = None
    fixed: dict[tuple[str, int, int], list[tuple]] = {}  # (key, start, end) -> rows
    kept: dict[str, list[tuple]] = {}  # sessions: per key, the rows of sessions not cleared
    out, pending = [], []
    for n, rows in enumerate(files):
        before, epoch, touched = mark, [], set()
        highest = max(t for _, t, _ in rows)
        mark = highest - BOUND - 1 if mark is None else max(mark, highest - BOUND - 1)
        numbered = [(*row, (n, i)) for i, row in enumerate(rows)]  # (key, ts, v, identity)
        on_time = [r for r in numbered if before is None or r[1] > before]
        late = [r for r in numbered if before is not None and r[1] <= before]
        for row in on_time + late:  # the engine: each key's on-time rows, then its late ones
            key, ts = row[0], row[1]
            if kind.name == "session":
                near = any(abs(ts - r[1]) <= kind.gap for r in kept.get(key, []))
                taken = near or before is None or ts + kind.gap - 1 + kind.lateness > before
                if taken:
                    kept.setdefault(key, []).append(row)
            else:
                windows = [
                    (key, start, end)
                    for start, end in _fixed_windows(kind, ts)
                    if before is None or end - 1 + kind.lateness > before
                ]
                for w in windows:
                    fixed.setdefault(w, []).append(row)
                taken = bool(windows)
            if taken:
                touched.add(row[3])
            elif kind.side_output:
                epoch.append((key, None, None, *kind.result([row])))
        if kind.name == "session":
            windows = {
                (key, g[0][1], g[-1][1] + kind.gap): g
                for key, key_rows in kept.items()
                for g in _sessions(key_rows, kind.gap)
            }
        else:
            windows = fixed
        for (key, start, end), members in windows.items():
            again = any(r[3] in touched for r in members)
            if end - 1 <= mark and (before is None or end - 1 > before or again):
                epoch.append((key, start, end, *kind.result(members)))
        for key, start, end in list(windows):
            if end - 1 + kind.lateness <= mark:
                del windows[(key, start, end)]
        timers: dict[str, set[int]] = {}
        for key, _, end in windows:  # what has not fired yet
            due = {t for t in (end - 1, end - 1 + kind.lateness) if t > mark}
            timers.setdefault(json.dumps(key), set()).update(due)
        pending.append({k: sorted(ts) for k, ts in timers.items()})
        if kind.name == "session":
            kept = {}
            for (key, _, _), members in sorted(windows.items()):
                kept.setdefault(key, []).extend(members)
        out.append(sorted(epoch, key=repr))
    return out, pending


def _pipeline(name: str, folder: Path, kind: Kind) -> Pipeline:
    source = FileSource(
        "files", folder.as_uri(), max_files_per_epoch=1, event_time=EventTime("ts", BOUND)
    )
    return Pipeline(name, source).then(kind.operator())


def _run(spark, pipeline: Pipeline, store, parallelism: int) -> list[tuple]:
    config = CheckpointConfig.from_mapping({"pipeline": pipeline.name, "storage": store.url})
    result = run_cycle(
        spark, pipeline, config, store, bootstrap="", parallelism=parallelism, collect=True
    )
    columns = ("key", "window_start", "window_end", "sum", "count", "n", "top")
    return sorted((tuple(r[c] for c in columns if c in r) for r in result.outputs), key=repr)  # fmt: skip


def _timers(store, name: str) -> dict[str, list[int]]:
    """The event-time timers pending per key in the latest completed checkpoint."""
    timers = read_keyed_table(store, name, "w").timers
    assert {d for ts in timers.values() for _, d in ts} <= {"event"}
    return {key: [t for t, _ in ts] for key, ts in timers.items()}


# (firings, too-late rows in the side output, windows fired more than once) of seed 7
SHAPES = {"tumbling": (61, 2, 9), "sliding": (134, 0, 0), "session": (117, 3, 4)}
# timers pending after epoch 3 of seed 11
PENDING = {"tumbling": 12, "session": 16}


def _shape(expected: list[list[tuple]]) -> tuple[int, int, int]:
    rows = [r for epoch in expected for r in epoch]
    fired = Counter(r[:2] for r in rows if r[1] is not None)  # by key and start
    return len(rows), sum(r[1] is None for r in rows), sum(n > 1 for n in fired.values())


@pytest.mark.parametrize("kind", [TUMBLING, SLIDING, SESSIONS], ids=lambda k: k.name)
def test_every_window_fires_as_plain_python_computes(spark, tmp_path, kind) -> None:
    files = _files(tmp_path / "in", 6, seed=7)
    expected, pending = _expected(kind, files)
    store = FileStore((tmp_path / "chk").as_uri())
    pipeline = _pipeline(f"win-{kind.name}", tmp_path / "in", kind)
    got = [_run(spark, pipeline, store, 2) for _ in files]
    assert got == expected
    assert _shape(expected) == SHAPES[kind.name]
    # every window of the four keys fired and was cleared; only the last row's is pending
    assert _timers(store, pipeline.name) == pending[-1]
    assert list(pending[-1]) == ['"z"']


@pytest.mark.parametrize("kind", [TUMBLING, SESSIONS], ids=lambda k: k.name)
def test_a_savepoint_restored_at_parallelism_3_with_windows_pending_fires_the_same(
    spark, tmp_path, kind
) -> None:
    files = _files(tmp_path / "in", 6, seed=11)
    expected, pending = _expected(kind, files)
    store = FileStore((tmp_path / "chk").as_uri())
    name = f"moved-{kind.name}"
    pipeline = _pipeline(name, tmp_path / "in", kind)
    got = [_run(spark, pipeline, store, 2) for _ in range(3)]
    savepoint = savepoints.create_savepoint(store, name)
    assert _timers(store, name) == pending[2]
    assert sum(map(len, pending[2].values())) == PENDING[kind.name]  # at the savepoint
    _run(spark, pipeline, store, 2)  # an epoch the restore abandons
    point = savepoints.choose_restore(store, name, savepoint=savepoint)
    savepoints.restore(store, name, point, savepoints.ClaimMode.NO_CLAIM, parallelism=3)
    got += [_run(spark, pipeline, store, 3) for _ in files[3:]]
    assert got == expected
    view = scan(store, Layout(name))
    acks = view.metadata(view.latest_completed).acks
    assert sorted(t.subtask for t in acks if t.uid.value == "w") == [0, 1, 2]
