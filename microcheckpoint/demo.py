"""``make demo``: checkpoint cycles on a real broker and a real S3 server, then a table.

What it does (no Spark yet; a later issue runs the epochs in Spark):

1. starts Tansu (Kafka-compatible broker) and moto's S3 server on loopback ports;
2. creates a topic with 3 partitions and produces keyed records between checkpoints;
3. runs checkpoint cycles: trigger (barrier = real end offsets, capped per epoch), one
   source task per partition reads exactly its ``[start, end)`` range and acks with its
   offsets and a state file in S3, the global ack writes ``_metadata``, notify commits the
   consumer-group offsets and applies retention;
4. in one cycle a task "crashes" without acking: the checkpoint expires and is aborted, and
   the next cycle re-reads the same range from the last completed checkpoint;
5. prints the checkpoint history and checks the result against what was produced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from microcheckpoint import devstack
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.coordinator import CheckpointCoordinator
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.pending import Ack, StateHandle

TOPIC = "demo-events"
PARTITIONS = 3
BUCKET = "microcheckpoint-demo"


@dataclass
class Row:
    checkpoint: int
    status: str
    ranges: dict[int, tuple[int, int]]
    duration_ms: int
    note: str = ""


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def read_range(bootstrap: str, tp: TopicPartition, start: int, end: int) -> list:
    """Records of ``tp`` in ``[start, end)``; stops when the position reaches ``end``."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    if end <= start:
        return []
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        ktp = KTP(tp.topic, tp.partition)
        consumer.assign([ktp])
        consumer.seek(ktp, start)
        records = []
        deadline = time.monotonic() + 30
        while consumer.position(ktp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {tp} [{start}, {end}) timed out")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(r for r in batch if start <= r.offset < end)
        return records
    finally:
        consumer.close()


def produce(bootstrap: str, count: int, first_seq: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    try:
        for seq in range(first_seq, first_seq + count):
            key = f"user-{seq % 7}".encode()
            producer.send(
                TOPIC, key=key, value=json.dumps({"seq": seq}).encode(), partition=seq % PARTITIONS
            )
        producer.flush()
    finally:
        producer.close()


def run(cycles: int, per_cycle: int, crash_cycle: int) -> int:
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.adapters.s3 import S3Store, ensure_bucket, make_client
    from microcheckpoint.adapters.startup import startup_offsets

    _say("starting the local broker (Tansu) and S3 server (moto) ...")
    with devstack.local_stack() as stack:
        _say(f"Kafka at {stack.kafka_bootstrap}, S3 at {stack.s3.url}")
        client = make_client(
            stack.s3.url, stack.s3.region, stack.s3.access_key, stack.s3.secret_key
        )
        ensure_bucket(client, BUCKET)
        store = S3Store(client, BUCKET, "checkpoints")
        config = CheckpointConfig.from_mapping(
            {
                "pipeline": "demo",
                "storage": f"s3://{BUCKET}/checkpoints",
                "topics": [TOPIC],
                "timeout": "2s",
                "retained": 3,
                "tolerable_failures": 1,
                "max_records_per_epoch": 150,
            }
        )
        coordinator = CheckpointCoordinator(store, config)
        kafka = KafkaOffsets(stack.kafka_bootstrap, request_timeout_ms=10_000)
        kafka.create_topic(TOPIC, PARTITIONS)
        partitions = kafka.partitions(TOPIC)
        tasks = [TaskId.of("source", tp.partition) for tp in partitions]
        rows: list[Row] = []
        produced = 0
        counts = dict.fromkeys(partitions, 0)  # state restored from the last checkpoint
        try:
            for cycle in range(1, cycles + 1):
                produce(stack.kafka_bootstrap, per_cycle, produced)
                produced += per_cycle
                ends = kafka.end_offsets(partitions)
                pending = coordinator.trigger(
                    tasks, ends, lambda tps: startup_offsets(kafka, config, tps)
                )
                cid = pending.checkpoint_id
                barrier = coordinator.barrier(cid)
                ranges = {tp.partition: (r.start, r.end) for tp, r in barrier.ranges.items()}
                _say(f"cycle {cycle}: checkpoint {cid} barrier {ranges}")
                started = time.monotonic()
                # Process: each source subtask reads its range and snapshots its state.
                new_counts = dict(counts)
                for tp, task in zip(partitions, tasks, strict=True):
                    r = barrier.ranges[tp]
                    records = read_range(stack.kafka_bootstrap, tp, r.start, r.end)
                    new_counts[tp] = counts[tp] + len(records)
                    if cycle == crash_cycle and tp.partition == 1:
                        _say(f"  task {task} crashes before acknowledging (simulated)")
                        continue
                    key = coordinator.layout.state_prefix(cid, pending.attempt, task) + "count.json"
                    body = json.dumps({"records_seen": new_counts[tp]}).encode()
                    store.put(key, body)
                    coordinator.acknowledge(
                        cid,
                        Ack(
                            task,
                            pending.attempt,
                            (StateHandle(key, len(body)),),
                            {str(tp): r.end},
                            int((time.monotonic() - started) * 1000),
                        ),
                    )
                if cycle == crash_cycle:
                    _say(f"  waiting for the checkpoint timeout ({config.timeout:.0f}s) ...")
                    time.sleep(config.timeout + 0.5)
                    expired = coordinator.abort_expired()
                    rows.append(
                        Row(
                            cid.value,
                            "ABORTED",
                            ranges,
                            int((time.monotonic() - started) * 1000),
                            "EXPIRED: task source#1 never acked",
                        )
                    )
                    _say(
                        f"  checkpoint {cid} aborted as EXPIRED: {expired == [cid]}; state stays at the last completed checkpoint"
                    )
                    continue
                meta = coordinator.complete(cid)
                coordinator.notify(
                    cid,
                    lambda offsets: kafka.commit_group_offsets(
                        config.effective_group_id, dict(offsets)
                    ),
                )
                counts = new_counts
                rows.append(
                    Row(
                        cid.value,
                        "COMPLETED",
                        ranges,
                        meta.duration_ms,
                        f"{barrier.record_count} records",
                    )
                )
                _say(f"  checkpoint {cid} completed; group offsets committed")
            return report(coordinator, kafka, partitions, rows, produced, counts, config)
        finally:
            kafka.close()


def report(coordinator, kafka, partitions, rows, produced, counts, config) -> int:
    view = coordinator.view()
    print()
    print(f"Checkpoint history (storage: {coordinator.store.url})")
    header = (
        f"{'id':>3}  {'status':<10} "
        + " ".join(f"{'p' + str(p.partition) + ' [start,end)':>16}" for p in partitions)
        + f"  {'ms':>6}  note"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        stored = view.records.get(CheckpointId(row.checkpoint))
        status = stored.status.value if stored else f"{row.status}*"
        cells = " ".join(f"{'[{}, {})'.format(*row.ranges[p.partition]):>16}" for p in partitions)
        print(f"{row.checkpoint:>3}  {status:<10} {cells}  {row.duration_ms:>6}  {row.note}")
    print(f"(* = no longer stored: dropped by retention, retained={config.retained})")
    latest = view.metadata(view.latest_completed)
    ends = kafka.end_offsets(partitions)
    committed = kafka.committed_group_offsets(config.effective_group_id, partitions)
    checkpointed = sum(latest.offsets.values())
    seen = sum(counts.values())
    print()
    print(f"records produced:                   {produced}")
    print(
        f"latest checkpoint:                  {latest.checkpoint_id} offsets {{{', '.join(f'{tp}: {o}' for tp, o in sorted(latest.offsets.items()))}}}"
    )
    print(f"records covered by that checkpoint: {checkpointed}")
    print(
        f"records counted by the tasks:       {seen} (each exactly once, across the aborted epoch)"
    )
    print(
        f"committed group offsets:            {{{', '.join(f'{tp}: {o}' for tp, o in sorted(committed.items()))}}}"
    )
    print(f"records still to read (lag):        {sum(ends.values()) - checkpointed}")
    ok = (
        seen == checkpointed
        and committed == latest.offsets
        and all(latest.offsets[tp] <= ends[tp] for tp in partitions)
        and sum(ends.values()) == produced
    )
    print()
    print(
        "RESULT: "
        + (
            "OK - counts match the checkpointed offsets exactly, group offsets equal the latest checkpoint"
            if ok
            else "MISMATCH - see the figures above"
        )
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--records-per-cycle", type=int, default=300)
    parser.add_argument(
        "--crash-cycle", type=int, default=3, help="cycle whose task does not ack (0: none)"
    )
    args = parser.parse_args(argv)
    return run(args.cycles, args.records_per_cycle, args.crash_cycle)


if __name__ == "__main__":
    sys.exit(main())
