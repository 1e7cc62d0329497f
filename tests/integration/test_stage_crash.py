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
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaProducer

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.markers import marker_of
from microcheckpoint.sinks.kafka import read_topic
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import open_store
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


def test_each_stage_killed_at_every_point_counts_every_record_once(
    kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    source, internal = f"stage-crash-in-{tag}", f"stage-crash-mid-{tag}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(source, PARTITIONS)
        kafka.create_topic(internal, 2)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    produced: list[tuple[str, int]] = []

    def produce_next() -> None:
        """One more seq of every key (key i stays in partition i % 2)."""
        seq = len(produced) // len(KEYS) + 1
        for i, key in enumerate(KEYS):
            value = json.dumps({"k": key, "seq": seq}).encode()
            producer.send(source, value=value, partition=i % PARTITIONS)
            produced.append((key, seq))
        producer.flush()

    storage = (tmp_path / "checkpoints").as_uri()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {
        "STAGE_SOURCE_TOPIC": source,
        "STAGE_INTERNAL_TOPIC": internal,
        "STAGE_BOOTSTRAP": kafka_bootstrap,
    }

    def run(stage: str, crash_at: str | None = None, produce: bool = True):
        if stage == "a" and produce:
            produce_next()
        done = run_epoch_job(
            logs, kafka_bootstrap, source, storage, crash_at, spark_connect_url,
            pipeline=PIPELINES[stage], config=CONFIGS[stage], env_extra=env,
        )  # fmt: skip
        if crash_at is None:
            assert done.returncode == 0, done.tail()
        else:
            assert killed_by_sigkill(done), done.tail()
        assert not done.leftovers, done.leftovers
        return done

    kills = [(stage, point) for stage in "ab" for point in CRASH_POINTS]
    random.Random(SEED).shuffle(kills)
    print(f"seed {SEED}: kills in order {kills}")
    run("a")
    run("b")
    for stage, point in kills:
        if stage == "a":
            run("a", point)
            run("a")
            run("b")
        else:
            run("a")
            run("b", point)
            run("a")
            run("b")

    producer.close()
    m = len(produced) // len(KEYS)
    store = open_store(storage)
    state: dict = {}
    for _ in range(MAX_DRAIN_ROUNDS):  # nothing new is produced: both stages catch up
        state = read_keyed_state(store, "stage-b", "collect")
        if all(len(state.get(key, [])) >= m for key in KEYS):
            break
        run("a", produce=False)
        run("b")
    # Exactly once through both stages: every key's seqs are 1..M, no gap, no repeat.
    assert state == {key: list(range(1, m + 1)) for key in KEYS}
    # The internal topic holds every record once, and each partition's markers increase.
    rows: Counter[tuple[str, int]] = Counter()
    for partition in range(2):
        epochs = []
        for headers, _, value in read_topic(kafka_bootstrap, internal, [partition]):
            encoded = [(name, text.encode()) for name, text in headers.items()]
            marker = marker_of(encoded)
            if marker is not None:
                epochs.append(marker.epoch)
            else:
                row = json.loads(value)
                rows[(row["k"], row["seq"])] += 1
        assert epochs == sorted(set(epochs)), (partition, epochs)
    assert rows == Counter(dict.fromkeys(produced, 1))
    # Every completed stage-b checkpoint aligned on one stage-a epoch.
    config = CheckpointConfig.from_mapping({"pipeline": "stage-b", "storage": storage})
    view = CheckpointCoordinator(store, config).view()
    modes = {view.pending_record(cid).labels["alignment"]["mode"] for cid in view.completed}
    assert modes == {"aligned"}
