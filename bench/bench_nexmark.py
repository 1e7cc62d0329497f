"""Nexmark q5 and q7: the engine against Spark Structured Streaming on the same Parquet files.

Input: :func:`examples.nexmark_data.generate` (200,000 bids by default, ``--quick`` 20,000,
bounded out-of-orderness ``MAX_DELAY_MS``) written as ``FILES`` Parquet files in arrival
order (``<dir>/bids/part-NNNNN.parquet``), one file per epoch.

- q5, hot items: per sliding window (10 s, slide 2 s) the auctions with the most bids;
- q7, highest bid: per tumbling window (10 s) the bids with the top price.

Spark Structured Streaming (SS) reads ``readStream.schema(...).parquet(<dir>/bids)``, makes
``ts = timestamp_millis(date_time)``, ``withWatermark("ts", "<MAX_DELAY_MS> milliseconds")``
and aggregates per ``window(ts, size, slide)`` in append mode with the RocksDB state store
(changelog checkpointing, the session of ``bench_engine``), into a Parquet sink, with a
checkpoint location in a temporary folder. SS has no top-with-ties aggregate, so:

- q5 chains two aggregations (append mode allows it): bids per (window, auction), then per
  window (``window(window_time(w), slide)`` names the window by its end) the maximum and
  the ``collect_list`` of (num, auction), filtered to the maximum and exploded;
- q7 keeps per window ``max(price)`` and the ``collect_list`` of its bids, filtered and
  exploded.

Epochs: ``per_epoch`` mode starts one ``Trigger.AvailableNow`` query per new file (as a
scheduled job runs it, like ``bench_engine``); ``one_start`` runs one query over every file
with ``maxFilesPerTrigger=1`` (a micro-batch per file, no restart). The timed figure is the
whole folder; medians over ``--rounds`` runs, each from a fresh checkpoint, systems
alternating which goes first.

Check: in append mode SS emits a window once the watermark (max event time - delay) has
reached its end, so after the last file it has emitted exactly the windows with
``window_end <= max(date_time) - MAX_DELAY_MS``; its rows must equal (sorted, as lists)
the ground truth's rows of those windows (:mod:`examples.nexmark_truth`).

Run: ``.venv/bin/python -m bench.bench_nexmark [--spark-only] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench._common import table, write_results
from bench.bench_engine import PARALLELISM, session, timed
from examples.nexmark_data import (
    NexmarkConfig,
    generate,
    q5_hot_items,
    q7_highest_bid,
    write_parquet,
)

__all__ = [
    "QUERIES",
    "StructuredStreaming",
    "check",
    "main",
    "run",
    "run_ours",
    "run_spark",
    "truth_of",
]

QUERIES = ("q5", "q7")
MAX_DELAY_MS = 2_000
SIZE_MS, SLIDE_MS = 10_000, 2_000
FILES = 10
MODES = ("per_epoch", "one_start")
BID_DDL = "auction long, bidder long, price long, date_time long"


def run_ours(query: str, files_dir: Path) -> float:
    """Seconds the engine takes for ``query`` over every file of ``files_dir/bids``.

    One ``run_cycle`` per file (``max_files_per_epoch=1``: an epoch per file, as SS's
    ``per_epoch`` mode starts one ``AvailableNow`` query per file) of the one-stage pipeline
    of :mod:`examples.nexmark_queries` (window operators on the keyed process API, event
    time with the bound ``MAX_DELAY_MS``, into a ``FileSink``), in the shared session with
    ``PARALLELISM`` subtasks, from a fresh checkpoint folder on local disk. Untimed, after:
    its rows must equal the ground truth's rows of the windows the final watermark closed
    (``check``, as SS's; the engine fires a window once ``window_end - 1`` <= max event
    time - bound - 1, the windows SS's append mode has emitted).
    """
    from examples.nexmark_data import read_parquet
    from examples.nexmark_queries import q5, q7, read_epochs
    from microcheckpoint.config import CheckpointConfig
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.storage import FileStore

    bids_dir = Path(files_dir) / "bids"
    root = Path(tempfile.mkdtemp(prefix=f"bench-nexmark-ours-{query}-"))
    try:
        spark = session()
        sink = (root / "out").as_uri()
        build = q5 if query == "q5" else q7
        pipeline = build(bids_dir.as_uri(), sink, bound_ms=MAX_DELAY_MS)
        store = FileStore((root / "checkpoints").as_uri())
        config = CheckpointConfig.from_mapping({"pipeline": pipeline.name, "storage": store.url})
        files = len(list(bids_dir.glob("*.parquet")))

        def epochs() -> None:
            for _ in range(files):
                run_cycle(spark, pipeline, config, store, bootstrap="", parallelism=PARALLELISM)

        seconds = timed(epochs)
        rows = [r for epoch in read_epochs(sink, pipeline.name).values() for r in epoch]
        bids = read_parquet(bids_dir)
        watermark = max(b["date_time"] for b in bids) - MAX_DELAY_MS
        check(query, sorted(rows, key=_row_key), truth_of(query, bids), watermark, "ours")
        return seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


class StructuredStreaming:
    """One SS query (``q5`` or ``q7``) over a folder that grows by one file per epoch."""

    def __init__(self, spark: Any, query: str, files_dir: Path, root: Path) -> None:
        self.spark, self.query = spark, query
        self.source = Path(files_dir) / "bids"
        self.input, self.output = root / "ss-input", root / "ss-output"
        self.checkpoint = root / "ss-checkpoint"
        self.input.mkdir(parents=True)

    def frame(self, max_files: int | None) -> Any:
        """The streaming result of the query (columns as the ground truth's rows)."""
        from pyspark.sql import functions as F

        reader = self.spark.readStream.schema(BID_DDL)
        if max_files:
            reader = reader.option("maxFilesPerTrigger", max_files)
        bids = (
            reader.parquet(str(self.input))
            .withColumn("ts", F.timestamp_millis("date_time"))
            .withWatermark("ts", f"{MAX_DELAY_MS} milliseconds")
        )
        if self.query == "q5":
            window = F.window("ts", f"{SIZE_MS} milliseconds", f"{SLIDE_MS} milliseconds")
            counts = bids.groupBy(window.alias("w"), "auction").agg(F.count("*").alias("num"))
            by_end = F.window(F.window_time("w"), f"{SLIDE_MS} milliseconds").alias("w")
            top = counts.groupBy(by_end).agg(
                F.max("num").alias("top"), F.collect_list(F.struct("num", "auction")).alias("c")
            )
            fields, measure = ["x.auction", "x.num"], "num"
            start = F.unix_millis("w.end") - SIZE_MS
        else:
            window = F.window("ts", f"{SIZE_MS} milliseconds").alias("w")
            top = bids.groupBy(window).agg(
                F.max("price").alias("top"),
                F.collect_list(F.struct("auction", "bidder", "price")).alias("c"),
            )
            fields, measure = ["x.auction", "x.bidder", "x.price"], "price"
            start = F.unix_millis("w.start")
        winners = F.filter("c", lambda x: x[measure] == F.col("top"))
        return top.select("w", F.explode(winners).alias("x")).select(
            start.alias("window_start"), F.unix_millis("w.end").alias("window_end"), *fields
        )

    def start(self, max_files: int | None) -> None:
        """One ``AvailableNow`` run: every file not read yet, then a no-data batch."""
        query = (
            self.frame(max_files)
            .writeStream.outputMode("append")
            .format("parquet")
            .option("path", str(self.output))
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def run(self, mode: str) -> None:
        """Read every source file: one start per file (``per_epoch``) or one start in all."""
        files = sorted(self.source.glob("*.parquet"))
        for path in files:
            os.link(path, self.input / path.name)
            if mode == "per_epoch":
                self.start(None)
        if mode == "one_start":
            self.start(1)

    def rows(self) -> list[dict[str, Any]]:
        """What the Parquet sink holds, as sorted rows."""
        if not self.output.exists():
            return []
        rows = [r.asDict() for r in self.spark.read.parquet(str(self.output)).collect()]
        return sorted(rows, key=_row_key)


def _row_key(row: dict[str, Any]) -> tuple:
    """Sort rows of both queries: window, auction, then bidder and price (q7) or num (q5)."""
    return (
        row["window_start"],
        row["auction"],
        row.get("bidder", 0),
        row.get("price", 0),
        row.get("num", 0),
    )


def truth_of(query: str, bids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ground truth's rows of ``query`` (every window, closed or not)."""
    if query == "q5":
        return sorted(q5_hot_items(bids, SIZE_MS, SLIDE_MS), key=_row_key)
    return sorted(q7_highest_bid(bids, SIZE_MS), key=_row_key)


def check(
    query: str,
    got: list[dict[str, Any]],
    truth: list[dict[str, Any]],
    watermark: int,
    system: str = "SS",
) -> dict[str, Any]:
    """``system``'s rows against the ground truth's rows of the windows ``watermark`` closed.

    Append mode emits a window once the watermark reaches its end (``window_end <=
    watermark``, the boundary included: tried with a window ending at the watermark).

    Raises:
        SystemExit: the rows differ (the first few differences named).
    """
    expected = [r for r in truth if r["window_end"] <= watermark]
    if got != expected:
        missing = [r for r in expected if r not in got][:3]
        extra = [r for r in got if r not in expected][:3]
        raise SystemExit(
            f"{query}: {system} differs from the ground truth: missing {missing}, extra {extra}"
        )
    return {
        "rows": len(got),
        "windows_emitted": len({r["window_start"] for r in got}),
        "windows_in_truth": len({r["window_start"] for r in truth}),
        "final_watermark_ms": watermark,
        "exact": True,
    }


def run_spark(spark: Any, query: str, files_dir: Path, mode: str) -> tuple[float, list[dict]]:
    """Seconds SS takes for ``query`` over ``files_dir`` from a fresh checkpoint, and its rows."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-nexmark-{query}-"))
    try:
        ss = StructuredStreaming(spark, query, files_dir, root)
        seconds = timed(lambda: ss.run(mode))
        return seconds, ss.rows()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(bids: int, rounds: int, spark_only: bool, modes: tuple[str, ...] = MODES) -> dict:
    """Every query and mode: ``rounds`` timed runs per system (after one untimed warm-up),
    alternating which system goes first; medians, ratios and SS's exactness check.

    Steps:
        1. generate the events, write the Parquet files, compute the ground truths;
        2. per query and mode, warm up, then alternate the systems ``rounds`` times;
        3. check SS's output of every run (warm-up included) against the ground truth.
    """
    files_dir = Path(tempfile.mkdtemp(prefix="bench-nexmark-input-"))
    load = [round(x, 2) for x in os.getloadavg()]
    spark = session()
    try:
        # Step 1
        events = generate(NexmarkConfig(bids=bids, max_delay_ms=MAX_DELAY_MS))
        write_parquet(events, files_dir, files=FILES)
        watermark = max(b["date_time"] for b in events.bids) - MAX_DELAY_MS
        results: dict[str, Any] = {
            "bids": bids,
            "files": FILES,
            "max_delay_ms": MAX_DELAY_MS,
            "load_average_at_start": load,
        }
        for query in QUERIES:
            truth = truth_of(query, events.bids)
            for mode in modes:
                # Step 2
                seconds: dict[str, list[float]] = {"spark_ss": []}
                if not spark_only:
                    seconds["ours"] = []
                for round_no in range(rounds + 1):
                    for system in sorted(seconds, reverse=bool(round_no % 2)):
                        if system == "spark_ss":
                            took, got = run_spark(spark, query, files_dir, mode)
                            # Step 3
                            checked = check(query, got, truth, watermark)
                        else:
                            took = run_ours(query, files_dir)
                        if round_no:
                            seconds[system].append(round(took, 3))
                median = {k: round(statistics.median(v), 3) for k, v in seconds.items()}
                entry = {"seconds": seconds, "median": median, "check": checked}
                if "ours" in median:
                    entry["ratio"] = round(median["ours"] / median["spark_ss"], 3)
                results[f"{query}_{mode}"] = entry
        return results
    finally:
        spark.stop()
        shutil.rmtree(files_dir, ignore_errors=True)


def report(results: dict[str, Any]) -> str:
    """One line per query and mode: medians, the ratio and the check."""
    rows = []
    for name, entry in results.items():
        if not isinstance(entry, dict):
            continue
        median, c = entry["median"], entry["check"]
        rows.append(
            [name, f"{median['spark_ss']:.2f} s", f"{median['ours']:.2f} s" if "ours" in median else "-",
             f"{entry['ratio']:.2f}x" if "ratio" in entry else "-",
             f"{c['rows']} rows, {c['windows_emitted']}/{c['windows_in_truth']} windows, exact"]
        )  # fmt: skip
    return table(rows, ["query", "Spark SS", "ours", "ratio", "SS vs ground truth"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark-only", action="store_true", help="only SS (and its check)")
    parser.add_argument("--quick", action="store_true", help="20,000 bids, 1 round")
    parser.add_argument("--bids", type=int, help="bids to generate (default 200,000)")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 3, --quick 1)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    bids = args.bids or (20_000 if args.quick else 200_000)
    rounds = args.rounds or (1 if args.quick else 3)
    results = run(bids, rounds, args.spark_only, tuple(args.modes))
    path = write_results("bench_nexmark", results)
    print(json.dumps(results, indent=2))
    print()
    print(report(results))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
