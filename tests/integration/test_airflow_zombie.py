"""Two Airflow runs of one epoch: a zombie and the run after it.

After a first checkpoint, run A of ``wordcount_pipeline`` triggers checkpoint 2 and is held
in the middle of its read (the ``reading`` hold point) past the checkpoint timeout, as a task
whose worker hangs. Run B, in a second Airflow (its own metadata database, the same
checkpoint storage, as a scheduler that took over would be), finds checkpoint 2 expired
(A's task aborted it at its deadline while its job was held; a task whose whole process
hangs would not, and B's trigger aborts it then), and checkpoints the same range as
checkpoint 3. Then A wakes up and finishes its
epoch: its acks are discarded, it cannot complete, it publishes nothing. Exactly one run wins the range; the state, the sink's
published files and the group offsets count every record once.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from examples import wordcount
from harness.faults import Hold
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import S3Store
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.sinks.files import read_committed
from microcheckpoint.state.reader import read_keyed_state
from tests.integration.airflow_support import dag_test, migrate

pytestmark = pytest.mark.integration
TIMEOUT_S = 15


def test_a_zombie_run_loses_to_the_run_that_expired_its_checkpoint(
    tmp_path: Path, kafka_bootstrap, s3_endpoint, s3_client, s3_bucket, spark_connect_url
) -> None:
    topic = f"zombie-{uuid.uuid4().hex[:8]}"
    lines = wordcount.lines_for(80, seed=21)  # 40 per partition, 10 per partition and epoch
    wordcount.produce(kafka_bootstrap, topic, lines)
    sink = tmp_path / "published"
    store = S3Store(s3_client, s3_bucket, "chk")
    env = {
        "MICROCHECKPOINT_STORAGE": f"s3://{s3_bucket}/chk",
        "WORDCOUNT_TOPIC": topic,
        "WORDCOUNT_SINK": sink.as_uri(),
        "WORDCOUNT_MAX_RECORDS": "10",
        "WORDCOUNT_RETAINED": "10",
        "WORDCOUNT_TIMEOUT": f"{TIMEOUT_S}s",
        "WORDCOUNT_TOLERABLE_FAILURES": "3",
        # Epochs on the session's warm Spark Connect server: no JVM start per run.
        "MICROCHECKPOINT_SPARK_MODE": "connect",
    }
    # Two Airflow deployments on one checkpoint storage: one migrated database, copied.
    home_a, home_b = tmp_path / "airflow-a", tmp_path / "airflow-b"
    migrate(home_a, kafka_bootstrap, s3_endpoint)
    home_b.mkdir()
    shutil.copy(home_a / "airflow.db", home_b / "airflow.db")
    one_run = [{"dag_id": "wordcount_pipeline"}]

    def run(home: Path, settings: dict[str, str]) -> list[dict]:
        return dag_test(
            home,
            kafka_bootstrap,
            s3_endpoint,
            "wordcount.py",
            one_run,
            settings,
            spark_connect=spark_connect_url,
        )

    # Checkpoint 1 (so retention keeps the aborted checkpoint after it as history), with a
    # timeout no busy machine reaches: only checkpoint 2 is meant to expire.
    first = run(home_b, {**env, "WORDCOUNT_TIMEOUT": "10min"})
    assert first[0]["state"] == "success", first
    hold = Hold(tmp_path / "hold", "reading", limit_s=300)
    zombie: list = []
    run_a = threading.Thread(target=lambda: zombie.extend(run(home_a, {**env, **hold.env})))
    run_a.start()
    try:
        hold.wait_reached(240, alive=run_a.is_alive)
        held = checkpoint_history(store, "wordcount")["checkpoints"]
        assert [(r["id"], r["status"]) for r in held] == [(2, "PENDING"), (1, "COMPLETED")]
        # Past checkpoint 2's timeout, measured from its own trigger time.
        expired_at = held[0]["trigger_time_ms"] / 1000 + TIMEOUT_S + 1
        time.sleep(max(0.0, expired_at - time.time()))
        taker = run(home_b, env)
    finally:
        hold.release()
        run_a.join(300)
    assert not run_a.is_alive()
    rows = {r["id"]: r for r in checkpoint_history(store, "wordcount")["checkpoints"]}
    seen = {c: (r["status"], r.get("reason"), r.get("ranges")) for c, r in rows.items()}
    # The zombie's checkpoint was aborted as expired; B took the same range as checkpoint 3.
    assert taker[0]["state"] == "success", (seen, taker)
    assert (rows[2]["status"], rows[2]["reason"]) == ("ABORTED", "EXPIRED"), seen
    second = {f"{topic}:0": [10, 20], f"{topic}:1": [10, 20]}
    assert rows[2]["ranges"] == rows[3]["ranges"] == second
    # The zombie woke up to a decided checkpoint: its run failed and changed nothing.
    assert zombie[0]["state"] == "failed", zombie
    assert zombie[0]["tasks"]["process_epoch"] == "failed"
    won = [c for c, r in rows.items() if r["status"] == "COMPLETED" and r["ranges"] == second]
    assert won == [3]  # exactly one run won the range
    assert sorted(rows) == [1, 2, 3]

    # The rest of the input in one more epoch: every record counted once.
    assert run(home_b, {**env, "WORDCOUNT_MAX_RECORDS": "1000"})[0]["state"] == "success"
    truth = wordcount.expected(lines)
    assert read_keyed_state(store, "wordcount", "word-counts") == dict(truth)
    published = read_committed(sink.as_uri(), "wordcount", "word-totals")
    pairs = Counter((row["key"], row["total"]) for row in published)
    assert [pair for pair, n in pairs.items() if n > 1] == []  # nothing published twice
    finals: dict[str, int] = {}
    for key, total in pairs:
        finals[key] = max(finals.get(key, 0), total)
    assert finals == dict(truth)
    rows = {r["id"]: r for r in checkpoint_history(store, "wordcount")["checkpoints"]}
    assert [(c, r["status"], r["records"]) for c, r in sorted(rows.items())] == [
        (1, "COMPLETED", 20),
        (2, "ABORTED", 20),
        (3, "COMPLETED", 20),
        (4, "COMPLETED", 40),
    ]
    manifests = sorted(
        p.name for p in (sink / "wordcount" / "word-totals" / "_manifests").iterdir()
    )
    assert manifests == [f"epoch-{c:010d}.json" for c in (1, 3, 4)]
    with KafkaOffsets(kafka_bootstrap) as kafka:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        committed = kafka.committed_group_offsets("microcheckpoint-wordcount", tps)
    assert {tp.partition: o for tp, o in committed.items()} == {0: 40, 1: 40}
