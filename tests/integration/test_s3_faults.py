"""Checkpoints on S3 under injected faults: the fault proxy between boto3 and SeaweedFS.

Every S3 request of the driver and of the Spark executors goes through
``harness.s3_proxy.S3FaultProxy``, which forwards it to the session's SeaweedFS or injects
a fault by rule. The stories:

- a pipeline runs its epochs under each fault kind (500, 503 SlowDown, connection reset,
  slow response, lost response) and ends exactly: per-key counts equal the ground truth,
  checkpoint ids are contiguous and completed (or aborted with a reason), every
  put-if-absent record was written once (the bucket is versioned, so an overwrite would
  show), and the committed group offsets are the latest ``_metadata``'s. Each run prints one
  ``S3 FAULTS`` line with its numbers (docs/reliability.md);
- a lost response on a put-if-absent the coordinator makes (``_pending``, an ack,
  ``_outcome``, ``_metadata``) is resolved as OK by reading back, and as CONFLICT where
  another writer won;
- the store probe refuses a store that ignores ``If-None-Match`` before anything of the
  pipeline is written, and passes plain SeaweedFS once.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer

from harness.s3_proxy import FaultKind, FaultRule, Op, S3FaultProxy
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import KafkaSource, Pipeline, running_sum
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.errors import CommitConflict, StorageError, StoreNotConformant
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason, Ack
from microcheckpoint.protocol.view import CheckpointStatus, scan
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import WriteOutcome, write_once
from microcheckpoint.storage.probe import MARKER_KEY, forget_probes
from tests.stored import object_versions

pytestmark = pytest.mark.integration

PREFIX = "chk"
PARTITIONS = 2
PER_PARTITION = 24  # records
PER_EPOCH = 12  # records per partition and epoch: 2 epochs
KEYS = [f"key-{i:02d}" for i in range(10)]
SEED = int(os.environ.get("MICROCHECKPOINT_S3_FAULT_SEED", "13"))
# Per kind: how likely a request gets the fault, and at most how many faults a run gets.
FAULTS = {
    FaultKind.ERROR_500: dict(probability=0.15, count=10),
    FaultKind.SLOW_DOWN: dict(probability=0.15, count=10),
    FaultKind.RESET: dict(probability=0.1, count=8),
    FaultKind.SLOW: dict(probability=0.3, count=20, delay_s=0.1),
    # Lost responses matter where a write was applied: writes only, conditional ones first.
    FaultKind.LOST_RESPONSE: dict(
        probability=0.3, count=10, ops=frozenset({Op.CONDITIONAL_PUT, Op.PUT, Op.DELETE})
    ),
}
SET_ONCE = ("_pending", "_outcome", "_metadata", "_attempt-")  # and acks/: put-if-absent


# ---- helpers ------------------------------------------------------------------------


@pytest.fixture
def proxy(s3_endpoint) -> Iterator[S3FaultProxy]:
    keys = (s3_endpoint.access_key, s3_endpoint.secret_key, s3_endpoint.region)
    with S3FaultProxy(s3_endpoint.url, seed=SEED, credentials=keys) as started:
        yield started


def _options(s3_endpoint, url: str) -> dict[str, Any]:
    return {
        "endpoint_url": url,
        "region": s3_endpoint.region,
        "access_key": s3_endpoint.access_key,
        "secret_key": s3_endpoint.secret_key,
    }


def _versioned_bucket(s3_client) -> str:
    bucket = f"mcp-faults-{uuid.uuid4().hex[:10]}"
    ensure_bucket(s3_client, bucket)
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return bucket


def _stores(s3_endpoint, s3_client, proxy: S3FaultProxy, bucket: str) -> tuple[S3Store, S3Store]:
    """The store through the proxy, and the same store straight to SeaweedFS (for checking)."""
    client = make_client(**_options(s3_endpoint, proxy.url))
    return S3Store(client, bucket, PREFIX), S3Store(s3_client, bucket, PREFIX)


def _produce(bootstrap: str, topic: str) -> list[str]:
    """``PER_PARTITION`` one-word lines per partition; returns the words in order."""
    words = [KEYS[(i * 7) % len(KEYS)] for i in range(PARTITIONS * PER_PARTITION)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, word in enumerate(words):
            producer.send(topic, value=word.encode(), partition=i % PARTITIONS)
        producer.flush()
    finally:
        producer.close()
    return words


def _pipeline(name: str, topic: str) -> Pipeline:
    source = KafkaSource(f"{name}-source", [topic], value_format="text")
    return Pipeline(name, source).then(running_sum("counts", key="value"))


def _past_retries(exc: Exception) -> bool:
    """Whether ``exc`` is faults outlasting the retries (the store looked unreachable), on
    the driver or in an executor (where Spark wraps it)."""
    if isinstance(exc, StoreNotConformant):
        return False
    if isinstance(exc, StorageError):
        return True
    text = str(exc)
    return "CommitOutcomeUnknown" in text or "microcheckpoint.errors.StorageError" in text


def _invariant_violations(store: S3Store, s3_client, bucket: str, name: str, kafka) -> list[str]:
    """What breaks the protocol's promises, read from SeaweedFS directly (empty when all hold)."""
    layout = Layout(name)
    view = scan(store, layout)
    problems: list[str] = []
    ids = [r.checkpoint_id.value for r in view.records.values()]
    if ids != list(range(1, len(ids) + 1)):
        problems.append(f"checkpoint ids are not contiguous: {ids}")
    for cid, record in view.records.items():
        if record.status is CheckpointStatus.ABORTED and record.abort_reason is None:
            problems.append(f"{cid} aborted without a reason")
        elif record.status not in (CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED):
            problems.append(f"{cid} ended {record.status.name}")
        elif record.status is CheckpointStatus.COMPLETED:
            ends = view.pending_record(cid).barrier.ends
            if dict(view.metadata(cid).offsets) != dict(ends):
                problems.append(f"{cid}: _metadata offsets differ from barrier {cid}'s ends")
    versions = object_versions(s3_client, bucket, f"{PREFIX}/{name}/")
    for key, count in versions.items():
        base = key.rsplit("/", 1)[-1]
        if (base.startswith(SET_ONCE) or "/acks/" in key) and count != 1:
            problems.append(f"{key} was written {count} times")
    latest = view.latest_completed
    if latest is None:
        problems.append("no checkpoint completed")
    else:
        offsets = view.metadata(latest).offsets
        group = CheckpointConfig.from_mapping(
            {"pipeline": name, "storage": store.url}
        ).effective_group_id
        committed = kafka.committed_group_offsets(group, list(offsets))
        if committed != dict(offsets):
            problems.append(f"committed {committed} != latest _metadata {dict(offsets)}")
    return problems


# ---- 1. epochs under each fault kind end exactly ----------------------------------------


@pytest.mark.parametrize("kind", list(FAULTS), ids=lambda k: k.name.lower())
def test_epochs_under_s3_faults_end_exactly(
    kind: FaultKind, proxy, spark, kafka_bootstrap, s3_endpoint, s3_client
) -> None:
    began = time.monotonic()
    name = f"faults-{kind.name.lower().replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(name, PARTITIONS)
        truth = Counter(_produce(kafka_bootstrap, name))
        bucket = _versioned_bucket(s3_client)
        store, direct = _stores(s3_endpoint, s3_client, proxy, bucket)
        config = CheckpointConfig.from_mapping(
            {
                "pipeline": name,
                "storage": store.url,
                "max_records_per_epoch": PER_EPOCH,
                "retained": 10,
            }
        )
        # A few faults on conditional writes for sure, then the kind's rule on everything.
        proxy.add(FaultRule(kind, frozenset({Op.CONDITIONAL_PUT}), probability=0.3, count=3))
        proxy.add(FaultRule(kind, **FAULTS[kind]))  # type: ignore[arg-type]
        target = {TopicPartition(name, p): PER_PARTITION for p in range(PARTITIONS)}
        cycles, failed, broken = 0, [], []
        # Cycles until the input is checkpointed. A cycle whose faults outlast the retries
        # fails and is run again; any other failure is a defect.
        while cycles < 8:
            cycles += 1
            try:
                result = run_cycle(
                    spark,
                    _pipeline(name, name),
                    config,
                    store,
                    bootstrap=kafka_bootstrap,
                    parallelism=2,
                    store_options=_options(s3_endpoint, proxy.url),
                )
            except Exception as exc:
                (failed if _past_retries(exc) else broken).append(f"{type(exc).__name__}: {exc}")
                continue
            if result.metadata is not None and dict(result.metadata.offsets) == target:
                break
        proxy.clear()
        state = read_keyed_state(direct, name, "counts")
        lost = sum(max(0, n - state.get(k, 0)) for k, n in truth.items())
        duplicated = sum(max(0, n - truth.get(k, 0)) for k, n in state.items())
        violations = _invariant_violations(direct, s3_client, bucket, name, kafka)
    epochs = len(scan(direct, Layout(name)).completed)
    injected = proxy.injected[kind]
    conditional = sum(1 for f in proxy.faults if f.op is Op.CONDITIONAL_PUT)
    print(
        f"\nS3 FAULTS kind={kind.value!r} seed={SEED} runs=1 epochs={epochs} cycles={cycles} "
        f"failed_cycles={len(failed)} broken_cycles={len(broken)} requests={len(proxy.requests)} "
        f"faults={injected} "
        f"on_conditional_puts={conditional} "
        f"lost={lost} duplicated={duplicated} violations={len(violations)} "
        f"seconds={time.monotonic() - began:.1f}"
    )
    assert conditional > 0, "no fault on a conditional write: the run proves little"
    assert violations == []
    assert (lost, duplicated) == (0, 0)
    assert state == dict(truth)
    assert epochs == PER_PARTITION // PER_EPOCH
    assert broken == []  # e.g. a conflict with our own write, a refused store


# ---- 2. a lost response on a put-if-absent is resolved by reading back --------------------

SRC, AGG = TaskId.of("source", 0), TaskId.of("agg", 0)
TP = TopicPartition("events", 0)
C1 = CheckpointId(1)


def _coordinator(store: S3Store, name: str) -> CheckpointCoordinator:
    config = CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url})
    return CheckpointCoordinator(store, config)


def _ack(coordinator: CheckpointCoordinator, task: TaskId) -> AckResult:
    return coordinator.acknowledge(C1, Ack(task=task, attempt=1))


@pytest.mark.parametrize("record", ["_pending", "acks/00001/agg#0.json", "_outcome", "_metadata"])
def test_a_lost_response_on_a_put_if_absent_is_resolved_as_ok(
    record: str, proxy, s3_endpoint, s3_client
) -> None:
    bucket = _versioned_bucket(s3_client)
    store, direct = _stores(s3_endpoint, s3_client, proxy, bucket)
    name = f"lost-{uuid.uuid4().hex[:8]}"
    coordinator = _coordinator(store, name)
    proxy.add(
        FaultRule(
            FaultKind.LOST_RESPONSE,
            frozenset({Op.CONDITIONAL_PUT}),
            key=f"{PREFIX}/{name}/chk-0000000001/{record}",
            count=1,
        )
    )

    # A whole checkpoint: each step's put-if-absent is one the response may be lost of.
    pending = coordinator.trigger((SRC, AGG), {TP: 10}, lambda tps: dict.fromkeys(tps, 0))
    acks = [_ack(coordinator, SRC), _ack(coordinator, AGG)]
    meta = coordinator.complete(C1)

    assert proxy.injected == Counter({FaultKind.LOST_RESPONSE: 1})
    assert pending.checkpoint_id == C1  # not a second id allocated after our own win
    assert acks == [AckResult.SUCCESS, AckResult.SUCCESS]  # not DUPLICATE
    assert meta.checkpoint_id == C1
    view = scan(direct, Layout(name))
    assert view.completed == [C1] and view.pending == []
    versions = object_versions(s3_client, bucket, f"{PREFIX}/{name}/chk-0000000001/")
    assert versions[f"{PREFIX}/{name}/chk-0000000001/{record}"] == 1


class RivalFirst(S3Store):
    """A store through the proxy where, just before our put-if-absent of ``trap``, a rival
    writer decides that key (the timeout's abort racing our completion)."""

    def __init__(self, client: Any, bucket: str, trap: str, rival: Any) -> None:
        super().__init__(client, bucket, PREFIX)
        self.trap, self.rival = trap, rival

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        if key == self.trap and self.rival is not None:
            rival, self.rival = self.rival, None
            rival()
        return super().put_if_absent(key, data)


def test_a_lost_response_where_another_writer_won_is_a_conflict(
    proxy, s3_endpoint, s3_client
) -> None:
    bucket = _versioned_bucket(s3_client)
    _, direct = _stores(s3_endpoint, s3_client, proxy, bucket)
    name = f"rival-{uuid.uuid4().hex[:8]}"
    rival = _coordinator(direct, name)
    key = f"{name}/chk-0000000001/_outcome"
    store = RivalFirst(
        make_client(**_options(s3_endpoint, proxy.url)),
        bucket,
        key,
        lambda: rival.abort(C1, AbortReason.EXPIRED, "timeout"),
    )
    ours = _coordinator(store, name)
    ours.trigger((SRC,), {TP: 10}, lambda tps: dict.fromkeys(tps, 0))
    assert _ack(ours, SRC) is AckResult.SUCCESS
    proxy.add(
        FaultRule(FaultKind.LOST_RESPONSE, frozenset({Op.CONDITIONAL_PUT}), key=f"{PREFIX}/{key}")
    )

    # Our claim of COMPLETED reaches the store after the rival's abort; its reply is lost.
    with pytest.raises(CommitConflict, match="already decided by another writer: ABORTED EXPIRED"):
        ours.complete(C1)

    assert proxy.injected == Counter({FaultKind.LOST_RESPONSE: 1})
    record = scan(direct, Layout(name)).records[C1]
    assert record.status is CheckpointStatus.ABORTED
    assert record.abort_reason is AbortReason.EXPIRED
    # The same through the port: the rival's bytes are there, so ours lost.
    assert write_once(store, key, b"ours") is WriteOutcome.CONFLICT
    assert proxy.injected == Counter({FaultKind.LOST_RESPONSE: 2})
    assert object_versions(s3_client, bucket, f"{PREFIX}/{key}")[f"{PREFIX}/{key}"] == 1


# ---- 3. the store probe ---------------------------------------------------------------


def test_a_store_that_ignores_if_none_match_is_refused_before_the_first_checkpoint(
    proxy, spark, kafka_bootstrap, s3_endpoint, s3_client
) -> None:
    bucket = _versioned_bucket(s3_client)
    store, direct = _stores(s3_endpoint, s3_client, proxy, bucket)
    name = f"strip-{uuid.uuid4().hex[:8]}"
    with KafkaOffsets(kafka_bootstrap) as kafka:
        kafka.create_topic(name, PARTITIONS)
    _produce(kafka_bootstrap, name)
    config = CheckpointConfig.from_mapping({"pipeline": name, "storage": store.url})
    proxy.add(FaultRule(FaultKind.STRIP_IF_NONE_MATCH, frozenset({Op.CONDITIONAL_PUT})))

    with pytest.raises(StoreNotConformant) as exc:
        run_cycle(
            spark,
            _pipeline(name, name),
            config,
            store,
            bootstrap=kafka_bootstrap,
            parallelism=1,
            store_options=_options(s3_endpoint, proxy.url),
        )

    token = next(k for _, k in proxy.requests if "/if-none-match/" in k).rsplit("/", 1)[1]
    assert str(exc.value) == (
        f"checkpoint storage s3://{bucket}/{PREFIX} at {proxy.url} does not honour "
        f"put-if-absent (If-None-Match: *): a second put-if-absent of "
        f"_probe/if-none-match/{token} must be refused, but the second write answered OK. "
        "With such a store two writers can both win a checkpoint id, an ack or an outcome: "
        "checkpoints would hold duplicated or lost data, so no checkpoint is taken. Use a "
        "store that supports conditional writes (AWS S3, or MinIO with its read quorum "
        "available), or a file:// store"
    )
    assert proxy.injected[FaultKind.STRIP_IF_NONE_MATCH] == 2  # A and B both went plain
    assert list(direct.list()) == []  # nothing of the pipeline, no marker
    assert not direct.exists(MARKER_KEY)


def test_plain_seaweedfs_passes_the_probe_and_it_runs_once_per_root(
    proxy, s3_endpoint, s3_client
) -> None:
    bucket = _versioned_bucket(s3_client)
    store, direct = _stores(s3_endpoint, s3_client, proxy, bucket)
    marker = f"{PREFIX}/{MARKER_KEY}"

    _coordinator(store, "one").trigger((SRC,), {TP: 10}, lambda tps: dict.fromkeys(tps, 0))
    forget_probes()  # another process: it reads the marker once and probes no more
    proxy.requests.clear()
    _coordinator(store, "two").trigger((SRC,), {TP: 10}, lambda tps: dict.fromkeys(tps, 0))

    assert direct.exists(MARKER_KEY)
    assert [k for k in direct.list("_probe/")] == [MARKER_KEY]
    assert object_versions(s3_client, bucket, marker)[marker] == 1  # written once
    probe = [(op, key) for op, key in proxy.requests if "/_probe/" in f"/{key}"]
    assert probe == [(Op.GET, marker)]
