"""Configuration: every field validated at load time, defaults as in docs/operations.md, file loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microcheckpoint.config import (
    BarrierPolicy,
    CheckpointConfig,
    CheckpointingMode,
    ExternalizedCleanup,
    StartupMode,
    load_config,
    parse_duration,
)
from microcheckpoint.errors import ConfigError, MicrocheckpointError

BASE = {"pipeline": "orders", "storage": "file:///var/checkpoints"}
DURATION = "a duration: seconds or a string like '500ms', '30s', '10min'"


def build(**values: object) -> CheckpointConfig:
    return CheckpointConfig.from_mapping({**BASE, **values})


# ---- every field's bad values ------------------------------------------------------------

BAD_VALUES = [
    # (field, bad value, what is allowed)
    ("pipeline", "bad/name", "1-128 characters of A-Z a-z 0-9 . _ -"),
    ("pipeline", "x" * 129, "1-128 characters of A-Z a-z 0-9 . _ -"),
    ("pipeline", 42, "1-128 characters of A-Z a-z 0-9 . _ -"),
    ("pipeline", "", "required"),
    ("storage", "", "required"),
    ("storage", "http://host/x", "a root URL: file:///absolute/path or s3://bucket[/prefix]"),
    ("storage", "file://relative/x", "a root URL: file:///absolute/path or s3://bucket[/prefix]"),
    ("storage", "s3://UPPER", "a root URL: file:///absolute/path or s3://bucket[/prefix]"),
    ("storage", "s3://ab", "a root URL: file:///absolute/path or s3://bucket[/prefix]"),
    ("storage", 7, "a root URL: file:///absolute/path or s3://bucket[/prefix]"),
    ("topics", ["ok", "bad topic"], "a list of Kafka topic names"),
    ("topics", 5, "a list of Kafka topic names"),
    ("topics", ["ok", 3], "a list of Kafka topic names"),
    ("interval", "soon", DURATION),
    ("interval", -5, "a finite duration >= 0"),
    ("interval", 0, "a duration > 0"),
    ("interval", "0s", "a duration > 0"),
    ("mode", "exactly-once", "one of EXACTLY_ONCE, AT_LEAST_ONCE"),
    ("mode", 1, "one of EXACTLY_ONCE, AT_LEAST_ONCE"),
    ("timeout", "ten minutes", DURATION),
    ("timeout", "-3s", DURATION),
    ("timeout", True, DURATION),
    ("timeout", -1, "a finite duration >= 0"),
    ("timeout", 0, "a duration > 0"),
    ("timeout", "0ms", "a duration > 0"),
    ("min_pause", -0.5, "a finite duration >= 0"),
    ("min_pause", [1], DURATION),
    ("max_concurrent", 0, "an integer >= 1"),
    ("max_concurrent", "2", "an integer >= 1"),
    ("max_concurrent", 1.5, "an integer >= 1"),
    ("max_concurrent", True, "an integer >= 1"),
    ("tolerable_failures", -1, "an integer >= 0"),
    ("tolerable_failures", None, "an integer >= 0"),
    ("retained", 0, "an integer >= 1"),
    (
        "externalized_cleanup",
        "delete",
        "one of RETAIN_ON_CANCELLATION, DELETE_ON_CANCELLATION, NO_EXTERNALIZED_CHECKPOINTS",
    ),
    ("unaligned", "yes", "true or false"),
    ("unaligned", 1, "true or false"),
    ("aligned_timeout", "1 week", DURATION),
    ("aligned_timeout", -2, "a finite duration >= 0"),
    ("max_parallelism", 0, "an integer >= 1 and <= 32768"),
    ("max_parallelism", 32769, "an integer >= 1 and <= 32768"),
    ("max_records_per_epoch", 0, "an integer >= 1"),
    ("max_records_per_epoch", "100", "an integer >= 1"),
    ("barrier_policy", "earliest", "one of latest, data_interval"),
    ("incremental", "no", "true or false"),
    ("startup_mode", "newest", "one of group_offsets, earliest, latest, timestamp"),
    ("startup_timestamp_ms", -1, "an integer >= 0"),
    ("startup_timestamp_ms", 1.5e12, "an integer >= 0"),
]


@pytest.mark.parametrize(("field", "value", "allowed"), BAD_VALUES)
def test_bad_value_names_field_value_and_what_is_allowed(
    field: str, value: object, allowed: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build(**{field: value})
    exc = caught.value
    assert exc.field == field
    assert exc.value == value
    assert exc.allowed == allowed
    assert str(exc) == f"config field {field!r} = {value!r} is invalid: {allowed}"
    assert isinstance(exc, MicrocheckpointError)
    assert isinstance(exc, ValueError)


@pytest.mark.parametrize("missing", ["pipeline", "storage"])
def test_required_field_absent(missing: str) -> None:
    values = dict(BASE)
    del values[missing]
    with pytest.raises(ConfigError) as caught:
        CheckpointConfig.from_mapping(values)
    assert caught.value.field == missing
    assert str(caught.value) == f"config field {missing!r} = None is invalid: required"


def test_timestamp_startup_needs_a_timestamp() -> None:
    with pytest.raises(ConfigError) as caught:
        build(startup_mode="timestamp")
    assert caught.value.field == "startup_timestamp_ms"
    assert str(caught.value) == (
        "config field 'startup_timestamp_ms' = None is invalid: "
        "required when startup_mode is 'timestamp'"
    )
    config = build(startup_mode="TIMESTAMP", startup_timestamp_ms=1_700_000_000_000)
    assert config.startup_mode is StartupMode.TIMESTAMP
    assert config.startup_timestamp_ms == 1_700_000_000_000


def test_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as caught:
        build(timout="10min")
    exc = caught.value
    assert exc.field == "timout"
    assert exc.value == "10min"
    message = str(exc)
    assert message.startswith(
        "config field 'timout' = '10min' is invalid: not a setting; did you mean 'timeout'? known: "
    )
    known = message.split("known: ", 1)[1].split(", ")
    assert "timeout" in known
    assert "extra" not in known
    assert len(known) == 20


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("min_paus", "min_pause"), ("aligned_timout", "aligned_timeout"), ("retain", "retained")],
)
def test_a_typo_gets_the_setting_it_is_close_to(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"not a setting; did you mean '{meant}'\\? known: "):
        build(**{typo: "1"})


def test_a_name_close_to_nothing_gets_no_suggestion() -> None:
    with pytest.raises(ConfigError) as caught:
        build(colour="blue")
    assert "did you mean" not in str(caught.value)


def test_first_unknown_key_in_sorted_order_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        build(zeta=1, alpha=2)
    assert caught.value.field == "alpha"
    assert caught.value.value == 2


def test_extra_is_not_a_setting() -> None:
    with pytest.raises(ConfigError) as caught:
        build(extra={"a": 1})
    assert caught.value.field == "extra"


# ---- durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("30sec", 30.0),
        (" 20 s ", 20.0),
        ("10min", 600.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1.5h", 5400.0),
        ("1.5", 1.5),
        ("45", 45.0),
        (45, 45.0),
        (2.25, 2.25),
        (0, 0.0),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration("timeout", text) == seconds


@pytest.mark.parametrize("bad", ["10 minutes", "1e3", "-5s", ".5s", "10MIN", "", None, False])
def test_parse_duration_refuses(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration("min_pause", bad)
    assert caught.value.field == "min_pause"
    assert str(caught.value) == f"config field 'min_pause' = {bad!r} is invalid: {DURATION}"


def test_duration_fields_accept_units() -> None:
    config = build(interval="2h", timeout="10min", min_pause="500ms", aligned_timeout="30s")
    assert config.interval == 7200.0
    assert config.timeout == 600.0
    assert config.min_pause == 0.5
    assert config.aligned_timeout == 30.0


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_timeout_is_refused(value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        build(timeout=value)
    assert caught.value.field == "timeout"


# ---- enums and booleans -------------------------------------------------------------------


def test_enums_are_case_insensitive() -> None:
    config = build(
        mode="at_least_once",
        externalized_cleanup="Delete_On_Cancellation",
        barrier_policy="DATA_INTERVAL",
        startup_mode="Earliest",
    )
    assert config.mode is CheckpointingMode.AT_LEAST_ONCE
    assert config.externalized_cleanup is ExternalizedCleanup.DELETE_ON_CANCELLATION
    assert config.barrier_policy is BarrierPolicy.DATA_INTERVAL
    assert config.startup_mode is StartupMode.EARLIEST


def test_enum_members_are_accepted_as_is() -> None:
    config = build(mode=CheckpointingMode.AT_LEAST_ONCE, startup_mode=StartupMode.LATEST)
    assert config.mode is CheckpointingMode.AT_LEAST_ONCE
    assert config.startup_mode is StartupMode.LATEST


@pytest.mark.parametrize(("value", "expected"), [("TRUE", True), ("false", False), (True, True)])
def test_booleans(value: object, expected: bool) -> None:
    config = build(unaligned=value, incremental=value)
    assert config.unaligned is expected
    assert config.incremental is expected


# ---- defaults and derived values ----------------------------------------------------------


def test_defaults_are_design_section_7() -> None:
    config = build()
    assert config.pipeline == "orders"
    assert config.storage == "file:///var/checkpoints"
    assert config.topics == ()
    assert config.group_id == ""
    assert config.interval is None
    assert config.mode is CheckpointingMode.EXACTLY_ONCE
    assert config.timeout == 600.0
    assert config.min_pause == 0.0
    assert config.max_concurrent == 1
    assert config.tolerable_failures == 0
    assert config.retained == 1
    assert config.externalized_cleanup is ExternalizedCleanup.RETAIN_ON_CANCELLATION
    assert config.unaligned is False
    assert config.aligned_timeout == 0.0
    assert config.max_parallelism == 128
    assert config.max_records_per_epoch is None
    assert config.barrier_policy is BarrierPolicy.LATEST
    assert config.incremental is True
    assert config.startup_mode is StartupMode.GROUP_OFFSETS
    assert config.startup_timestamp_ms is None
    assert config.effective_max_concurrent == 1
    assert config.effective_group_id == "microcheckpoint-orders"


@pytest.mark.parametrize(
    ("min_pause", "max_concurrent", "effective"),
    [(0, 3, 3), ("0s", 2, 2), ("5s", 3, 1), (0.001, 8, 1), (0, 1, 1)],
)
def test_effective_max_concurrent(min_pause: object, max_concurrent: int, effective: int) -> None:
    config = build(min_pause=min_pause, max_concurrent=max_concurrent)
    assert config.max_concurrent == max_concurrent
    assert config.effective_max_concurrent == effective


def test_group_id_and_topics() -> None:
    config = build(group_id="readers", topics="a.b, c-d ,e_f")
    assert config.effective_group_id == "readers"
    assert config.topics == ("a.b", "c-d", "e_f")
    assert build(topics=["x", "y"]).topics == ("x", "y")


@pytest.mark.parametrize(
    ("storage", "stored"),
    [
        ("s3://my-bucket/prefix/", "s3://my-bucket/prefix"),
        ("s3://my-bucket", "s3://my-bucket"),
        ("file:///tmp/chk/", "file:///tmp/chk/"),
    ],
)
def test_storage_urls(storage: str, stored: str) -> None:
    assert build(storage=storage).storage == stored


def test_group_id_must_be_a_string() -> None:
    with pytest.raises(ConfigError) as caught:
        build(group_id=["g1"])
    assert caught.value.field == "group_id"


# ---- round trip -------------------------------------------------------------------------


def test_to_mapping_of_defaults() -> None:
    assert build().to_mapping() == {
        "pipeline": "orders",
        "storage": "file:///var/checkpoints",
        "topics": [],
        "group_id": "",
        "interval": None,
        "mode": "EXACTLY_ONCE",
        "timeout": 600.0,
        "min_pause": 0.0,
        "max_concurrent": 1,
        "tolerable_failures": 0,
        "retained": 1,
        "externalized_cleanup": "RETAIN_ON_CANCELLATION",
        "unaligned": False,
        "aligned_timeout": 0.0,
        "max_parallelism": 128,
        "max_records_per_epoch": None,
        "barrier_policy": "latest",
        "incremental": True,
        "startup_mode": "group_offsets",
        "startup_timestamp_ms": None,
    }


def test_round_trip_through_mapping_and_json() -> None:
    config = build(
        storage="s3://bucket-1/a/b",
        topics=["in.a", "in-b"],
        group_id="g",
        interval="1min",
        mode="AT_LEAST_ONCE",
        timeout="90s",
        min_pause=2.5,
        max_concurrent=3,
        tolerable_failures=4,
        retained=5,
        externalized_cleanup="NO_EXTERNALIZED_CHECKPOINTS",
        unaligned=True,
        aligned_timeout="750ms",
        max_parallelism=256,
        max_records_per_epoch=1000,
        barrier_policy="data_interval",
        incremental=False,
        startup_mode="timestamp",
        startup_timestamp_ms=123,
    )
    mapping = config.to_mapping()
    assert mapping["interval"] == 60.0
    assert mapping["mode"] == "AT_LEAST_ONCE"
    assert mapping["topics"] == ["in.a", "in-b"]
    again = CheckpointConfig.from_mapping(mapping)
    assert again == config
    assert again.to_mapping() == mapping
    assert CheckpointConfig.from_mapping(json.loads(json.dumps(mapping))) == config
    assert config.effective_max_concurrent == 1


# ---- files ------------------------------------------------------------------------------


def test_load_toml_top_level(tmp_path: Path) -> None:
    path = tmp_path / "chk.toml"
    path.write_text(
        'pipeline = "orders"\nstorage = "s3://bucket-1/p"\ntimeout = "2min"\n'
        'mode = "at_least_once"\nretained = 3\ntopics = ["a", "b"]\n'
    )
    config = load_config(path)
    assert config == build(
        storage="s3://bucket-1/p",
        timeout=120,
        mode="AT_LEAST_ONCE",
        retained=3,
        topics=["a", "b"],
    )


def test_load_toml_checkpointing_table(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        'name = "ignored"\n\n[checkpointing]\npipeline = "orders"\n'
        'storage = "file:///data/chk"\nmin_pause = "30s"\nmax_concurrent = 4\n\n'
        "[other]\nx = 1\n"
    )
    config = load_config(str(path))
    assert config.pipeline == "orders"
    assert config.storage == "file:///data/chk"
    assert config.min_pause == 30.0
    assert config.max_concurrent == 4
    assert config.effective_max_concurrent == 1


def test_load_json_top_level_and_table(tmp_path: Path) -> None:
    top = tmp_path / "a.json"
    top.write_text(json.dumps({**BASE, "max_records_per_epoch": 50}))
    assert load_config(top) == build(max_records_per_epoch=50)
    table = tmp_path / "b.json"
    table.write_text(json.dumps({"checkpointing": {**BASE, "unaligned": "true"}}))
    assert load_config(table) == build(unaligned=True)


def test_load_bad_value_in_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[checkpointing]\npipeline = "orders"\nstorage = "file:///x"\nretained = 0\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == "config field 'retained' = 0 is invalid: an integer >= 1"


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == "config file"
    assert caught.value.value == str(path)
    assert str(caught.value) == (
        f"config field 'config file' = {str(path)!r} is invalid: "
        "a readable file (No such file or directory)"
    )


def test_load_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('pipeline = "orders\nstorage = 3\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == "config file"
    assert caught.value.value == str(path)
    assert caught.value.allowed.startswith("valid toml: ")
    assert str(path) in str(caught.value)


def test_load_invalid_json_and_non_table(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{pipeline: orders}")
    with pytest.raises(ConfigError) as caught:
        load_config(broken)
    assert caught.value.allowed.startswith("valid json: ")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError) as caught:
        load_config(listed)
    assert str(caught.value) == (
        f"config field 'config file' = {str(listed)!r} is invalid: "
        "a table of settings at the top level"
    )


def test_load_non_table_checkpointing_value(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"checkpointing": 5}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.field == "checkpointing"
