"""Broker faults: Tansu on S3 restarted mid-read and mid-publish, and down past the timeout.

Each story runs the engine's local cycle (``run_cycle``) over a pipeline that reads
``{"k", "seq"}`` records (every key counts 1, 2, 3, ... in one partition), publishes every
record to a Kafka sink and then checks each key's sequence (``seq-check``: next - previous
must be 1). The broker is a Tansu of the test's own, storing its log in its own bucket on
the session's S3 server, so a restart on the same port keeps topics, records and group
offsets. A hold point (``microcheckpoint.faults``) keeps the epoch where the fault belongs
while the test stops the broker by process id and starts it again.

Every story ends with exact results: each key's seqs are 1..M with no gap or repeat, the
output topic holds every input record exactly once (a multiset), completed checkpoints have
contiguous ids with one ``_metadata`` each whose offsets are their barrier's ends, and the
group offsets equal the latest ``_metadata``. Each prints one ``BROKER FAULTS`` line for
docs/reliability.md (``pytest -s``).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka import KafkaProducer

from harness import services
from harness.faults import Hold
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import ensure_bucket
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records.checkpoint import AbortReason
from microcheckpoint.protocol.recovery import abort_failed_run
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.sinks.kafka import KafkaSink, read_topic
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore
from tests.integration.crash_pipeline import check_sequence

KEYS = [f"k{i:02d}" for i in range(12)]
PARTITIONS = 3
SPLIT = 150  # records per split: an epoch's read is many splits, so a hold is mid-read
READ_LIMIT_S = 3.0  # the source's timeout_s in the broker-down story
OPERATOR = "seq-check"
SINK_TIMEOUT_MS = 5_000  # the Kafka sink's request limit: a publish to a down broker fails soon
LATE_SEND_WINDOW_S = 3.0  # how long a test waits for a send a failed commit left pending


@dataclass
class Broker:
    """A Tansu on S3 that a test restarts on the same port (stopped by process id)."""

    log_dir: Path
    endpoint: services.S3Endpoint
    bucket: str
    service: services.Service | None = None
    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start it (on the port it had, if any); returns when it answers (monotonic)."""
        self.service = services.start_tansu(
            self.log_dir,
            storage=f"s3://{self.bucket}/",
            s3=self.endpoint,
            port=self.port or None,
        )
        self.port = int(self.service.address.rsplit(":", 1)[1])
        return time.monotonic()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None


@pytest.fixture(scope="module")
def broker(service_log_dir: Path, s3_endpoint: services.S3Endpoint, s3_client) -> Iterator[Broker]:
    bucket = f"tansu-faults-{uuid.uuid4().hex[:8]}"
    ensure_bucket(s3_client, bucket)
    one = Broker(service_log_dir / f"tansu-{bucket}", s3_endpoint, bucket)
    try:
        one.start()
        yield one
    finally:
        one.stop()


@dataclass
class Story:
    """One pipeline on the test's broker: its input, its storage and what happened."""

    name: str
    broker: Broker
    root: Path
    read_limit_s: float = 60.0
    produced: list[tuple[int, int, str, int]] = field(default_factory=list)  # p, offset, k, seq
    seqs: int = 0
    cycles: int = 0
    failed_cycles: int = 0

    def __post_init__(self) -> None:
        self.topic, self.out = f"{self.name}-in", f"{self.name}-out"
        self.store = FileStore(f"file://{self.root}/chk")
        with KafkaOffsets(self.broker.address, request_timeout_ms=10_000) as kafka:
            kafka.create_topic(self.topic, PARTITIONS)
        self.sink = KafkaSink(
            "out", self.broker.address, self.out, key_column="k", partitions=3,
            request_timeout_ms=SINK_TIMEOUT_MS,
        )  # fmt: skip
        source = KafkaSource(
            "src",
            [self.topic],
            value_format="json",
            schema={"k": "string", "seq": "long"},
            max_records_per_split=SPLIT,
            timeout_s=self.read_limit_s,
        )
        self.pipeline = (
            Pipeline(self.name, source)
            .then(lambda df: df.select("k", "seq", "partition", "offset"))
            .then(self.sink)
            .then(
                KeyedOperator(
                    OPERATOR, key="k", fn=check_sequence, output_schema="k string, last long"
                )
            )
        )
        self.config = self.with_timeout(600.0)

    def with_timeout(self, timeout_s: float) -> CheckpointConfig:
        return CheckpointConfig.from_mapping(
            {
                "pipeline": self.name,
                "storage": self.store.url,
                "timeout": timeout_s,
                "retained": 10,
                "tolerable_failures": 3,
            }
        )

    @property
    def coordinator(self) -> CheckpointCoordinator:
        return CheckpointCoordinator(self.store, self.config)

    def produce(self, count: int) -> None:
        """``count`` more seqs of every key (key i in partition i % PARTITIONS)."""
        producer = KafkaProducer(bootstrap_servers=self.broker.address, linger_ms=5)
        try:
            sent = []
            for seq in range(self.seqs + 1, self.seqs + count + 1):
                for i, key in enumerate(KEYS):
                    value = json.dumps({"k": key, "seq": seq}).encode()
                    sent.append(
                        (
                            producer.send(
                                self.topic, key=key.encode(), value=value, partition=i % PARTITIONS
                            ),
                            key,
                            seq,
                        )
                    )
            producer.flush()
            for future, key, seq in sent:
                meta = future.get(timeout=30)
                self.produced.append((meta.partition, meta.offset, key, seq))
            self.seqs += count
        finally:
            producer.close()

    def cycle(self, spark) -> None:
        """One cycle; a failed one is counted and re-raised."""
        self.cycles += 1
        try:
            run_cycle(
                spark,
                self.pipeline,
                self.config,
                self.store,
                bootstrap=self.broker.address,
                parallelism=2,
            )
        except Exception:
            self.failed_cycles += 1
            raise

    def cycle_until_done(self, spark, attempts: int = 4) -> None:
        """Cycles until one completes (a fault may break the first; recovery re-runs it)."""
        for attempt in range(attempts):
            try:
                return self.cycle(spark)
            except Exception:
                if attempt == attempts - 1:
                    raise

    def check_exact(self) -> dict[str, int]:
        """Every invariant of the story at its end; returns its numbers for the table."""
        view = self.coordinator.view()
        completed = view.completed
        assert view.pending == [] and all(view.records[c].notified for c in completed)
        layout = Layout(self.name)
        # One _metadata per completed id, none for the others; offsets = barrier ends.
        for cid, record in view.records.items():
            has = self.store.get(layout.metadata(cid)) is not None
            assert has == (record.status is CheckpointStatus.COMPLETED), cid
        chain = [view.metadata(c) for c in completed]
        for meta in chain:
            assert dict(meta.offsets) == dict(self.coordinator.barrier(meta.checkpoint_id).ends)
        latest = dict(chain[-1].offsets)
        ends = {TopicPartition(self.topic, p): 0 for p in range(PARTITIONS)}
        for p, offset, _, _ in self.produced:
            tp = TopicPartition(self.topic, p)
            ends[tp] = max(ends[tp], offset + 1)
        assert latest == ends, "the latest checkpoint did not read the whole topic"
        with KafkaOffsets(self.broker.address, request_timeout_ms=10_000) as kafka:
            assert kafka.committed_group_offsets(self.config.effective_group_id, list(ends)) == ends
        # Per-key sequences: exactly 1..M, in order.
        state = read_keyed_state(self.store, self.name, OPERATOR)
        assert state == {k: {"last": self.seqs, "count": self.seqs, "bad": 0} for k in KEYS}
        # The sink: every record exactly once.
        truth = Counter((k, seq) for _, _, k, seq in self.produced)
        out = Counter()
        for headers, _, value in read_topic(self.broker.address, self.out):
            row = json.loads(value)
            assert headers["mcp-pipeline"] == self.name
            out[(row["k"], row["seq"])] += 1
        lost = sum((truth - out).values())
        duplicated = sum((out - truth).values())
        assert (lost, duplicated) == (0, 0), (
            f"output: {lost} lost, {duplicated} duplicated; (key, seq) x extra copies: "
            f"{sorted((out - truth).items())[:10]}, missing: {sorted((truth - out).items())[:10]}"
        )
        return {"epochs": len(completed), "lost": lost, "duplicated": duplicated}


def report(
    kind: str, story: Story, numbers: dict[str, int], faults: int, recovery: list[float]
) -> None:
    print(
        f"BROKER FAULTS kind={kind} runs=1 epochs={numbers['epochs']} faults={faults} "
        f"cycles={story.cycles} failed_cycles={story.failed_cycles} lost={numbers['lost']} "
        f"duplicated={numbers['duplicated']} violations=0 "
        f"recovery_median_s={statistics.median(recovery):.1f} recovery_max_s={max(recovery):.1f}"
    )


def restart_while_held(spark, story: Story, hold: Hold, monkeypatch, tmp_path: Path) -> float:
    """Run a cycle held at ``hold``; restart the broker while it waits; cycles until one
    completes. Returns the seconds from the broker answering again to that completion."""
    for name, value in hold.env.items():
        monkeypatch.setenv(name, value)
    back: list[float] = []
    failure: list[BaseException] = []
    running = threading.Event()
    running.set()

    def inject() -> None:
        try:
            hold.wait_reached(120, alive=running.is_set)
            story.broker.stop()
            back.append(story.broker.start())
        except BaseException as exc:  # re-raised by the test
            failure.append(exc)
        finally:
            hold.release()

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    try:
        story.cycle_until_done(spark)
    finally:
        running.clear()
        injector.join(180)
        monkeypatch.delenv(next(iter(hold.env)))
    if failure:
        raise failure[0]
    assert len(back) == 1, "the hold point was never reached"
    return time.monotonic() - back[0]


def _story(name: str, broker: Broker, tmp_path: Path, **kwargs) -> Story:
    return Story(f"{name}-{uuid.uuid4().hex[:6]}", broker, tmp_path, **kwargs)


def test_a_broker_restart_in_the_middle_of_a_read(spark, broker, tmp_path, monkeypatch) -> None:
    story = _story("bf-read", broker, tmp_path)
    story.produce(20)
    story.cycle(spark)  # epoch 1, no fault
    recoveries = []
    for round_ in range(2):
        story.produce(40)  # 480 records in 3 partitions: 4 splits each
        hold = Hold(tmp_path / f"hold-read-{round_}", "reading")
        recoveries.append(restart_while_held(spark, story, hold, monkeypatch, tmp_path))
    numbers = story.check_exact()
    report("restart mid-read", story, numbers, 2, recoveries)


def sink_io_threads() -> set[threading.Thread]:
    """The live I/O threads of Kafka sink producers in this process."""
    return {t for t in threading.enumerate() if t.name == "microcheckpoint-sink-network-thread"}


def test_a_broker_restart_in_the_middle_of_a_publish(spark, broker, tmp_path, monkeypatch) -> None:
    others = sink_io_threads()
    story = _story("bf-publish", broker, tmp_path)
    story.produce(20)
    story.cycle(spark)
    # Round 1: the broker restarts between two published partitions; the rest goes out.
    story.produce(30)
    hold = Hold(tmp_path / "hold-publish-1", "publishing")
    recoveries = [restart_while_held(spark, story, hold, monkeypatch, tmp_path)]
    # Round 2: the broker goes down between two published partitions and stays down while
    # the rest is sent: notify fails after _metadata, and the next cycle publishes only what
    # is missing (the sink's dedup by headers).
    story.produce(30)
    hold = Hold(tmp_path / "hold-publish-2", "publishing")
    for name, value in hold.env.items():
        monkeypatch.setenv(name, value)
    done = threading.Event()

    def stop_broker() -> None:
        try:
            hold.wait_reached(120, alive=lambda: not done.is_set())
            broker.stop()
        finally:
            hold.release()

    injector = threading.Thread(target=stop_broker, daemon=True)
    injector.start()
    try:
        with pytest.raises(Exception, match="Kafka sink 'out'"):
            story.cycle(spark)
    finally:
        done.set()
        injector.join(60)
        monkeypatch.delenv(next(iter(hold.env)))
    view = story.coordinator.view()
    latest = view.completed[-1]
    assert not view.records[latest].notified  # completed, its publish unfinished
    assert sink_io_threads() <= others, "a failed commit left its producer's I/O thread running"
    # Exactly the first partition's share went out, and nothing more arrives once the broker
    # is back: the failed commit returned only when none of its sends was pending. (A
    # producer dropped with sends pending delivered them late, after the next commit had
    # found them missing and sent them again: 180 duplicates in one of five runs.)
    broker.start()
    time.sleep(LATE_SEND_WINDOW_S)
    shares = Counter(story.sink._partition_for(k.encode(), 0, 0) for k in KEYS)
    first = min(shares)
    published = {
        p: sum(
            h["mcp-epoch"] == str(latest.value)
            for h, _, _ in read_topic(broker.address, story.out, [p])
        )
        for p in range(PARTITIONS)
    }
    assert published == {p: 30 * shares[p] if p == first else 0 for p in range(PARTITIONS)}
    back = time.monotonic()
    story.cycle_until_done(spark)
    recoveries.append(time.monotonic() - back)
    numbers = story.check_exact()
    report("restart mid-publish", story, numbers, 2, recoveries)


def test_a_broker_down_past_the_timeout_declines_then_recovers(
    spark, broker, tmp_path, monkeypatch
) -> None:
    story = _story("bf-down", broker, tmp_path, read_limit_s=READ_LIMIT_S)
    story.produce(20)
    started = time.monotonic()
    story.cycle(spark)
    clean_s = time.monotonic() - started
    # The checkpoint timeout: longer than a clean cycle plus the broker's stop (up to its
    # 10 s grace) plus the reader's limit (so the reader gives up first, on any machine
    # speed), shorter than the outage. Without the stop's allowance a busy machine expired
    # the checkpoint before the failed cycle ended (seen at a load average of 9).
    timeout_s = max(20.0, 2 * clean_s + 10.0 + READ_LIMIT_S)
    story.config = story.with_timeout(timeout_s)
    story.produce(30)
    hold = Hold(tmp_path / "hold-down", "reading")
    for name, value in hold.env.items():
        monkeypatch.setenv(name, value)
    stopped: list[float] = []

    def stop_broker() -> None:
        try:
            hold.wait_reached(120, alive=lambda: not done.is_set())
            broker.stop()
            stopped.append(time.monotonic())
        finally:
            hold.release()

    done = threading.Event()
    injector = threading.Thread(target=stop_broker, daemon=True)
    injector.start()
    try:
        with pytest.raises(Exception) as failed:
            story.cycle(spark)
    finally:
        done.set()
        injector.join(60)
        monkeypatch.delenv(next(iter(hold.env)))
    assert stopped, "the hold point was never reached"
    # What the DAG's abort_on_failure step does after a failed process step.
    coordinator = story.coordinator
    view = coordinator.view()
    assert view.pending, f"nothing pending after the failed cycle: {view.records}"
    cid = view.pending[0]
    reason = next(
        (line for line in str(failed.value).splitlines() if "KafkaSourceError" in line), ""
    )
    assert f"Check the broker at '{broker.address}'" in reason, str(failed.value)[-2000:]
    abort_failed_run(coordinator, cid, f"the process step failed: {reason}")
    # Down longer than the checkpoint timeout: declined, and an expiry check changes nothing.
    while time.monotonic() < stopped[0] + timeout_s + 1:
        time.sleep(0.2)
    assert coordinator.abort_expired() == []
    outcome = coordinator.view().records[cid].outcome
    assert outcome is not None and outcome.reason is AbortReason.DECLINED
    assert broker.address in outcome.detail
    back = broker.start()
    story.cycle(spark)  # the next checkpoint re-reads the declined one's range
    recovery = time.monotonic() - back
    view = coordinator.view()
    assert [c.value for c in view.completed] == [cid.value - 1, cid.value + 1]
    numbers = story.check_exact()
    report("broker down past the timeout", story, numbers, 1, [recovery])
