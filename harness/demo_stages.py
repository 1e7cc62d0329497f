"""``make demo-stages``: a two-stage pipeline, one aligned and one unaligned checkpoint.

1. Starts Tansu (the local Kafka-compatible broker) on a loopback port, and local Spark.
2. Produces auctions and bids (examples/nexmark_stages.py) in three batches.
3. Runs stage ``join`` (bids joined with auctions) and stage ``hot-items`` (bids per item
   and window) as separate checkpointed epochs joined by an internal topic. In the second
   round the join's commit holds back partition 1's barrier marker for a few seconds (a
   slow channel, ``MICROCHECKPOINT_SLOW_CHANNEL``) while ``hot-items`` checkpoints: its
   ``aligned_timeout`` of 1 s makes that checkpoint unaligned, with partition 1 in flight.
   The third round is aligned again.
4. Prints each ``hot-items`` checkpoint's alignment statistics, the hot item per window,
   and compares the counts with a ground truth computed from the generated records.
5. Takes a global savepoint of both stages, lets them count a fourth batch, then restores
   both from the global savepoint with other parallelisms (join 1, hot-items 3): the
   fourth batch is counted again, once, and the counts equal the truth again.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness import services
from microcheckpoint.faults import SLOW_CHANNEL_ENV

SLOW_S = 4.0


def _say(message: str) -> None:
    print(f"[demo-stages] {message}", flush=True)


def run(bootstrap: str, spark: Any, root: Path, say=_say) -> dict[str, Any]:
    """The demo's rounds; returns the statistics, the counts and the truth."""
    from examples import nexmark_stages as ex
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.config import CheckpointConfig
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.protocol.coordinator import CheckpointCoordinator
    from microcheckpoint.state.reader import read_keyed_state
    from microcheckpoint.storage import FileStore

    tag = uuid.uuid4().hex[:6]
    topics = {name: f"{name}-{tag}" for name in ("auctions", "bids", "joined")}
    names = (f"nexmark-join-{tag}", f"nexmark-hot-items-{tag}")
    join, hot = ex.build(bootstrap, topics["auctions"], topics["bids"], topics["joined"], names)
    stores = [FileStore((root / name).as_uri()) for name in ("join", "hot-items")]
    configs = [
        CheckpointConfig.from_mapping({"pipeline": names[0], "storage": stores[0].url,
                                       "retained": 10}),
        CheckpointConfig.from_mapping({"pipeline": names[1], "storage": stores[1].url,
                                       "retained": 10, "aligned_timeout": "1s", "timeout": 60}),
    ]  # fmt: skip
    auctions, bids = ex.generate(seed=11, auctions=12, bids=360)
    with KafkaOffsets(bootstrap) as kafka:
        for topic in topics.values():
            kafka.create_topic(topic, 2)

    def cycle(stage: int) -> Any:
        pipeline = (join, hot)[stage]
        return run_cycle(
            spark, pipeline, configs[stage], stores[stage], bootstrap=bootstrap, parallelism=2
        )

    for round_no in range(3):
        ex.produce(bootstrap, topics["auctions"], auctions[round_no * 4 : round_no * 4 + 4])
        ex.produce(bootstrap, topics["bids"], bids[round_no * 120 : round_no * 120 + 120])
        if round_no != 1:
            done = cycle(0)
            say(f"join: checkpoint {done.checkpoint_id} completed ({done.records} records)")
            done = cycle(1)
            say(f"hot-items: checkpoint {done.checkpoint_id} completed (aligned)")
            continue
        flag = root / "slow-channel"
        flag.write_text(f"{topics['joined']}:1 {SLOW_S}")
        os.environ[SLOW_CHANNEL_ENV] = str(flag)
        say(f"join: committing with partition 1's marker held back {SLOW_S:g} s (slow channel)")
        upstream = threading.Thread(target=cycle, args=(0,))
        upstream.start()
        try:
            done = cycle(1)
        finally:
            upstream.join()
            os.environ.pop(SLOW_CHANNEL_ENV, None)
        say(f"hot-items: checkpoint {done.checkpoint_id} completed while partition 1 lagged")
    # The last round's bids of auctions that came late leave the join now; one more each.
    cycle(0)
    cycle(1)
    view = CheckpointCoordinator(stores[1], configs[1]).view()
    stats = [(cid.value, view.pending_record(cid).alignment) for cid in view.completed]
    counts = read_keyed_state(stores[1], names[1], "bids-per-item-window")
    stages = {"names": names, "pipelines": (join, hot), "stores": stores, "configs": configs,
              "topics": topics, "cycle": cycle}  # fmt: skip
    return {"stats": stats, "counts": counts, "truth": dict(ex.truth(auctions, bids)),
            "stages": stages}  # fmt: skip


def global_round(bootstrap: str, result: dict[str, Any], root: Path, say=_say) -> dict[str, Any]:
    """Step 5: a global savepoint, a fourth batch, a global restore with other parallelisms;
    returns the counts, the truth over every batch and the subtasks after the restore."""
    from examples import nexmark_stages as ex
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.engine.cycle import stage_runtime
    from microcheckpoint.protocol.global_savepoints import create_global_savepoint, restore_global
    from microcheckpoint.protocol.layout import Layout
    from microcheckpoint.protocol.view import scan
    from microcheckpoint.state.reader import read_keyed_state
    from microcheckpoint.storage import FileStore

    st = result["stages"]
    names, stores, configs, cycle = st["names"], st["stores"], st["configs"], st["cycle"]
    point = create_global_savepoint(
        dict(zip(names, stores, strict=True)), FileStore((root / "global").as_uri()), "nexmark"
    )
    cut = ", ".join(f"{p.pipeline} at checkpoint {p.checkpoint_id}" for p in point.stages)
    say(f"global savepoint {point.location}: {cut}")
    auctions, bids = ex.generate(seed=11, auctions=12, bids=480)  # the same 360 bids first
    ex.produce(bootstrap, st["topics"]["bids"], bids[360:])
    cycle(0)
    cycle(1)
    say("both stages counted a fourth batch of 120 bids; now restoring both from the "
        "global savepoint with parallelism join 1, hot-items 3")  # fmt: skip
    with KafkaOffsets(bootstrap) as kafka:
        runtimes = {
            name: stage_runtime(pipeline, config, store, kafka)
            for name, pipeline, store, config in zip(
                names, st["pipelines"], stores, configs, strict=True
            )
        }
        markers = restore_global(point, runtimes, parallelism={names[0]: 1, names[1]: 3})
    say(f"hot-items: {markers[names[1]].note}")
    for _ in range(2):  # the fourth batch again, then the bids of late auctions
        cycle(0)
        cycle(1)
    view = scan(stores[1], Layout(names[1]))
    meta = view.metadata(view.completed[-1])
    subtasks = sorted(str(t) for t in meta.acks if str(t.uid) == "bids-per-item-window")
    counts = read_keyed_state(stores[1], names[1], "bids-per-item-window")
    return {"counts": counts, "truth": dict(ex.truth(auctions, bids)), "subtasks": subtasks}


def report(result: dict[str, Any], say=_say) -> bool:
    """Print the statistics and the hot items; True when the counts equal the truth."""
    from examples.nexmark_stages import hot_items

    say("hot-items checkpoints (alignment statistics, ms):")
    say(f"  {'id':>3} {'mode':<10} {'epoch':>5} {'alignment':>9} {'start delay':>11} "
        f"{'waited':>7}  in flight")  # fmt: skip
    for cid, a in result["stats"]:  # each an InputAlignment (one stage input)
        inflight = ", ".join(f"{i.channel} from {i.from_offset}" for i in a.inflight) or "-"
        switched = f" ({a.switched})" if a.switched else ""
        say(f"  {cid:>3} {a.mode.value:<10} {a.epoch:>5} {a.alignment_duration_ms:>9} "
            f"{a.start_delay_ms:>11} {a.waited_ms:>7}  {inflight}{switched}")  # fmt: skip
    say("hot item per 10 s window (item, bids):")
    for window, (item, count) in hot_items(result["counts"]).items():
        say(f"  window {window}: {item} ({count})")
    ok = result["counts"] == result["truth"]
    total = sum(result["counts"].values())
    say(f"RESULT {'OK' if ok else 'MISMATCH'}: {total} joined bids counted, "
        f"{len(result['counts'])} item windows, truth {sum(result['truth'].values())}")  # fmt: skip
    return ok


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from microcheckpoint.engine.spark import local_spark

    root = Path(tempfile.mkdtemp(prefix="mcp-demo-stages-"))
    _say(f"starting the broker and Spark (work folder {root})")
    started = time.monotonic()
    tansu = services.start_tansu(root / "tansu")
    services.quick_jvms()
    spark = local_spark("local[2]", app="demo-stages")
    try:
        result = run(tansu.address, spark, root)
        ok = report(result)
        after = global_round(tansu.address, result, root)
        again = after["counts"] == after["truth"]
        _say(f"RESULT {'OK' if again else 'MISMATCH'} after the global restore: "
             f"{sum(after['counts'].values())} joined bids counted by {len(after['subtasks'])} "
             f"subtasks, truth {sum(after['truth'].values())}")  # fmt: skip
        ok = ok and again
    finally:
        spark.stop()
        tansu.stop()
    _say(f"done in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
