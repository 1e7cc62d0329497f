"""Random interleavings of the checkpoint protocol against the file store.

Hypothesis drives trigger, ack, duplicate ack, late acks from an old attempt, new
attempts, timeouts, coordinator crashes in the middle of any write and restarts,
completion, notify and retention, and checks I1, I2 and I5 after every step.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import (
    AcksMissing,
    CheckpointNotFound,
    CommitConflict,
    MicrocheckpointError,
    TooManyFailures,
    TriggerRefused,
)
from microcheckpoint.ids import TaskId, TopicPartition
from microcheckpoint.protocol import layout as names
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.retention import reference_counts
from microcheckpoint.protocol.view import CheckpointStatus, scan
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import ObjectStore, WriteOutcome

TASKS = (TaskId.of("source", 0), TaskId.of("sum", 0), TaskId.of("sum", 1))
PARTITIONS = (TopicPartition("events", 0), TopicPartition("events", 1))


class Crash(Exception):
    """The coordinator process died in the middle of a step."""


class CrashingStore(ObjectStore):
    """A file store whose process 'dies' before its n-th next write when armed."""

    def __init__(self, inner: FileStore) -> None:
        self.inner, self.url, self.countdown = inner, inner.url, None

    def _tick(self) -> None:
        if self.countdown is not None:
            if self.countdown == 0:
                self.countdown = None
                raise Crash
            self.countdown -= 1

    def get(self, key):
        return self.inner.get(key)

    def put(self, key, data):
        self._tick()
        self.inner.put(key, data)

    def put_if_absent(self, key, data) -> WriteOutcome:
        self._tick()
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key, data, etag) -> WriteOutcome:
        self._tick()
        return self.inner.put_if_match(key, data, etag)

    def delete(self, key):
        self._tick()
        self.inner.delete(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)


class CheckpointProtocol(RuleBasedStateMachine):
    @initialize(
        retained=st.integers(1, 3),
        max_concurrent=st.integers(1, 3),
        min_pause=st.sampled_from([0, 0, 5]),
        tolerable=st.integers(0, 2),
    )
    def setup(self, retained, max_concurrent, min_pause, tolerable):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="mcp-sm-")
        self.files = FileStore(f"file://{self.dir}")
        self.store = CrashingStore(self.files)
        self.config = CheckpointConfig.from_mapping(
            {
                "pipeline": "sm",
                "storage": f"file://{self.dir}",
                "retained": retained,
                "max_concurrent": max_concurrent,
                "min_pause": min_pause,
                "tolerable_failures": tolerable,
                "timeout": 60,
                "max_records_per_epoch": 7,
            }
        )
        self.now = 1_000_000.0
        self.restart()
        self.high_watermarks = {tp: 0 for tp in PARTITIONS}
        self.committed: dict[TopicPartition, int] = {}
        self.completed_order: list[int] = []
        self.seen_metadata: dict[int, bytes] = {}
        self.attempt_of: dict[int, int] = {}

    def restart(self) -> None:
        """A new coordinator process: nothing carried over but the store."""
        self.coordinator = CheckpointCoordinator(self.store, self.config, clock=lambda: self.now)

    def run_step(self, crash_after, step):
        self.store.countdown = crash_after
        try:
            return step()
        except Crash:
            self.restart()
            return None
        finally:
            self.store.countdown = None

    def view(self):
        return scan(self.files, self.coordinator.layout)

    # ---- rules ---------------------------------------------------------------------

    @rule(records=st.integers(0, 20))
    def produce(self, records):
        for tp in PARTITIONS:
            self.high_watermarks[tp] += records

    @rule(seconds=st.sampled_from([1, 3, 6, 30, 61]))
    def advance_clock(self, seconds):
        self.now += seconds

    @rule(crash_after=st.one_of(st.none(), st.integers(0, 4)))
    def trigger(self, crash_after):
        def step():
            try:
                return self.coordinator.trigger(
                    TASKS, dict(self.high_watermarks), lambda tps: dict.fromkeys(tps, 0)
                )
            except (TriggerRefused, TooManyFailures):
                return None

        self.run_step(crash_after, step)

    def _pending_ids(self):
        return self.view().pending

    @precondition(lambda self: self._pending_ids())
    @rule(
        data=st.data(),
        crash_after=st.one_of(st.none(), st.integers(0, 2)),
        reuse=st.booleans(),
    )
    def ack(self, data, crash_after, reuse):
        view = self.view()
        cid = data.draw(st.sampled_from(view.pending))
        attempt = view.records[cid].attempt
        task = data.draw(st.sampled_from(TASKS))
        handles = [self._write_state(cid, attempt, task)]
        if reuse and view.latest_completed is not None:
            # Incremental: reference a file the latest completed checkpoint holds.
            meta = view.metadata(view.latest_completed)
            old = meta.acks.get(task)
            if old is not None and old.handles:
                handles.append(old.handles[0])
        ack = Ack(task, attempt, tuple(handles))

        def step():
            first = self.coordinator.acknowledge(cid, ack)
            assert first in (AckResult.SUCCESS, AckResult.DUPLICATE, AckResult.DISCARDED)
            again = self.coordinator.acknowledge(cid, ack)
            assert again in (AckResult.DUPLICATE, AckResult.DISCARDED)

        self.run_step(crash_after, step)

    @precondition(lambda self: self._pending_ids())
    @rule(
        data=st.data(),
        crash_after=st.one_of(st.none(), st.none(), st.integers(0, 3)),
        reuse=st.booleans(),
    )
    def process_epoch(self, data, crash_after, reuse):
        """The Spark job of one epoch: every task snapshots and acks the current attempt."""
        view = self.view()
        cid = data.draw(st.sampled_from(view.pending))
        attempt = view.records[cid].attempt
        base = view.latest_completed

        def step():
            for task in TASKS:
                handles = [self._write_state(cid, attempt, task)]
                if reuse and base is not None:
                    old = self.view().metadata(base).acks[task].handles
                    handles.append(old[0])
                result = self.coordinator.acknowledge(cid, Ack(task, attempt, tuple(handles)))
                assert result in (AckResult.SUCCESS, AckResult.DUPLICATE, AckResult.DISCARDED)

        self.run_step(crash_after, step)

    @rule(
        crash_after=st.one_of(st.none(), st.none(), st.integers(0, 12)),
        reuse=st.booleans(),
        records=st.integers(1, 10),
    )
    def epoch_cycle(self, crash_after, reuse, records):
        """A whole scheduled run: trigger, process, complete, notify (a crash anywhere)."""
        self.produce(records)

        def step():
            try:
                pending = self.coordinator.trigger(
                    TASKS, dict(self.high_watermarks), lambda tps: dict.fromkeys(tps, 0)
                )
            except (TriggerRefused, TooManyFailures):
                return None
            cid, base = pending.checkpoint_id, self.view().latest_completed
            for task in TASKS:
                handles = [self._write_state(cid, 1, task)]
                if reuse and base is not None:
                    handles.append(self.view().metadata(base).acks[task].handles[-1])
                self.coordinator.acknowledge(cid, Ack(task, 1, tuple(handles)))
            try:
                self.coordinator.complete(cid)
            except (AcksMissing, CommitConflict):
                return None
            self.coordinator.notify(cid, self._commit)
            return True

        if self.run_step(crash_after, step):
            self.check_nothing_unreferenced_left()

    def _commit(self, offsets):
        self.committed = dict(offsets)

    def _write_state(self, cid, attempt, task):
        key = self.coordinator.layout.state_prefix(cid, attempt, task) + "state.bin"
        self.files.put(key, f"{cid}:{attempt}:{task}".encode())
        return StateHandle(key, len(f"{cid}:{attempt}:{task}"))

    @precondition(lambda self: self._pending_ids())
    @rule(data=st.data())
    def unknown_task_ack(self, data):
        cid = data.draw(st.sampled_from(self._pending_ids()))
        attempt = self.view().records[cid].attempt
        result = self.coordinator.acknowledge(cid, Ack(TaskId.of("stranger", 0), attempt))
        assert result is AckResult.UNKNOWN

    @precondition(lambda self: self._pending_ids())
    @rule(data=st.data(), crash_after=st.one_of(st.none(), st.integers(0, 1)))
    def new_attempt_then_late_ack(self, data, crash_after):
        cid = data.draw(st.sampled_from(self._pending_ids()))
        old = self.view().records[cid].attempt
        task = data.draw(st.sampled_from(TASKS))

        def step():
            new = self.coordinator.begin_attempt(cid)
            assert new > old
            # The zombie of the old attempt acks late: it must not count.
            late = Ack(task, old, (self._write_state(cid, old, task),))
            assert self.coordinator.acknowledge(cid, late) is AckResult.DISCARDED
            assert task not in self.coordinator.load_pending(cid).acks

        self.run_step(crash_after, step)

    @rule(crash_after=st.one_of(st.none(), st.integers(0, 3)), rare=st.integers(0, 2))
    def expire(self, crash_after, rare):
        if rare:
            return
        self.run_step(crash_after, self.coordinator.abort_expired)

    @precondition(lambda self: self._pending_ids())
    @rule(data=st.data(), rare=st.integers(0, 3))
    def decline(self, data, rare):
        if rare:
            return
        cid = data.draw(st.sampled_from(self._pending_ids()))
        self.coordinator.abort_declined(cid, "task failed")

    @precondition(lambda self: self._pending_ids())
    @rule(data=st.data(), crash_after=st.one_of(st.none(), st.integers(0, 5)))
    def complete(self, data, crash_after):
        cid = data.draw(st.sampled_from(self._pending_ids()))

        def step():
            try:
                meta = self.coordinator.complete(cid)
            except (AcksMissing, CommitConflict):
                return
            assert meta.checkpoint_id == cid

        self.run_step(crash_after, step)

    @rule()
    def crash_and_restart(self):
        self.restart()
        self.coordinator.finish_completing()

    @precondition(lambda self: self.view().completed)
    @rule(data=st.data(), crash_after=st.one_of(st.none(), st.integers(0, 6)))
    def notify(self, data, crash_after):
        cid = data.draw(st.sampled_from(self.view().completed))

        def commit(offsets):
            self.committed = dict(offsets)

        def step():
            self.coordinator.notify(cid, commit)
            return True

        if self.run_step(crash_after, step):
            self.check_nothing_unreferenced_left()

    @rule()
    def reset_failures(self):
        self.coordinator.reset_failures()

    # ---- invariants ------------------------------------------------------------------

    def check_nothing_unreferenced_left(self):
        """I5, second half: after cleanup, every state file outside in-flight checkpoints is referenced."""
        view = self.view()
        _, refs = reference_counts(view, self.config.retained)
        for cid, record in view.records.items():
            if record.status in (CheckpointStatus.PENDING, CheckpointStatus.COMPLETING):
                continue
            prefix = view.layout.chk(cid)
            for key in record.keys:
                name = key[len(prefix) :]
                if name in names.PROTOCOL_FILES or name.startswith(names.ATTEMPT_PREFIX):
                    continue
                assert refs[key] > 0, f"unreferenced {key} outlived cleanup"

    @invariant()
    def invariants(self):
        if not hasattr(self, "files"):
            return
        view = self.view()
        completed = view.completed
        # I2: completed iff _metadata; the _metadata never changes once written.
        for cid in completed:
            data = self.files.get(view.layout.metadata(cid)).data
            assert self.seen_metadata.setdefault(cid.value, data) == data
            outcome = json.loads(self.files.get(view.layout.outcome(cid)).data)
            assert outcome["outcome"] == "COMPLETED"
        for cid, record in view.records.items():
            if record.status is not CheckpointStatus.COMPLETED:
                assert not self.files.exists(view.layout.metadata(cid))
        # I2: no lower id completes after a higher one.
        new = [c.value for c in completed if c.value not in self.completed_order]
        for value in sorted(new):
            if self.completed_order:
                assert value > max(self.completed_order), (value, self.completed_order)
            self.completed_order.append(value)
        # I1: _metadata offsets equal the barrier ends; committed <= latest _metadata offsets.
        for cid in completed:
            meta = view.metadata(cid)
            if self.files.exists(view.layout.pending(cid)):  # not half-dropped by retention
                assert meta.offsets == self.coordinator.barrier(cid).ends
            assert set(meta.acks) == set(TASKS)
            assert all(a.attempt == meta.attempt for a in meta.acks.values())
        if completed:
            latest = view.metadata(completed[-1]).offsets
            for tp, offset in self.committed.items():
                assert offset <= latest[tp]
        else:
            assert self.committed == {}
        # Barriers chain: each checkpoint starts where the one it continues from ended.
        for cid in view.ids(CheckpointStatus.PENDING, CheckpointStatus.COMPLETED):
            if not self.files.exists(view.layout.pending(cid)):
                continue  # half-dropped by retention: only _metadata is left to read
            base = view.pending_record(cid).base
            barrier = self.coordinator.barrier(cid)
            if base is not None and self.files.exists(view.layout.pending(base)):
                base_ends = self.coordinator.barrier(base).ends
                assert barrier.starts == base_ends, (cid, base)
            for r in barrier.ranges.values():
                assert r.count <= 7
        # I5: nothing referenced by a retained checkpoint is deleted.
        for cid in completed[-self.config.retained :]:
            for handle in view.metadata(cid).handles:
                assert self.files.exists(handle.key), f"{handle.key} of retained {cid} deleted"
        # Failure bookkeeping: stopped exactly when consecutive failures exceed the tolerance.
        failures = self.coordinator.consecutive_failures(view)
        stopped = self.coordinator.trigger_decision(view).verdict.value == "STOPPED"
        assert stopped == (failures > self.config.tolerable_failures)

    def teardown(self):
        import shutil

        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)


CheckpointProtocol.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCheckpointProtocol = CheckpointProtocol.TestCase

_unused = (CheckpointNotFound, MicrocheckpointError)
