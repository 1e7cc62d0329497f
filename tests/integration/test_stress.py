"""Randomized stress: a seeded random list of produce / cycle / kill -9 at a random moment /
savepoint / restore (and rescale) steps, checked against a model after every step.

Every cycle is ``spark_jobs/run_epoch.py`` over ``stress_pipeline`` (the crash tests'
sequence checker, plus a file sink), a client of the session's Spark Connect server, run
by the crash tests' ``run_epoch_job``. A kill SIGKILLs the job's whole process session
at a random moment of the window in which a cycle works (from just before its first
write to its exit, the shortest measured on clean cycles): while it triggers, reads, snapshots,
acks, completes or notifies, wherever that lands; the server may still finish the killed
client's Spark tasks (their acks carry the killed attempt). The model is the list of
records produced with their offsets. After every step:

- every checkpoint completed since the last step holds exactly the fold of the input
  below its ``_metadata`` offsets (``expected_state``: per-key seqs with no gap and no
  repeat), and starts where the checkpoint before it ended or where a restore put it;
  after a restore, it has the restored parallelism;
- no ``_metadata`` is ever rewritten, and the latest completed id only grows (``History``);
- the sink's committed output is exactly the records of the published epochs' barrier
  ranges (nothing lost, nothing twice), and only completed checkpoints are published;
- the group offsets equal the latest ``_metadata`` offsets after a cycle, and after a
  kill either stayed or moved to them; after a cycle nothing is pending or unnotified.

At the end the pipeline drains, and every key's state is ``last == count == M``.

``make stress SEEDS="1 2 3" STEPS=40`` runs more seeds (``STRESS_SEEDS``,
``STRESS_STEPS``); each failure names its seed and step list, and ``STRESS_REPORT`` collects
the numbers (``python -m harness.stress``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from harness.stress import Kind, Step, Tally, pick, plan_steps
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stores import open_store
from microcheckpoint.ids import CheckpointId, TopicPartition
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import ClaimMode
from microcheckpoint.protocol.recovery import parallelism
from microcheckpoint.protocol.savepoints import (
    choose_restore,
    create_savepoint,
    list_savepoints,
    restore,
)
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.stress_pipeline import SINK
from tests.integration.test_crash_recovery import (
    KEYS,
    OPERATOR,
    PARTITIONS,
    PIPELINE,
    History,
    Produced,
    committed,
    expected_state,
    killed_by_sigkill,
    produce_sequences,
    run_epoch_job,
)

pytestmark = pytest.mark.integration

QUICK_SEED, QUICK_STEPS = 27, 6  # for `make test`: 2 kills, a restore with rescale, a savepoint
SEEDS = [int(s) for s in os.environ.get("STRESS_SEEDS", "").split()] or [QUICK_SEED]
STEPS = int(os.environ.get("STRESS_STEPS") or QUICK_STEPS)
CONFIG = {"max_records_per_epoch": 12, "retained": 3}
DEFAULT_PARALLELISM = 2
PIPELINE_SPEC = "tests.integration.stress_pipeline:pipeline"
WINDOW_LEAD_S = 0.5  # a kill may also land this long before a cycle's first write


class Stress:
    """One pipeline over a fresh topic, checkpoint store and sink folder, and its model."""

    def __init__(self, seed: int, bootstrap: str, connect: str, kafka: KafkaOffsets, tmp: Path):
        self.bootstrap, self.connect, self.kafka = bootstrap, connect, kafka
        self.topic = f"stress-{seed}-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(self.topic, PARTITIONS)
        self.tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        self.storage = (tmp / "checkpoints").as_uri()  # a file store: its files have mtimes
        self.sink = (tmp / "sink").as_uri()
        self.store = open_store(self.storage)
        self.history = History(self.store)
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.produced: list[Produced] = []
        self.tally = Tally(seed, 0)
        self.root = tmp / "checkpoints"
        self.windows: list[tuple[float, float]] = []  # clean cycles: (start to work, work)
        self.checked: set[CheckpointId] = set()
        # Where a checkpoint may start besides where the one before it ended: at the
        # beginning, and where each restore put the pipeline.
        self.starts_allowed: list[dict[TopicPartition, int]] = [dict.fromkeys(self.tps, 0)]
        self.group: dict[TopicPartition, int | None] = dict.fromkeys(self.tps)
        self.after_kill = False
        self.restart_at: float | None = None  # the start of the first job after a kill

    # -- the steps --------------------------------------------------------------------

    def produce(self, seqs: int) -> None:
        first = len(self.produced) // len(KEYS) + 1
        self.produced += produce_sequences(self.bootstrap, self.topic, range(first, first + seqs))
        self.tally.records = len(self.produced)

    def job(self, kill_after_s: float | None = None):
        started = time.time()
        if self.after_kill:
            self.after_kill, self.restart_at = False, started
        run = run_epoch_job(
            self.logs, self.bootstrap, self.topic, self.storage, remote=self.connect,
            pipeline=PIPELINE_SPEC, config=CONFIG, env_extra={"STRESS_SINK": self.sink},
            kill_after_s=kill_after_s,
        )  # fmt: skip
        assert not run.leftovers, run.leftovers
        return run, started

    def cycle(self) -> None:
        run, started = self.job()
        assert run.returncode == 0, run.tail()
        ended = time.time()
        report = json.loads(run.out.strip().splitlines()[-1])
        # The window in which the cycle wrote to storage: from its trigger or re-run (the
        # checkpoint's _pending or _attempt file written by this job) to its exit.
        chk = self.root / Layout(PIPELINE).chk(CheckpointId(report["checkpoint"]))
        writes = [f.stat().st_mtime for f in chk.glob("_*") if f.stat().st_mtime >= started]
        first = min(writes, default=started) - WINDOW_LEAD_S
        self.windows.append((max(first - started, 0.0), ended - max(first, started)))
        self.finished(run)

    def finished(self, run) -> None:
        """A job that ran to its end: one checkpoint completed (recovery time if after a kill)."""
        self.tally.cycles += 1
        report = json.loads(run.out.strip().splitlines()[-1])
        meta = self.history.observe().metadata(CheckpointId(report["checkpoint"]))
        if self.restart_at is not None:
            self.tally.recovery_s.append(round(meta.completed_time_ms / 1000 - self.restart_at, 2))
            self.restart_at = None
        self.check(after_kill=False)

    def kill(self, at: float) -> None:
        # A moment of the fastest measured window: the kill lands inside the cycle's work.
        lead = min(w[0] for w in self.windows)
        delay = lead + at * min(w[1] for w in self.windows)
        before = self.history.observe()
        run, _ = self.job(kill_after_s=delay)
        if run.returncode == 0:  # it finished before the kill came: a cycle
            self.tally.kills_landed["after the job ended"] += 1
            self.finished(run)
            return
        assert killed_by_sigkill(run), run.tail()
        self.tally.kills += 1
        self.after_kill, self.restart_at = True, None
        view = self.history.observe()
        if view.pending:
            record = view.records[view.pending[0]]
            acks = len(view.acks(view.pending[0], record.attempt))
            landed = f"pending ({acks}/{len(view.expected_tasks(view.pending[0]))} acks)"
        elif view.ids(CheckpointStatus.COMPLETING):
            landed = "completing"
        elif view.completed != before.completed:
            notified = view.records[view.completed[-1]].notified
            landed = "completed, notified" if notified else "completed, not notified"
        else:
            landed = "before a trigger"
        self.tally.kills_landed[landed] += 1
        self.check(after_kill=True)

    def savepoint(self) -> None:
        if self.history.observe().latest_completed is None:
            return
        create_savepoint(self.store, PIPELINE)
        self.tally.savepoints += 1

    def restore(self, at: float, p: int) -> None:
        view = self.history.observe()
        points = [("checkpoint", cid) for cid in view.completed]
        points += [("savepoint", prefix) for prefix in list_savepoints(self.store, PIPELINE)]
        if not points:
            return
        kind, which = pick(points, at)
        if kind == "checkpoint":
            point = choose_restore(self.store, PIPELINE, checkpoint=which)
            # The restored state is the fold of the input below the restored offsets.
            restored = read_keyed_state(self.store, PIPELINE, OPERATOR, which)
            assert restored == expected_state(self.produced, point.metadata.offsets, self.topic)
        else:
            point = choose_restore(self.store, PIPELINE, savepoint=(self.store, which))
        assert point is not None and not point.note, point
        if p != parallelism(view, DEFAULT_PARALLELISM):
            self.tally.rescales += 1
        restore(self.store, PIPELINE, point, ClaimMode.NO_CLAIM, parallelism=p)
        self.starts_allowed.append(dict(point.metadata.offsets))
        self.tally.restores += 1

    def drain(self) -> None:
        """Cycles until every record is in a notified checkpoint; then every key is 1..M."""
        ends = self.kafka.end_offsets(self.tps)
        for _ in range(len(self.produced) // (CONFIG["max_records_per_epoch"] * PARTITIONS) + 3):
            view = self.history.observe()
            latest = view.latest_completed
            if not view.pending and view.metadata(latest).offsets == ends:
                break
            self.cycle()
        m = len(self.produced) // len(KEYS)
        state = read_keyed_state(self.store, PIPELINE, OPERATOR)
        assert state == {key: {"last": m, "count": m, "bad": 0} for key in KEYS}

    # -- the model's checks -----------------------------------------------------------

    def check(self, after_kill: bool) -> None:
        view = self.history.observe()
        marker = view.restore_marker
        moved_to = []  # offsets a kill may have left committed: of checkpoints completed now
        # Every checkpoint completed since the last check: exact state, a continuous chain.
        for cid in sorted(set(view.completed) - self.checked):
            meta = view.metadata(cid)
            state = read_keyed_state(self.store, PIPELINE, OPERATOR, cid)
            want = expected_state(self.produced, meta.offsets, self.topic)
            self.count_differences(state, want)
            assert state == want, f"checkpoint {cid}: state is not the fold of its input"
            lower = [c for c in self.history.seen if c < cid]
            chain = [self.metadata_of(max(lower)).offsets] if lower else []
            assert meta.barrier.starts in chain + self.starts_allowed, (
                f"checkpoint {cid} starts at {meta.barrier.starts}: neither where the one "
                f"before it ended nor where a restore put it"
            )
            if marker is not None and marker.parallelism and cid.value > marker.after_id:
                subtasks = [t for t in meta.acks if t.uid.value == OPERATOR]
                assert len(subtasks) == marker.parallelism, (cid, subtasks)
            self.checked.add(cid)
            self.tally.epochs += 1
            moved_to.append(meta.offsets)
        # The sink: exactly the records of the published epochs' ranges.
        published = self.published_epochs()
        assert published <= {c.value for c in self.history.seen}, published
        want_rows: Counter[tuple[str, int]] = Counter()
        for epoch in published:
            want_rows.update(self.records_in(self.metadata_of(CheckpointId(epoch))))
        got_rows = Counter((r["k"], r["seq"]) for r in read_committed(self.sink, PIPELINE, SINK))
        self.tally.lost = max(self.tally.lost, sum((want_rows - got_rows).values()))
        self.tally.duplicated = max(self.tally.duplicated, sum((got_rows - want_rows).values()))
        assert got_rows == want_rows, "the sink's output is not the published epochs' records"
        # Group offsets: the latest _metadata's after a cycle; after a kill, moved there or not.
        group = committed(self.kafka, self.tps)
        latest = view.metadata(view.latest_completed).offsets if view.completed else None
        if after_kill:
            assert group in [self.group, latest, *moved_to], (group, self.group, latest)
        else:
            assert group == latest, (group, latest)
            assert not view.pending and all(view.records[c].notified for c in view.completed)
            # Every completed epoch with records is published (an empty one has no output).
            with_records = {c.value for c, m in self.chain().items() if m.barrier.record_count}
            assert with_records <= published, (with_records, published)
        self.group = group

    def chain(self) -> dict:
        """Every ``_metadata`` seen, by id (retention drops them from storage, not from here)."""
        return {m.checkpoint_id: m for m in self.history.chain()}

    def metadata_of(self, cid: CheckpointId):
        return self.chain()[cid]

    def records_in(self, meta) -> Counter[tuple[str, int]]:
        ranges = meta.barrier.ranges
        return Counter(
            (r.key, r.seq)
            for r in self.produced
            if ranges[TopicPartition(self.topic, r.partition)].start
            <= r.offset
            < ranges[TopicPartition(self.topic, r.partition)].end
        )

    def published_epochs(self) -> set[int]:
        store = open_store(self.sink)
        names = store.list(f"{PIPELINE}/{SINK}/_manifests/")
        return {int(Path(k).stem.removeprefix("epoch-")) for k in names}

    def count_differences(self, state: dict, want: dict) -> None:
        for key in set(state) | set(want):
            got, exp = state.get(key, {}).get("count", 0), want.get(key, {}).get("count", 0)
            self.tally.lost += max(0, exp - got)
            self.tally.duplicated += max(0, got - exp)


def run_steps(stress: Stress, steps: list[Step]) -> None:
    # The prologue: input, and two cycles (one with records, one without) to measure the
    # window a kill is drawn from.
    stress.produce(2)
    stress.cycle()
    stress.cycle()
    for step in steps:
        if step.kind is Kind.PRODUCE:
            stress.produce(step.seqs)
        elif step.kind is Kind.CYCLE:
            stress.cycle()
        elif step.kind is Kind.KILL:
            stress.kill(step.at)
        elif step.kind is Kind.SAVEPOINT:
            stress.savepoint()
        else:
            stress.restore(step.at, step.parallelism)
        stress.tally.steps += 1
    stress.drain()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_steps_keep_exactly_once(
    seed: int,
    kafka_bootstrap: str,
    spark_connect_url: str,
    tmp_path: Path,
) -> None:
    steps = plan_steps(seed, STEPS)
    replay = f"seed {seed}, {STEPS} steps: {', '.join(map(str, steps))}"
    print(replay)
    began = time.monotonic()
    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as kafka:
        stress = Stress(seed, kafka_bootstrap, spark_connect_url, kafka, tmp_path)
        try:
            run_steps(stress, steps)
        except AssertionError as exc:
            stress.tally.violations += 1
            done = stress.tally.steps
            where = str(steps[done]) if done < len(steps) else "the final drain"
            raise AssertionError(
                f"stress {replay}\nfailed at step {done + 1} ({where}); replay: "
                f"make stress SEEDS={seed} STEPS={STEPS}\n{exc}"
            ) from exc
        finally:
            stress.tally.seconds = round(time.monotonic() - began, 1)
            print(stress.tally.to_json())
            report = os.environ.get("STRESS_REPORT")
            if report:
                with open(report, "a") as out:
                    out.write(stress.tally.to_json() + "\n")
    if seed == QUICK_SEED and STEPS == QUICK_STEPS:
        # The quick seed is chosen to cover the interesting steps: keep it that way.
        assert stress.tally.kills >= 1 and stress.tally.rescales >= 1, stress.tally
