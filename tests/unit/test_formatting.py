"""The one formatter of sizes, durations, times and settings (the page's and the CLI's)."""

from __future__ import annotations

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.formatting import (
    NONE,
    duration,
    parallelism_change,
    point_name,
    setting,
    settings,
    size,
    span,
    timestamp,
)


def test_sizes_in_binary_units() -> None:
    values = [None, 0, 512, 1536, 5 * 2**20, 3 * 2**30, 2 * 2**40]
    assert [size(v) for v in values] == [
        NONE,
        "0 B",
        "512 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
        "2.0 TiB",
    ]
    assert size(None, none="-") == "-"


def test_measured_durations_keep_what_is_fast() -> None:
    values = [None, 0, 0.25, 5, 7.54, 850, 3200, 125_000, 3_725_000]
    assert [duration(v) for v in values] == [
        NONE,
        "0 ms",
        "0.25 ms",
        "5 ms",
        "7.5 ms",
        "850 ms",
        "3.2 s",
        "2m 05s",
        "1h 02m",
    ]


def test_configured_durations_in_their_largest_whole_unit() -> None:
    values = [None, 0, 0.25, 1.5, 90, 600, 7200, 5400]
    assert [span(v) for v in values] == [
        NONE,
        "0 s",
        "250 ms",
        "1.5 s",
        "90 s",
        "10 min",
        "2 h",
        "90 min",
    ]


def test_timestamps_are_utc() -> None:
    assert timestamp(0) == "1970-01-01 00:00:00"
    assert timestamp(1_767_225_600_500) == "2026-01-01 00:00:00"
    assert timestamp(None) == NONE


def test_settings_read_in_words_and_unknown_ones_keep_their_json() -> None:
    config = CheckpointConfig.from_mapping(
        {
            "pipeline": "p",
            "storage": "s3://bucket/chk",
            "mode": "AT_LEAST_ONCE",
            "externalized_cleanup": "DELETE_ON_CANCELLATION",
            "max_records_per_epoch": 500,
            "barrier_policy": "data_interval",
            "startup_mode": "timestamp",
            "startup_timestamp_ms": 0,
        }
    ).to_mapping()
    shown = dict(settings({**config, "future_setting": {"a": 1}}))
    assert shown["Mode"] == "at least once"
    assert shown["Externalized checkpoint cleanup"] == "delete on cancellation"
    assert shown["Max records per checkpoint"] == "500"
    assert shown["Barrier policy"] == "data interval"
    assert shown["Startup timestamp"] == "1970-01-01 00:00:00 UTC"
    assert shown["Checkpoint interval"] == "none"
    assert shown["Kafka group id"] == "microcheckpoint-p (default)"  # the id Kafka sees
    assert list(shown)[-1] == "Future setting" and shown["Future setting"] == '{"a": 1}'
    assert setting("timeout", 600.0) == ("Checkpoint timeout", "10 min")
    assert setting("group_id", "g1") == ("Kafka group id", "g1")


def test_a_restores_parallelism_reads_per_operator() -> None:
    before = {"word-counts": 2, "word-totals": 2, "lines-source": 1}
    after = {"word-counts": 3, "word-totals": 3, "lines-source": 1}
    assert parallelism_change(before, after) == "lines-source 1, word-counts 2→3, word-totals 2→3"
    assert parallelism_change(before, None, 3) == (
        "lines-source 1, word-counts 2, word-totals 2 → 3 requested"
    )
    assert parallelism_change(before, None) == "lines-source 1, word-counts 2, word-totals 2"
    assert parallelism_change({"a": 1}, {"b": 2}) == f"a 1→{NONE}, b {NONE}→2"
    assert parallelism_change({}, None) == NONE
    assert parallelism_change(None, None, 4) == f"{NONE} → 4 requested"
    assert point_name("s3://b/chk/wordcount/chk-0000000001") == "chk-0000000001"
    assert point_name("file:///x/savepoints/savepoint-0000000002-ab12cd/") == (
        "savepoint-0000000002-ab12cd"
    )
    assert point_name("") == NONE
