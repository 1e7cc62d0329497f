"""Replayability against the real broker: retained points whose first record to replay
Kafka's retention deletes soon, seen by ``replay_warnings``, the retention task's log and
``microcheckpoint verify``.

Nothing is mocked: Tansu serves the topics, the checkpoints are written by the core into a
checkpoint folder. What Tansu 0.6 does (tried against this fixture broker):

- it keeps the configs a topic is created with and answers DescribeConfigs with them
  (as DEFAULT_CONFIG, so only ``config_filter="all"`` shows them); a topic created without
  configs has none, so Kafka's default retention is assumed and the message says so;
- it never deletes records by ``retention.ms`` (a topic with ``retention.ms=1000`` keeps
  10-day-old records) and DeleteRecords is not implemented (the request panics in its
  storage engine), so the log start is always 0: the ``lost`` case cannot be produced here
  and is covered by ``tests/unit/protocol/test_replay.py``.

Record timestamps are set by the producer (CreateTime), relative to the test's clock, so
the ``soon`` case is real: the adapter fetches the record at each offset and reads the
topic's ``retention.ms`` from the broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness import services
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.kafka_replay import replay_warnings
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.replay import KAFKA_DEFAULT_RETENTION_MS
from microcheckpoint.protocol.savepoints import create_savepoint
from microcheckpoint.state.files import encode_rows, rows_from_groups
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore
from tests.integration.cli_support import cli

pytestmark = pytest.mark.integration

PIPELINE = "replay"
HOUR = 3_600_000
DAY = 24 * HOUR
RETENTION = 2 * DAY
TASK = TaskId.of("src", 0)
FIX = "take a savepoint now, restore from a newer checkpoint, or raise retention.ms of topic"
ASSUMED = " (not reported by the broker: Kafka's default assumed)"


def utc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def produce(bootstrap: str, topic: str, partition: int, timestamps: list[int]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, ts in enumerate(timestamps):
            producer.send(topic, value=f"r{i}".encode(), partition=partition, timestamp_ms=ts)
        producer.flush()
    finally:
        producer.close()


class Points:
    """A pipeline's checkpoint folder with checkpoints written by the core, ending where given."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = FileStore((tmp_path / "checkpoints").as_uri())
        self.config = CheckpointConfig.from_mapping(
            {"pipeline": PIPELINE, "storage": self.store.url, "retained": 2}
        )
        self.coord = CheckpointCoordinator(self.store, self.config)

    def checkpoint(self, ends: dict[TopicPartition, int]) -> CheckpointId:
        """Trigger (reading from 0), ack the one task with a state file (one key), complete,
        notify."""
        cid = self.coord.trigger([TASK], ends, lambda tps: dict.fromkeys(tps, 0)).checkpoint_id
        key = self.coord.layout.state_prefix(cid, 1, TASK) + "kg-00000.parquet"
        data = encode_rows(rows_from_groups({0: {"word": (cid.value, 0)}}))
        self.store.put(key, data)
        ack = Ack(TASK, 1, (StateHandle(key, len(data), (0,)),), {}, 5)
        assert self.coord.acknowledge(cid, ack) is AckResult.SUCCESS
        self.coord.complete(cid)
        self.coord.notify(cid)
        return cid


@pytest.fixture
def now_ms() -> int:
    return int(time.time()) * 1000


@pytest.fixture
def scene(tmp_path: Path, kafka_bootstrap: str, now_ms: int) -> SimpleNamespace:
    """Topic ``retention.ms`` = 2 days, two partitions. Partition 0: records 0-4 written
    2 days minus 2 hours ago (deleted in about 2 hours), 5-9 now; partition 1: 4 records now.
    Checkpoint 1 ends at (3, 2) and has a savepoint; checkpoint 2 ends at (7, 4), the log end
    of partition 1. Retained: 1 and 2 (plus the savepoint)."""
    topic = f"replay-{uuid.uuid4().hex[:10]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 2, configs={"retention.ms": str(RETENTION)})
    old = now_ms - RETENTION + 2 * HOUR
    produce(kafka_bootstrap, topic, 0, [old + i for i in range(5)] + [now_ms] * 5)
    produce(kafka_bootstrap, topic, 1, [now_ms] * 4)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    points = Points(tmp_path)
    c1 = points.checkpoint({p0: 3, p1: 2})
    savepoint = create_savepoint(points.store, PIPELINE, checkpoint=c1)
    points.checkpoint({p0: 7, p1: 4})
    return SimpleNamespace(
        topic=topic, points=points, savepoint=savepoint, old=old, bootstrap=kafka_bootstrap
    )


def soon_message(point: str, topic: str, offset: int, record_ms: int, assumed: str = "") -> str:
    retention = RETENTION if not assumed else KAFKA_DEFAULT_RETENTION_MS
    words = "2 d" if not assumed else "7 d"
    return (
        f"{point}: offset {offset} of {topic}:0 (log start 0; record time {utc(record_ms)}) "
        f"passes retention.ms={retention} ({words}){assumed} at {utc(record_ms + retention)}, "
        f"within the 24 h horizon; {FIX} {topic!r}"
    )


# ---- the adapter ---------------------------------------------------------------------------


def test_the_broker_reports_retention_given_at_create_and_record_timestamps(
    scene: SimpleNamespace, now_ms: int
) -> None:
    topic, p0, p1 = scene.topic, TopicPartition(scene.topic, 0), TopicPartition(scene.topic, 1)
    plain = f"plain-{uuid.uuid4().hex[:10]}"
    with KafkaOffsets(scene.bootstrap) as kafka:
        kafka.create_topic(plain, 1)
        reported = kafka.retention_ms([topic, plain])
        assert reported[topic] == RETENTION
        if not os.environ.get(services.ENV_KAFKA):
            assert reported[plain] is None  # Tansu reports only configs given at create
        positions = [(p0, 0), (p0, 4), (p0, 5), (p0, 10), (p1, 3), (p1, 4)]
        assert kafka.record_timestamps(positions) == {
            (p0, 0): scene.old,
            (p0, 4): scene.old + 4,
            (p0, 5): now_ms,
            (p0, 10): None,  # the log end: nothing there yet
            (p1, 3): now_ms,
            (p1, 4): None,
        }
        assert kafka.record_timestamps([]) == {}


# ---- replay_warnings (the page's function) -------------------------------------------------


def test_replay_warnings_name_the_checkpoint_and_the_savepoint_that_go_soon(
    scene: SimpleNamespace, now_ms: int
) -> None:
    got = replay_warnings(scene.points.store, PIPELINE, scene.bootstrap, now_ms=now_ms)
    deleted = scene.old + 3 + RETENTION
    common = {
        "partition": f"{scene.topic}:0",
        "offset": 3,
        "log_start": 0,
        "record_time_ms": scene.old + 3,
        "retention_ms": RETENTION,
        "retention_assumed": False,
        "deleted_at_ms": deleted,
        "severity": "soon",
    }
    assert got == [
        {
            "point": 1,
            "kind": "checkpoint",
            **common,
            "message": soon_message("checkpoint 1", scene.topic, 3, scene.old + 3),
        },
        {
            "point": scene.savepoint,
            "kind": "savepoint",
            **common,
            "message": soon_message(f"savepoint {scene.savepoint}", scene.topic, 3, scene.old + 3),
        },
    ]
    assert json.loads(json.dumps(got)) == got
    # A shorter horizon (1 hour) finds nothing: deletion is about 2 hours away.
    assert replay_warnings(scene.points.store, PIPELINE, scene.bootstrap, now_ms, HOUR) == []
    # Later, the same records are overdue.
    later = replay_warnings(scene.points.store, PIPELINE, scene.bootstrap, now_ms + 3 * HOUR)
    assert [w["point"] for w in later] == [1, scene.savepoint]
    assert "and Kafka may delete it at any moment; " in later[0]["message"]


def test_without_reported_retention_kafkas_default_is_assumed(
    tmp_path: Path, kafka_bootstrap: str, now_ms: int
) -> None:
    topic = f"plain-{uuid.uuid4().hex[:10]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(topic, 1)
        reported = kafka.retention_ms([topic])[topic]
    old = now_ms - KAFKA_DEFAULT_RETENTION_MS + 5 * HOUR
    produce(kafka_bootstrap, topic, 0, [old, old + 1, now_ms])
    points = Points(tmp_path)
    points.checkpoint({TopicPartition(topic, 0): 1})
    points.checkpoint({TopicPartition(topic, 0): 2})
    got = replay_warnings(points.store, PIPELINE, kafka_bootstrap, now_ms=now_ms)
    if reported is not None:  # an external Kafka reports its default
        pytest.skip(f"the broker reports retention.ms={reported} for a topic without configs")
    assert [w["message"] for w in got] == [soon_message("checkpoint 1", topic, 1, old + 1, ASSUMED)]
    assert got[0]["retention_assumed"] is True


def test_unlimited_retention_and_fresh_records_give_no_warning(
    tmp_path: Path, kafka_bootstrap: str, now_ms: int
) -> None:
    forever, fresh = (f"{name}-{uuid.uuid4().hex[:10]}" for name in ("forever", "fresh"))
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(forever, 1, configs={"retention.ms": "-1"})
        kafka.create_topic(fresh, 1, configs={"retention.ms": str(RETENTION)})
    produce(kafka_bootstrap, forever, 0, [1_000_000_000_000, 1_000_000_000_001])  # 2001
    produce(kafka_bootstrap, fresh, 0, [now_ms - RETENTION + DAY + 60_000, now_ms])
    points = Points(tmp_path)
    points.checkpoint({TopicPartition(forever, 0): 1, TopicPartition(fresh, 0): 0})
    assert replay_warnings(points.store, PIPELINE, kafka_bootstrap, now_ms=now_ms) == []


def test_unreachable_kafka_raises_naming_the_bootstrap(scene: SimpleNamespace) -> None:
    address = f"127.0.0.1:{services.free_port()}"
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match=address):
        replay_warnings(scene.points.store, PIPELINE, address, request_timeout_ms=1_000)
    assert time.monotonic() - started < 10


# ---- the retention task's log --------------------------------------------------------------


def retention_task(points: Points) -> Any:
    from microcheckpoint_airflow.operators import RetentionOperator
    from microcheckpoint_airflow.spec import PipelineSpec

    spec = PipelineSpec(
        name=PIPELINE,
        pipeline="examples.wordcount:pipeline",
        checkpointing={"storage": points.store.url, "retained": 2},
        kafka_conn_id="replay_test_kafka",
    )
    return RetentionOperator(task_id="retention", spec=spec)


def run_logged(task: Any) -> tuple[Any, list[str]]:
    """Run ``task`` in-process; its result and its WARNING lines about replayability.

    Airflow 3's task logger is structlog (not the logging module that caplog hooks into),
    so the lines are taken with structlog's own capture.
    """
    from structlog.testing import capture_logs

    context = {"run_id": "manual__x", "dag": SimpleNamespace(dag_id="replay_pipeline")}
    with capture_logs() as logged:
        result = task.execute(context)
    # Airflow adds its own warning (execute called outside the task runner): left out.
    warnings = [e["event"] for e in logged if e["log_level"] == "warning"]
    return result, [w for w in warnings if w.startswith("replayability")]


def test_the_retention_task_logs_a_warning_per_endangered_point(
    scene: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROCHECKPOINT_KAFKA_BOOTSTRAP", scene.bootstrap)
    kept, warnings = run_logged(retention_task(scene.points))
    assert kept == [1, 2]
    assert warnings == [
        "replayability: " + soon_message("checkpoint 1", scene.topic, 3, scene.old + 3),
        "replayability: "
        + soon_message(f"savepoint {scene.savepoint}", scene.topic, 3, scene.old + 3),
    ]


def test_the_retention_task_survives_unreachable_kafka_with_one_warning(
    scene: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{services.free_port()}"
    monkeypatch.setenv("MICROCHECKPOINT_KAFKA_BOOTSTRAP", address)
    started = time.monotonic()
    kept, warnings = run_logged(retention_task(scene.points))
    assert kept == [1, 2]
    assert time.monotonic() - started < 20
    (line,) = warnings
    assert line.startswith(
        f"replayability check did not run: Kafka at bootstrap servers {address!r} did not answer"
    ), line


# ---- microcheckpoint verify ----------------------------------------------------------------


def verify(scene: SimpleNamespace, point: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``microcheckpoint verify`` on the scene's storage; it must exit 0."""
    env = {
        **os.environ,
        "MICROCHECKPOINT_STORAGE": scene.points.store.url,
        "MICROCHECKPOINT_PIPELINE": PIPELINE,
        "MICROCHECKPOINT_KAFKA_BOOTSTRAP": scene.bootstrap,
        "COLUMNS": "400",
    }
    return cli(env, "verify", point, *extra)


def test_verify_adds_a_warning_row_and_still_verifies(scene: SimpleNamespace) -> None:
    done = verify(scene, "1", "--json")
    report = json.loads(done.stdout)
    assert report["ok"] is True
    rows = [c for c in report["checks"] if c["check"].startswith(scene.topic)]
    assert rows == [
        {"check": f"{scene.topic}:0", "ok": True, "detail": "offset 3 in [0, 10]"},
        {"check": f"{scene.topic}:1", "ok": True, "detail": "offset 2 in [0, 4]"},
        {
            "check": f"{scene.topic}:0 retention",
            "ok": True,
            "warning": True,
            "detail": soon_message("checkpoint 1", scene.topic, 3, scene.old + 3),
        },
    ]
    saved = json.loads(verify(scene, scene.savepoint, "--json").stdout)
    (row,) = [c for c in saved["checks"] if c.get("warning")]
    assert row["detail"] == soon_message(
        f"savepoint {scene.savepoint}", scene.topic, 3, scene.old + 3
    )
    newest = json.loads(verify(scene, "2", "--json").stdout)
    assert [c for c in newest["checks"] if c.get("warning")] == []
    table = verify(scene, "1")
    assert table.stdout.count("WARNING") == 1
    assert table.stdout.rstrip().endswith("VERIFIED")
