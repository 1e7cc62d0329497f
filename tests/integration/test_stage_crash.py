"""Crash stories across stages: kill -9 each stage's job at every crash point, recover, and
count every record exactly once at the end of the second stage.

Two stages (``stage_crash_pipeline``) run as ``spark_jobs/run_epoch.py`` subprocesses,
clients of the session's Spark Connect server, over one checkpoint store: ``stage-a`` passes
records ``{k, seq}`` to an internal topic with barrier markers, ``stage-b`` keeps every key's
seqs. Before every ``stage-a`` run one more seq of every key is produced, so every epoch has
records to read when it is killed. The eight kills (each stage at each of the four crash points) come in a seeded random
order; after each, the killed stage's next run recovers. A ``stage-b`` run always follows a
``stage-a`` run, so a marker is there to align on (stage A writes markers for empty epochs
too). At the end: every key's seqs are exactly ``1..M`` (M: the seqs produced) in ``stage-b``'s state, the
internal topic holds every record once, each partition's markers are increasing without
repeats, and every ``stage-b`` checkpoint was aligned.

The unaligned story (``test_stage_crash_unaligned.py``, its own file so the two long
stories can run on different test workers) uses the same ``Story``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stores import open_store
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.faults import SLOW_CHANNEL_ENV
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.markers import marker_of
from microcheckpoint.protocol.records.alignment import AlignmentMode
from microcheckpoint.sinks.kafka import read_topic
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.test_crash_recovery import (
    CRASH_POINTS,
    KEYS,
    PARTITIONS,
    killed_by_sigkill,
    run_epoch_job,
)

pytestmark = pytest.mark.integration

SEED = 20261123
PIPELINES = {
    "a": "tests.integration.stage_crash_pipeline:stage_a",
    "b": "tests.integration.stage_crash_pipeline:stage_b",
}
CONFIGS = {"a": {"retained": 2}, "b": {"retained": 50, "timeout": 120}}
MAX_DRAIN_ROUNDS = 8
SLOW_S = 4  # how long stage a holds back partition 1's marker in the unaligned story
HEAD_START_S = 2  # stage b starts first, so it is waiting for a marker when a commits


class Story:
    """The two stages over fresh topics and one checkpoint store, run as jobs."""

    def __init__(self, bootstrap: str, connect: str, tmp_path: Path, config_b: dict) -> None:
        tag = uuid.uuid4().hex[:6]
        self.bootstrap, self.connect = bootstrap, connect
        self.source, self.internal = f"stage-crash-in-{tag}", f"stage-crash-mid-{tag}"
        with KafkaOffsets(bootstrap) as kafka:
            kafka.create_topic(self.source, PARTITIONS)
            kafka.create_topic(self.internal, 2)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self.produced: list[tuple[str, int]] = []
        self.storage = (tmp_path / "checkpoints").as_uri()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.flag = tmp_path / "slow-channel"
        self.configs = {"a": CONFIGS["a"], "b": config_b}
        self.env = {
            "STAGE_SOURCE_TOPIC": self.source,
            "STAGE_INTERNAL_TOPIC": self.internal,
            "STAGE_BOOTSTRAP": bootstrap,
        }

    def produce_next(self) -> None:
        """One more seq of every key (key i stays in partition i % 2)."""
        seq = len(self.produced) // len(KEYS) + 1
        for i, key in enumerate(KEYS):
            value = json.dumps({"k": key, "seq": seq}).encode()
            self.producer.send(self.source, value=value, partition=i % PARTITIONS)
            self.produced.append((key, seq))
        self.producer.flush()

    def run(self, stage: str, crash_at: str | None = None, produce: bool = True, slow=False):
        if stage == "a" and produce:
            self.produce_next()
        env = dict(self.env)
        if slow:  # stage a's commit holds back partition 1's marker (fires once)
            self.flag.write_text(f"{self.internal}:1 {SLOW_S}")
            env[SLOW_CHANNEL_ENV] = str(self.flag)
        done = run_epoch_job(
            self.logs, self.bootstrap, self.source, self.storage, crash_at, self.connect,
            pipeline=PIPELINES[stage], config=self.configs[stage], env_extra=env,
        )  # fmt: skip
        if crash_at is None:
            assert done.returncode == 0, done.tail()
        else:
            assert killed_by_sigkill(done), done.tail()
        assert not done.leftovers, done.leftovers
        return done

    def together(self, crash_b: str | None = None) -> None:
        """Stage b, then stage a (slow on partition 1) while b waits for its first marker:
        b cuts as soon as a's commit writes partition 0's marker, partition 1 in flight."""
        with ThreadPoolExecutor(1) as pool:
            downstream = pool.submit(self.run, "b", crash_b)
            time.sleep(HEAD_START_S)
            self.run("a", slow=True)
            downstream.result()

    def check(self) -> list[dict]:
        """Drain, then the exactly-once checks; returns stage b's alignment labels."""
        self.producer.close()
        m = len(self.produced) // len(KEYS)
        store = open_store(self.storage)
        state: dict = {}
        for _ in range(MAX_DRAIN_ROUNDS):  # nothing new is produced: both stages catch up
            state = read_keyed_state(store, "stage-b", "collect")
            if all(len(state.get(key, [])) >= m for key in KEYS):
                break
            self.run("a", produce=False)
            self.run("b")
        # Exactly once through both stages: every key's seqs are 1..M, no gap, no repeat.
        assert state == {key: list(range(1, m + 1)) for key in KEYS}
        # The internal topic holds every record once, and each partition's markers increase.
        rows: Counter[tuple[str, int]] = Counter()
        for partition in range(2):
            epochs = []
            for headers, _, value in read_topic(self.bootstrap, self.internal, [partition]):
                encoded = [(name, text.encode()) for name, text in headers.items()]
                marker = marker_of(encoded)
                if marker is not None:
                    epochs.append(marker.epoch)
                else:
                    row = json.loads(value)
                    rows[(row["k"], row["seq"])] += 1
            assert epochs == sorted(set(epochs)), (partition, epochs)
        assert rows == Counter(dict.fromkeys(self.produced, 1))
        config = CheckpointConfig.from_mapping({"pipeline": "stage-b", "storage": self.storage})
        view = CheckpointCoordinator(store, config).view()
        return [view.pending_record(cid).alignment for cid in view.completed]


def test_each_stage_killed_at_every_point_counts_every_record_once(
    kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    story = Story(kafka_bootstrap, spark_connect_url, tmp_path, CONFIGS["b"])
    kills = [(stage, point) for stage in "ab" for point in CRASH_POINTS]
    random.Random(SEED).shuffle(kills)
    print(f"seed {SEED}: kills in order {kills}")
    story.run("a")
    story.run("b")
    for stage, point in kills:
        if stage == "a":
            story.run("a", point)
            story.run("a")
            story.run("b")
        else:
            story.run("a")
            story.run("b", point)
            story.run("a")
            story.run("b")
    # Every completed stage-b checkpoint aligned on one stage-a epoch.
    assert {a.mode for a in story.check()} == {AlignmentMode.ALIGNED}
