"""Crash stories of Nexmark: kill -9 an epoch while windows are pending, recover, and the
exactly-once sink holds the same output as a failure-free run, epoch by epoch.

Bids (``examples.nexmark_data``, out-of-orderness below the bound) are ``FILES`` Parquet
files, one per epoch. The failure-free reference runs in this process (local Spark); each
story runs ``spark_jobs/run_epoch.py`` jobs (clients of the session's Spark Connect server)
over ``nexmark_crash_pipeline``, with a checkpoint store and a sink of its own:

1. epoch 1 completes: windows are open, their timers pending;
2. the job of epoch 2 is SIGKILLed at the crash point (``harness.faults.crash_env``); the
   latest completed checkpoint holds exactly the reference's pending timers of epoch 1 (of
   epoch 2 when the kill came after its ``_metadata``);
3. jobs without the crash follow until the sink has published every epoch;
4. the sink's rows per epoch equal the reference's (nothing lost, nothing twice), and each
   window's rows equal the ground truth.

q7 and q11 run in one stage; q5 in two, stage 1 (per auction counts, over an internal
topic) is the one killed.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from examples import nexmark_queries as nq
from examples.nexmark_data import NexmarkConfig, NexmarkEvents, generate, write_parquet
from examples.nexmark_truth import q5_hot_items, q7_highest_bid, q11_user_sessions
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.state.reader import read_keyed_table
from microcheckpoint.storage import FileStore
from tests.integration.nexmark_crash_pipeline import BOUND_MS
from tests.integration.test_crash_recovery import killed_by_sigkill, run_epoch_job

pytestmark = pytest.mark.integration

FILES = 3
MODULE = "tests.integration.nexmark_crash_pipeline"
# query -> (window operator holding the timers, the jobs' pipelines, a window's columns)
QUERIES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "q7": ("q7-top", ("q7",), ("window_start",)),
    "q11": ("q11-sessions", ("q11",), ("bidder", "window_start", "window_end")),
    "q5": ("q5-counts", ("q5_a", "q5_b"), ("window_start",)),
}
TRUTH = {"q5": q5_hot_items, "q7": q7_highest_bid, "q11": q11_user_sessions}
# Kills after the state is written: before the global ack (q7), after it (q11) and in a
# staged pipeline (q5); a kill while reading writes no state and is covered by the
# other crash suites (test_crash_recovery.py, test_file_source.py).
STORIES = [("q7", "after_snapshot"), ("q11", "after_metadata"), ("q5", "after_snapshot")]


def _key(row: dict[str, Any]) -> list:
    return sorted(row.items())


def _timers(store: FileStore, name: str, uid: str) -> dict[str, list]:
    return read_keyed_table(store, name, uid).timers


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory) -> dict[str, Any]:
    """The input, and per query the failure-free run: sink rows per epoch, and the timers
    pending after each epoch (q5: its single-stage form, the same operators)."""
    root = tmp_path_factory.mktemp("nexmark-crash")
    events = generate(NexmarkConfig(bids=2_000, gap_ms=50, max_delay_ms=BOUND_MS, seed=5))
    end = max(b["date_time"] for b in events.bids) + 60_000
    bids = [*events.bids, {"auction": -1, "bidder": -1, "price": 0, "date_time": end}]
    url = write_parquet(NexmarkEvents([], [], bids), root / "in", files=FILES)["bids"].as_uri()
    out: dict[str, Any] = {"url": url}
    for query, (uid, _, _) in QUERIES.items():
        sink = (root / f"out-{query}").as_uri()
        pipeline = getattr(nq, query)(url, sink, bound_ms=BOUND_MS)
        store = FileStore((root / f"chk-{query}").as_uri())
        config = CheckpointConfig.from_mapping({"pipeline": pipeline.name, "storage": store.url})
        timers = []
        for _ in range(FILES):
            run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=2)
            timers.append(_timers(store, pipeline.name, uid))
        truth = TRUTH[query](bids)
        out[query] = {
            "epochs": nq.read_epochs(sink, pipeline.name),
            "timers": timers,
            "truth": sorted((r for r in truth if r["window_end"] - 1 <= end - BOUND_MS - 1), key=_key),
        }  # fmt: skip
    return out


@pytest.mark.parametrize(("query", "crash_at"), STORIES)
def test_a_killed_epoch_with_windows_pending_publishes_the_failure_free_output(
    query, crash_at, reference, kafka_bootstrap, spark_connect_url, tmp_path: Path
) -> None:
    uid, jobs, window = QUERIES[query]
    ref = reference[query]
    sink = (tmp_path / "out").as_uri()
    storage = (tmp_path / "chk").as_uri()
    env = {
        "NEXMARK_CRASH_BIDS": reference["url"],
        "NEXMARK_CRASH_SINK": sink,
        "NEXMARK_CRASH_BOOTSTRAP": kafka_bootstrap,
        "NEXMARK_CRASH_TOPIC": f"nexmark-crash-q5-{uuid.uuid4().hex[:6]}",
    }
    logs = tmp_path / "logs"
    logs.mkdir()

    def job(name: str, crash: str | None = None):
        return run_epoch_job(
            logs, kafka_bootstrap, "unused", storage, crash, spark_connect_url,
            pipeline=f"{MODULE}:{name}", config={}, env_extra=env,
        )  # fmt: skip

    # Step 1: epoch 1 of every stage.
    for name in jobs:
        run = job(name)
        assert run.returncode == 0, run.tail()
    first = f"nexmark-{query}" + ("-auctions" if query == "q5" else "")
    last = f"nexmark-{query}" + ("-windows" if query == "q5" else "")
    store = FileStore(storage)
    assert _timers(store, first, uid) == ref["timers"][0] != {}
    # Step 2: the first stage's epoch 2, killed.
    crash = job(jobs[0], crash_at)
    assert killed_by_sigkill(crash), crash.tail()
    done = 1 if crash_at != "after_metadata" else 2
    assert _timers(store, first, uid) == ref["timers"][done - 1]
    # Step 3: recover and run to the end, stage by stage.
    for _ in range(FILES + 1):
        if len(nq.read_epochs(sink, last)) == FILES:
            break
        for name in jobs:
            run = job(name)
            assert run.returncode == 0, run.tail()
    # Step 4: the same output as the failure-free run, and as the ground truth.
    got = nq.read_epochs(sink, last)
    assert {n: sorted(rows, key=_key) for n, rows in got.items()} == {
        n: sorted(rows, key=_key) for n, rows in ref["epochs"].items()
    }
    assert nq.final_rows(got, window) == ref["truth"]
    assert _timers(store, first, uid) == ref["timers"][-1]
