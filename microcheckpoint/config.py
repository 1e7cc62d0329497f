"""Checkpoint configuration (names mirror Flink's), validated at load time.

A bad value raises ``ConfigError`` naming the field, the value and what is allowed.
Durations accept seconds (``30``, ``1.5``) or strings with a unit (``"500ms"``,
``"30s"``, ``"10min"``, ``"2h"``).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from microcheckpoint.errors import ConfigError, unknown_name

__all__ = [
    "BarrierPolicy",
    "CheckpointConfig",
    "CheckpointingMode",
    "ExternalizedCleanup",
    "StartupMode",
    "load_config",
    "parse_duration",
]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, None: 1.0}


class CheckpointingMode(str, Enum):
    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedCleanup(str, Enum):
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"


class BarrierPolicy(str, Enum):
    LATEST = "latest"
    DATA_INTERVAL = "data_interval"


class StartupMode(str, Enum):
    """Where a pipeline with no checkpoint starts reading."""

    GROUP_OFFSETS = "group_offsets"  # committed group offsets, else earliest
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"


def parse_duration(name: str, value: object) -> float:
    """Seconds from a number or a string with a unit; negative values are refused."""
    if isinstance(value, bool):
        raise ConfigError(
            name, value, "a duration: seconds or a string like '500ms', '30s', '10min'"
        )
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ConfigError(
            name, value, "a duration: seconds or a string like '500ms', '30s', '10min'"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(name, value, "a finite duration >= 0")
    return seconds


def _enum(name: str, enum: type[Enum], value: object) -> Any:
    if isinstance(value, enum):
        return value
    allowed = [member.value for member in enum]
    for member in enum:
        if isinstance(value, str) and value.lower() == str(member.value).lower():
            return member
    raise ConfigError(name, value, f"one of {', '.join(allowed)}")


def _int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, f"an integer >= {low}" + (f" and <= {high}" if high else ""))
    if value < low or (high is not None and value > high):
        raise ConfigError(name, value, f"an integer >= {low}" + (f" and <= {high}" if high else ""))
    return value


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(name, value, "true or false")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing settings of one pipeline. Build with ``from_mapping`` to validate."""

    pipeline: str
    storage: str
    topics: tuple[str, ...] = ()
    group_id: str = ""
    interval: float | None = None
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 1
    externalized_cleanup: ExternalizedCleanup = ExternalizedCleanup.RETAIN_ON_CANCELLATION
    unaligned: bool = False
    aligned_timeout: float = 0.0
    max_parallelism: int = 128
    max_records_per_epoch: int | None = None
    barrier_policy: BarrierPolicy = BarrierPolicy.LATEST
    incremental: bool = True
    startup_mode: StartupMode = StartupMode.GROUP_OFFSETS
    startup_timestamp_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def effective_max_concurrent(self) -> int:
        """As in Flink, a min pause > 0 allows only one checkpoint in flight."""
        return 1 if self.min_pause > 0 else self.max_concurrent

    @property
    def effective_group_id(self) -> str:
        return self.group_id or f"microcheckpoint-{self.pipeline}"

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> CheckpointConfig:
        """Validate ``values`` and build a config; unknown keys are refused by name."""
        known = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise unknown_name("a setting", unknown[0], values[unknown[0]], known)
        for required in ("pipeline", "storage"):
            if not values.get(required):
                raise ConfigError(required, values.get(required), "required")
        v = dict(values)
        pipeline = v["pipeline"]
        if not isinstance(pipeline, str) or not _NAME.match(pipeline):
            raise ConfigError("pipeline", pipeline, "1-128 characters of A-Z a-z 0-9 . _ -")
        if pipeline == "_probe":  # the store probe's folder (storage/probe.py)
            raise ConfigError("pipeline", pipeline, "a name other than the store probe's folder")
        storage = v["storage"]
        if not isinstance(storage, str) or not re.match(
            r"^(file:///|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/|$))", storage
        ):
            raise ConfigError(
                "storage", storage, "a root URL: file:///absolute/path or s3://bucket[/prefix]"
            )
        topics = v.get("topics", ())
        if isinstance(topics, str):
            topics = tuple(t.strip() for t in topics.split(",") if t.strip())
        if not isinstance(topics, list | tuple) or not all(
            isinstance(t, str) and re.match(r"^[A-Za-z0-9._-]{1,249}$", t) for t in topics
        ):
            raise ConfigError("topics", topics, "a list of Kafka topic names")
        group_id = v.get("group_id", "")
        if not isinstance(group_id, str) or (group_id and not _NAME.match(group_id)):
            raise ConfigError(
                "group_id", group_id, "a Kafka group id: 1-128 characters of A-Z a-z 0-9 . _ -"
            )
        interval = v.get("interval")
        max_records = v.get("max_records_per_epoch")
        startup_ts = v.get("startup_timestamp_ms")
        config = cls(
            pipeline=pipeline,
            storage=storage.rstrip("/") if storage.startswith("s3://") else storage,
            topics=tuple(topics),
            group_id=group_id,
            interval=None if interval is None else parse_duration("interval", interval),
            mode=_enum("mode", CheckpointingMode, v.get("mode", CheckpointingMode.EXACTLY_ONCE)),
            timeout=parse_duration("timeout", v.get("timeout", 600.0)),
            min_pause=parse_duration("min_pause", v.get("min_pause", 0.0)),
            max_concurrent=_int("max_concurrent", v.get("max_concurrent", 1), 1),
            tolerable_failures=_int("tolerable_failures", v.get("tolerable_failures", 0), 0),
            retained=_int("retained", v.get("retained", 1), 1),
            externalized_cleanup=_enum(
                "externalized_cleanup",
                ExternalizedCleanup,
                v.get("externalized_cleanup", ExternalizedCleanup.RETAIN_ON_CANCELLATION),
            ),
            unaligned=_bool("unaligned", v.get("unaligned", False)),
            aligned_timeout=parse_duration("aligned_timeout", v.get("aligned_timeout", 0.0)),
            max_parallelism=_int("max_parallelism", v.get("max_parallelism", 128), 1, 32768),
            max_records_per_epoch=None
            if max_records is None
            else _int("max_records_per_epoch", max_records, 1),
            barrier_policy=_enum(
                "barrier_policy", BarrierPolicy, v.get("barrier_policy", BarrierPolicy.LATEST)
            ),
            incremental=_bool("incremental", v.get("incremental", True)),
            startup_mode=_enum(
                "startup_mode", StartupMode, v.get("startup_mode", StartupMode.GROUP_OFFSETS)
            ),
            startup_timestamp_ms=None
            if startup_ts is None
            else _int("startup_timestamp_ms", startup_ts, 0),
        )
        if config.timeout <= 0:
            raise ConfigError("timeout", v.get("timeout"), "a duration > 0")
        if config.interval is not None and config.interval <= 0:
            raise ConfigError("interval", interval, "a duration > 0")
        if config.startup_mode is StartupMode.TIMESTAMP and config.startup_timestamp_ms is None:
            raise ConfigError(
                "startup_timestamp_ms", None, "required when startup_mode is 'timestamp'"
            )
        return config

    def to_mapping(self) -> dict[str, Any]:
        """Plain JSON-able values; ``from_mapping(to_mapping())`` gives an equal config."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = (
                value.value
                if isinstance(value, Enum)
                else (list(value) if isinstance(value, tuple) else value)
            )
        return out


def load_config(path: str | Path) -> CheckpointConfig:
    """Read a ``.toml`` or ``.json`` file (a top-level table, or ``[checkpointing]``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError("config file", str(path), f"a readable file ({exc.strerror})") from exc
    try:
        data = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "config file", str(path), f"valid {path.suffix[1:] or 'JSON'}: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError("config file", str(path), "a table of settings at the top level")
    section = data.get("checkpointing", data)
    if not isinstance(section, dict):
        raise ConfigError("checkpointing", section, "a table of settings")
    return CheckpointConfig.from_mapping(section)
