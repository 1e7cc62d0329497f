"""The example pipelines end to end: real broker, local Spark, file checkpoints, exact state.

Each test produces a known data set to a fresh topic, runs ``run_cycle`` until the latest
completed checkpoint's offsets reach the end of every partition (at least three epochs,
through ``max_records_per_epoch``), and compares the restored keyed state with a ground
truth computed in plain Python.
"""

from __future__ import annotations

import uuid

import pytest

from examples import nexmark, wordcount
from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.state.reader import read_keyed_state
from microcheckpoint.storage import FileStore

pytestmark = pytest.mark.integration

MAX_CYCLES = 10


def run_to_end(spark, pipeline, store, bootstrap, topic, max_records_per_epoch) -> list[int]:
    """Run cycles until the latest checkpoint covers every record; returns records per epoch."""
    config = CheckpointConfig.from_mapping(
        {
            "pipeline": pipeline.name,
            "storage": store.url,
            "max_records_per_epoch": max_records_per_epoch,
            "retained": 2,
        }
    )
    with KafkaOffsets(bootstrap) as kafka:
        ends = kafka.end_offsets(kafka.partitions(topic))
    counts: list[int] = []
    for _ in range(MAX_CYCLES):
        result = run_cycle(spark, pipeline, config, store, bootstrap=bootstrap, parallelism=2)
        counts.append(result.records)
        if result.metadata.offsets == ends:
            return counts
    pytest.fail(f"{pipeline.name}: offsets {result.metadata.offsets} never reached {ends}")


def test_wordcount_counts_every_word_exactly(kafka_bootstrap, spark, tmp_path):
    topic = f"lines-{uuid.uuid4().hex[:8]}"
    lines = wordcount.generate(kafka_bootstrap, topic, lines=120, seed=7)
    pipeline = wordcount.build(topic)
    store = FileStore("file://" + str(tmp_path / "checkpoints"))

    counts = run_to_end(spark, pipeline, store, kafka_bootstrap, topic, max_records_per_epoch=20)

    assert len(counts) >= 3 and sum(counts) == len(lines)
    assert read_keyed_state(store, pipeline.name, "word-counts") == dict(wordcount.expected(lines))


def test_nexmark_highest_bid_per_window_and_bids_per_bidder(kafka_bootstrap, spark, tmp_path):
    topic = f"bids-{uuid.uuid4().hex[:8]}"
    bids = nexmark.generate_bids(kafka_bootstrap, topic, n=400, seed=11)
    pipeline = nexmark.build(topic)
    store = FileStore("file://" + str(tmp_path / "checkpoints"))

    counts = run_to_end(spark, pipeline, store, kafka_bootstrap, topic, max_records_per_epoch=80)

    assert len(counts) >= 3 and sum(counts) == len(bids)
    highest = read_keyed_state(store, pipeline.name, "highest-bid")
    assert highest == nexmark.highest_bids(bids)
    assert read_keyed_state(store, pipeline.name, "bids-per-bidder") == nexmark.bids_per_bidder(
        bids
    )


def test_nexmark_stages_one_aligned_one_unaligned_checkpoint_exact_counts(
    kafka_bootstrap, spark, tmp_path
):
    # What `make demo-stages` runs: the join stage's second commit holds back partition 1's
    # marker 4 s, so the hot-items stage (aligned_timeout 1 s) takes that checkpoint
    # unaligned; the counts per item and window still equal the truth exactly.
    from harness.demo_stages import run

    result = run(kafka_bootstrap, spark, tmp_path, say=lambda message: None)
    stats = dict(result["stats"])
    assert [stats[cid].mode.value for cid in sorted(stats)] == [
        "aligned", "unaligned", "aligned", "aligned"
    ]  # fmt: skip
    assert [stats[cid].epoch for cid in sorted(stats)] == [1, 2, 3, 4]
    unaligned = stats[2]
    assert unaligned.switched == "aligned_timeout 1 s"
    assert [i.channel.rsplit(":", 1)[1] for i in unaligned.inflight] == ["1"]
    assert result["counts"] == result["truth"]
    assert sum(result["truth"].values()) > 250
    # A global savepoint, a fourth batch, a global restore with parallelism 1 and 3.
    from harness.demo_stages import global_round

    after = global_round(kafka_bootstrap, result, tmp_path, say=lambda message: None)
    assert after["counts"] == after["truth"] != result["truth"]
    assert after["subtasks"] == [f"bids-per-item-window#{i}" for i in range(3)]
