"""Helpers shared by the benchmark scripts: result files, tables, producing records."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    """Write ``results`` (plus the environment) to ``bench/results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"environment": environment(), **results}, indent=2) + "\n")
    return path


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain text table, columns padded to their widest cell."""
    cells = [header, *[[_fmt(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def json_value(i: int, size: int) -> bytes:
    """Record ``i``'s value: a JSON object of about ``size`` bytes, ``{"key": "k<i % 10000>",
    "seq": i, "pad": "x..."}`` (``JSON_SCHEMA``)."""
    head = b'{"key":"k%d","seq":%d,"pad":"' % (i % 10_000, i)
    return head + b"x" * max(size - len(head) - 2, 0) + b'"}'


# The schema a JSON source reads ``json_value``'s records with.
JSON_SCHEMA = {"key": "string", "seq": "long", "pad": "string"}


def produce(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> None:
    """Create ``topic`` and produce ``records`` JSON values (``json_value``) of ``size``
    bytes round-robin."""
    from kafka import KafkaProducer

    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

    with KafkaOffsets(bootstrap) as kafka:
        kafka.create_topic(topic, partitions)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=256 * 1024
    )
    try:
        for i in range(records):
            producer.send(topic, value=json_value(i, size), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()
