"""Zombies and duplicates with real processes: two cycles of one epoch at once, then the
killed and the losing attempts' late acks and commits.

The story, over ``stress_pipeline`` (the crash tests' sequence checker and a file sink),
every job a ``spark_jobs/run_epoch.py`` client of the session's Spark Connect server:

1. 8 keys x seq 1..M go into a fresh topic; one clean cycle completes checkpoint 1;
2. the next cycle is killed at ``reading``: checkpoint 2 stays pending (its attempt k);
3. two cycles start at once. Both see checkpoint 2 pending and re-run it, as attempts k+1
   and k+2 (``begin_attempt``: put-if-absent ``_attempt-<k>``). Each job holds at the slow
   point (after its tasks acked, before it completes) for a few seconds of its own, so
   both attempts are surely in flight together. Exactly one job completes checkpoint 2,
   with the acks of one attempt (the current one, k+2, when both had acked: possibly the
   other job's), and reports that attempt; the other fails, writing no ``_outcome`` or
   ``_metadata``;
4. the killed attempt and the loser come back late: their acks are DISCARDED, a commit
   conflicts, a zombie notifier publishes nothing again, and storage does not change but
   for the late acks retention deletes;
5. cycles drain the topic: every key's state is ``1..M`` exactly once, the sink holds every
   record once, the group offsets equal the latest ``_metadata``'s, and every state file
   left is referenced.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.faults import slow_once
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stores import open_store
from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.sinkstage import sink_publisher
from microcheckpoint.errors import CommitConflict
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.stress_pipeline import SINK, build
from tests.integration.test_crash_recovery import (
    KEYS,
    OPERATOR,
    PARTITIONS,
    PIPELINE,
    History,
    committed,
    coordinator,
    killed_by_sigkill,
    produce_sequences,
    run_epoch_job,
)

pytestmark = pytest.mark.integration

M = 6  # seq 1..M per key: 24 records per partition
CONFIG = {"max_records_per_epoch": 12}  # two epochs of input; retained: the default, 1
HOLD_S = 4  # each racing job waits this long at the slow point
PIPELINE_SPEC = "tests.integration.stress_pipeline:pipeline"


def snapshot(store, prefix: str) -> dict[str, bytes]:
    return {key: store.get(key).data for key in store.list(prefix)}


def test_two_cycles_of_one_epoch_and_late_zombies_count_once(
    kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    topic = f"zombies-{uuid.uuid4().hex[:8]}"
    storage, sink = (tmp_path / "checkpoints").as_uri(), (tmp_path / "sink").as_uri()
    store = open_store(storage)
    history = History(store)
    logs = tmp_path / "logs"
    logs.mkdir()

    def job(crash_at: str | None = None, env: dict[str, str] | None = None):
        return run_epoch_job(
            logs, kafka_bootstrap, topic, storage, crash_at, spark_connect_url,
            pipeline=PIPELINE_SPEC, config=CONFIG, env_extra={"STRESS_SINK": sink, **(env or {})},
        )  # fmt: skip

    with KafkaOffsets(kafka_bootstrap, request_timeout_ms=10_000) as kafka:
        kafka.create_topic(topic, PARTITIONS)
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        produced = produce_sequences(kafka_bootstrap, topic, range(1, M + 1))
        ends = kafka.end_offsets(tps)

        # 1. A clean cycle; 2. a killed one leaves checkpoint 2 pending.
        assert (first := job()).returncode == 0, first.tail()
        killed = job("reading")
        assert killed_by_sigkill(killed), killed.tail()
        cid = CheckpointId(2)
        view = history.observe()
        assert view.pending == [cid]
        killed_attempt = view.records[cid].attempt

        # 3. Two cycles of checkpoint 2 at once.
        flags = [slow_once(tmp_path / f"hold-{i}", HOLD_S, PIPELINE) for i in range(2)]
        with ThreadPoolExecutor(2) as pool:
            racing = list(pool.map(lambda env: job(env=env), flags))
        view = history.observe()
        assert view.records[cid].status is CheckpointStatus.COMPLETED
        racers = {killed_attempt + 1, killed_attempt + 2}
        assert view.records[cid].attempt == max(racers)  # both re-ran it
        winners = [r for r in racing if r.returncode == 0]
        losers = [r for r in racing if r.returncode != 0]
        assert len(winners) == 1 and len(losers) == 1, [r.tail() for r in racing]
        report = json.loads(winners[0].out.strip().splitlines()[-1])
        meta = view.metadata(cid)
        assert report["checkpoint"] == 2 and report["attempt"] == meta.attempt
        assert meta.attempt in racers
        loser = (racers - {meta.attempt}).pop()
        assert not killed_by_sigkill(losers[0])
        assert "AcksMissing" in losers[0].err or "CommitConflict" in losers[0].err, losers[0].err
        print(f"attempt {meta.attempt} won; the loser: {losers[0].err.strip().splitlines()[-1]}")
        assert {a.attempt for a in meta.acks.values()} == {meta.attempt}
        outcome = coordinator(store).outcome(cid)
        assert outcome is not None and outcome.attempt == meta.attempt

        # 4. The killed attempt and the loser, late: nothing they write counts or lands.
        before = snapshot(store, f"{PIPELINE}/")
        published = read_committed(sink, PIPELINE, SINK)
        coord = coordinator(store)
        for attempt in (killed_attempt, loser):
            for task in (TaskId.of("src", 0), TaskId.of(OPERATOR, 0), TaskId.of(SINK, 1)):
                late = Ack(task, attempt, (), {"late": 1})
                assert coord.acknowledge(cid, late) is AckResult.DISCARDED
        with pytest.raises(CommitConflict):
            coord.complete(cid)
        publish = sink_publisher(build(topic, sink), store, CheckpointingMode.EXACTLY_ONCE)
        coord.notify(cid, None, publish)  # a zombie notifier: publishes nothing again
        assert read_committed(sink, PIPELINE, SINK) == published
        after = snapshot(store, f"{PIPELINE}/")
        # Notify rewrites its own marker, and its retention deletes what nothing references:
        # an ack the loser wrote after the winner completed (acks are written blindly,
        # ``record_ack``), if it came that late. Nothing else changes.
        notified = coord.layout.notified(cid)
        late_acks = {k for k in before if "/acks/" in k}
        assert {k: v for k, v in after.items() if k != notified} == {
            k: v for k, v in before.items() if k != notified and k not in late_acks
        }
        assert not [k for k in after if "/acks/" in k]

        # 5. Drain, then exactly once: state, sink, group offsets, files.
        for _ in range(3):
            view = history.observe()
            if view.metadata(view.latest_completed).offsets == ends and not view.pending:
                break
            assert (run := job()).returncode == 0, run.tail()
        assert view.metadata(view.latest_completed).offsets == ends
        state = read_keyed_state(store, PIPELINE, OPERATOR)
        assert state == {key: {"last": M, "count": M, "bad": 0} for key in KEYS}
        rows = Counter((r["k"], r["seq"]) for r in read_committed(sink, PIPELINE, SINK))
        assert rows == Counter({(p.key, p.seq): 1 for p in produced})
        assert committed(kafka, tps) == ends
        handles = view.metadata(view.latest_completed).handles
        referenced = {h.key for h in handles if "/state/" in h.key}
        assert {k for k in store.list(f"{PIPELINE}/") if "/state/" in k} == referenced
