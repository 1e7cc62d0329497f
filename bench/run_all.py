"""``make bench``: every benchmark of the engine in one run, a table, and ``latest.json``.

Runs ``bench_engine`` (this engine vs Spark Structured Streaming on the same Parquet files,
a user's function vs the built-in count, a Kafka epoch vs a file epoch, the empty epoch on
disk and on S3, peak memory), ``bench_nexmark`` (Nexmark q5 and q7, windows with a
watermark, vs SS's windowed aggregation), ``bench_reader`` (the Kafka source vs bare
kafka-python and confluent-kafka loops, with and without JSON decoding) and
``bench_airflow`` (checkpoints through Airflow with the Connect server and with in-process
Spark); reads the S3 request counts ``bench.s3_requests`` wrote (``make bench`` runs it
first); prints today's figures beside the ones the issues started from, each with its
target and whether this run meets it, and writes ``bench/results/latest.json``.

Run: ``make bench`` or ``.venv/bin/python -m bench.run_all [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

from bench._common import RESULTS, table

# What the engine measured before the Arrow rewrite (issue 10), on the same machine kind.
BEFORE = {
    "100k": "5.5 s",
    "1m": "41.9 s",
    "1m_keys": "-",
    "empty": "0.39 s",
    "reader": "0.37x",
    "airflow": "20.5 s",
}
# Issue 28's targets (and the earlier ones it keeps): key -> (at most / at least, value).
TARGETS: dict[str, tuple[str, float]] = {
    "vs_spark_ss_100k": ("<=", 0.8),
    "vs_spark_ss_1m": ("<=", 0.8),
    "vs_spark_ss_1m_keys": ("<=", 0.25),
    "growth_vs_spark_ss": ("<=", 1.0),
    "kafka_vs_file_100k": ("<=", 1.3),
    "reader_vs_confluent_json": ("<=", 1.5),
    "reader_vs_kafka_python": (">=", 0.9),
    "udf_vs_builtin_100k": ("<=", 1.2),
    "empty_epoch": ("<=", 0.1),
    "s3_empty_epoch": ("<=", 0.15),
    "s3_sequential_round_trips": ("<=", 4),
    "airflow_checkpoint_p50_connect": ("<=", 1.0),
    "airflow_dag_run_wall_p50_connect": ("<=", 3.0),
    "memory_vs_spark_ss": ("<=", 1.0),
    "nexmark_q5": ("<=", 1.0),
    "nexmark_q7": ("<=", 1.0),
}


def target(name: str, value: float | None = None, unit: str = "") -> str:
    """``name``'s target as text, and whether ``value`` meets it (``met`` / ``NOT met``)."""
    op, bound = TARGETS[name]
    text = f"{op} {bound:g}{unit}"
    if value is None:
        return text
    met = value <= bound if op == "<=" else value >= bound
    return f"{text}: {'met' if met else 'NOT met'}"


# Nexmark's modes: SS started once per file with AvailableNow, as a scheduled epoch runs (the
# comparison of the issue); and one long SS query fed a file per trigger (the strict one).
NEXMARK_MODES = {"per_epoch": "a start per file", "one_start": "one long query"}


def machine() -> dict[str, Any]:
    with open("/proc/meminfo") as meminfo:
        total_kb = int(meminfo.readline().split()[1])
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(total_kb / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def s3_counts() -> dict[str, int]:
    """An epoch's S3 requests at parallelism 2 and 8 (one partition), from the results of
    ``bench.s3_requests``, which ``make bench`` runs first: its LISTs, and its requests that
    did not overlap in time (observed through the logging proxy)."""
    with open(RESULTS / "s3_requests.json") as file:
        found = {(r["partitions"], r["parallelism"]): r for r in json.load(file)["results"]}
    return {
        "s3_list_per_epoch_p2": found[(1, 2)]["kinds"]["LIST"],
        "s3_list_per_epoch_p8": found[(1, 8)]["kinds"]["LIST"],
        "s3_requests_per_epoch_p2": found[(1, 2)]["total"],
        "s3_requests_per_epoch_p8": found[(1, 8)]["total"],
        "s3_sequential_round_trips": found[(1, 2)]["sequential_observed"],
    }


def summarize(
    engine: dict, reader: dict, airflow: dict, nexmark: dict, host: dict | None = None
) -> dict[str, Any]:
    """The figures of ``latest.json`` from the four benchmarks' results; ``host`` is
    ``machine()`` as the run started (its load average then)."""

    def ratio(name: str) -> float:
        median = engine[name]["median"]
        return round(median["ours"] / median["spark_ss"], 3)

    memory, proportional = engine["peak_rss_mb"], engine["peak_pss_mb"]
    return {
        "ratios": {
            "vs_spark_ss_100k": ratio("100k"),
            "vs_spark_ss_1m": ratio("1m"),
            "vs_spark_ss_1m_keys": ratio("1m_keys"),
            "reader_vs_kafka_python": reader["ratio"],
            "reader_vs_confluent_kafka": reader["ratio_vs_confluent"],
            "reader_vs_confluent_json": reader["json_vs_confluent"],
            "kafka_vs_file_100k": engine["kafka_100k"]["ratio"],
            "udf_vs_builtin_100k": engine["udf_100k"]["ratio"],
            # how much more our time grows from 100k to 1M records than SS's does
            "growth_vs_spark_ss": round(ratio("1m") / ratio("100k"), 3),
            "memory_vs_spark_ss": round(memory["ours"]["total"] / memory["spark_ss"]["total"], 3),
            "memory_pss_vs_spark_ss": round(
                proportional["ours"]["total"] / proportional["spark_ss"]["total"], 3
            ),
            **{
                f"nexmark_{q}_{mode}": nexmark[f"{q}_{mode}"]["ratio"]
                for q in ("q5", "q7")
                for mode in NEXMARK_MODES
            },
        },
        "seconds": {
            "empty_epoch": engine["empty"]["median"]["ours"],
            "s3_empty_epoch": engine["s3_empty"]["median"],
            "empty_epoch_spark_ss": engine["empty"]["median"]["spark_ss"],
            "airflow_checkpoint_p50_connect": airflow["connect"]["p50"]["trigger_to_notified_s"],
            "airflow_checkpoint_p50_local": airflow["local"]["p50"]["trigger_to_notified_s"],
            "airflow_dag_run_wall_p50_connect": airflow["connect"]["p50"]["dag_run_wall_s"],
            **{f"{w}_ours": engine[w]["median"]["ours"] for w in ("100k", "1m", "1m_keys")},
            **{f"{w}_spark_ss": engine[w]["median"]["spark_ss"] for w in ("100k", "1m", "1m_keys")},
        },
        "counts": s3_counts(),
        "peak_rss_mb": memory,
        "peak_pss_mb": proportional,
        "machine": host or machine(),
        "details": {"engine": engine, "reader": reader, "airflow": airflow, "nexmark": nexmark},
    }


def report(latest: dict[str, Any]) -> str:
    """The side-by-side table."""
    s, r, c = latest["seconds"], latest["ratios"], latest["counts"]
    a = latest["details"]["airflow"]
    mem, pss = latest["peak_rss_mb"], latest["peak_pss_mb"]

    def sec(x: float) -> str:
        return f"{x:.2f} s"

    def x(name: str) -> str:
        return f"{r[name]:.2f}x"

    engine, reader = latest["details"]["engine"], latest["details"]["reader"]
    rows = [
        ["100k records, 10k keys", BEFORE["100k"], sec(s["100k_ours"]), sec(s["100k_spark_ss"]),
         x("vs_spark_ss_100k"), target("vs_spark_ss_100k", r["vs_spark_ss_100k"])],
        ["1M records, 10k keys", BEFORE["1m"], sec(s["1m_ours"]), sec(s["1m_spark_ss"]),
         x("vs_spark_ss_1m"), target("vs_spark_ss_1m", r["vs_spark_ss_1m"])],
        ["100k records, 1M keys, 1% touched", BEFORE["1m_keys"], sec(s["1m_keys_ours"]),
         sec(s["1m_keys_spark_ss"]), x("vs_spark_ss_1m_keys"),
         target("vs_spark_ss_1m_keys", r["vs_spark_ss_1m_keys"])],
        ["growth 100k -> 1M, ours / SS's", "-", "", "", x("growth_vs_spark_ss"),
         target("growth_vs_spark_ss", r["growth_vs_spark_ss"])],
        ["100k epoch from Kafka (JSON) vs from Parquet files", "2.36x",
         sec(engine["kafka_100k"]["median"]["kafka"]),
         sec(engine["kafka_100k"]["median"]["file"]) + " (files)", x("kafka_vs_file_100k"),
         target("kafka_vs_file_100k", r["kafka_vs_file_100k"])],
        ["JSON source vs bare confluent-kafka + json.loads (1M)", "2.84x (200k)",
         sec(reader["median"]["ours_json"]), sec(reader["median"]["bare_confluent_json"]) + " (bare)",
         x("reader_vs_confluent_json"),
         target("reader_vs_confluent_json", r["reader_vs_confluent_json"])],
        ["a user's keyed function vs the built-in count, 100k", "1.38x",
         sec(engine["udf_100k"]["median"]["udf"]),
         sec(engine["udf_100k"]["median"]["builtin"]) + " (built-in)",
         x("udf_vs_builtin_100k"), target("udf_vs_builtin_100k", r["udf_vs_builtin_100k"])],
        ["empty epoch", BEFORE["empty"], sec(s["empty_epoch"]), sec(s["empty_epoch_spark_ss"]),
         "", target("empty_epoch", s["empty_epoch"], " s")],
        ["empty epoch, checkpoints on S3 (SeaweedFS)", "0.43 s", sec(s["s3_empty_epoch"]), "",
         "", target("s3_empty_epoch", s["s3_empty_epoch"], " s")],
        ["S3 LISTs per epoch, P = 2 / P = 8", "20 / 32",
         f"{c['s3_list_per_epoch_p2']} / {c['s3_list_per_epoch_p8']}", "", "",
         "p2 = p8: " + ("met" if c["s3_list_per_epoch_p2"] == c["s3_list_per_epoch_p8"]
                        else "NOT met")],
        ["S3 requests one after another, P = 2 (observed)", "89",
         str(c["s3_sequential_round_trips"]), "", "",
         target("s3_sequential_round_trips", c["s3_sequential_round_trips"])],
        ["Kafka source vs bare kafka-python (1M)", BEFORE["reader"],
         sec(reader["median"]["ours"]), sec(reader["median"]["bare_kafka_python"]) + " (bare)",
         x("reader_vs_kafka_python"),
         target("reader_vs_kafka_python", r["reader_vs_kafka_python"])],
        ["Kafka source vs bare confluent-kafka (1M)", "-", sec(reader["median"]["ours"]),
         sec(reader["median"]["bare_confluent"]) + " (bare)", x("reader_vs_confluent_kafka"),
         "(same client)"],
        ["checkpoint through Airflow, Connect (p50)", BEFORE["airflow"],
         sec(s["airflow_checkpoint_p50_connect"]), "", "",
         target("airflow_checkpoint_p50_connect", s["airflow_checkpoint_p50_connect"], " s")],
        ["checkpoint through Airflow, LocalSpark (p50)", BEFORE["airflow"],
         sec(s["airflow_checkpoint_p50_local"]), "", "", ""],
        ["DAG run's wall time through Airflow, Connect (p50)", "6.1 s",
         sec(s["airflow_dag_run_wall_p50_connect"]), "", "",
         target("airflow_dag_run_wall_p50_connect", s["airflow_dag_run_wall_p50_connect"], " s")],
        ["peak memory, 1M workload (MB, RSS)", "-", str(mem["ours"]["total"]),
         str(mem["spark_ss"]["total"]), x("memory_vs_spark_ss"),
         target("memory_vs_spark_ss", r["memory_vs_spark_ss"])],
        ["peak memory, 1M workload (MB, PSS)", "-", str(pss["ours"]["total"]),
         str(pss["spark_ss"]["total"]), x("memory_pss_vs_spark_ss"),
         target("memory_vs_spark_ss", r["memory_pss_vs_spark_ss"])],
    ]  # fmt: skip
    nexmark = latest["details"]["nexmark"]
    for q, what in (("q5", "hot items, sliding window"), ("q7", "highest bid, tumbling window")):
        for mode, how in NEXMARK_MODES.items():
            median = nexmark[f"{q}_{mode}"]["median"]
            rows.append(
                [f"Nexmark {q} ({what}), SS {how}", "-", sec(median["ours"]),
                 sec(median["spark_ss"]), f"{r[f'nexmark_{q}_{mode}']:.2f}x",
                 target(f"nexmark_{q}", r[f"nexmark_{q}_{mode}"])
                 if mode == "per_epoch" else "(strict)"]
            )  # fmt: skip
    lines = [table(rows, ["work", "before", "ours now", "Spark SS now", "ratio", "target"])]
    lines.append("")
    for measure, peaks in (("RSS", mem), ("PSS", pss)):
        lines.append(
            f"peak memory ({measure}, MB) driver / JVM / Python workers: "
            + "; ".join(
                f"{name} {m['driver']} / {m['jvm']} / {m['workers']}" for name, m in peaks.items()
            )
        )
    for mode in ("connect", "local"):
        p50 = a[mode]["p50"]
        lines.append(
            f"Airflow {mode} p50: trigger->completed {p50['trigger_to_completed_s']} s, "
            f"trigger->notified {p50['trigger_to_notified_s']} s, DAG run {p50['dag_run_wall_s']} s "
            f"of which inside tasks {p50['inside_tasks_s']} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args(argv)
    from bench import bench_airflow, bench_engine, bench_nexmark, bench_reader

    host = machine()  # the load average as the run starts
    # Nine timed rounds per workload: on this 2-core machine a median of five moved the
    # 1M ratio by 0.2 between runs of the same code.
    rounds = 2 if args.quick else 9
    print("engine vs Spark Structured Streaming ...", flush=True)
    engine = bench_engine.run(
        rounds, memory_rounds=1 if args.quick else 2, only=list(bench_engine.WORKLOADS)
    )
    print("Nexmark q5 and q7 vs Spark Structured Streaming ...", flush=True)
    nexmark = bench_nexmark.run(20_000 if args.quick else 50_000, 1 if args.quick else 3, False)
    print("Kafka source vs bare kafka-python ...", flush=True)
    reader = bench_reader.run(200_000 if args.quick else 1_000_000, 100, 2, 2 if args.quick else 3)
    print("checkpoints through Airflow ...", flush=True)
    airflow = bench_airflow.run(2 if args.quick else 5, ["connect", "local"])
    latest = summarize(engine, reader, airflow, nexmark, host)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "latest.json"
    path.write_text(json.dumps(latest, indent=2) + "\n")
    print()
    print(report(latest))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
