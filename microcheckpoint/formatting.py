"""Sizes, durations, times and checkpoint settings for people: the one formatter of the package.

The Checkpoints page and the CLI show the same numbers the same way: ``size(1536)`` is
``1.5 KiB`` everywhere, ``duration(3200)`` is ``3.2 s``, ``timestamp(ms)`` is UTC. Settings
stored with a checkpoint (``CheckpointConfig.to_mapping()``) read as Flink's configuration
table does, in words with units: ``("Checkpoint timeout", "10 min")``.

Every function takes None for "no value" and returns ``none`` (an en dash unless given).
Imports nothing outside the standard library and ``microcheckpoint.config``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "NONE",
    "duration",
    "parallelism_change",
    "phases",
    "point_name",
    "setting",
    "settings",
    "size",
    "slowest",
    "span",
    "timestamp",
]

NONE = "\u2013"  # an en dash: no value


def size(n: float | None, none: str = NONE) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``2.0 GiB``, ``1.1 TiB``.

    Edge cases: bytes are whole (``0 B``); above a TiB the value stays in TiB.
    """
    if n is None:
        return none
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def duration(ms: float | None, none: str = NONE) -> str:
    """A measured time in milliseconds: ``0.42 ms``, ``7.5 ms``, ``850 ms``, ``3.2 s``,
    ``2m 05s``, ``1h 02m``.

    Edge cases: below 10 ms fractions are kept (a fast snapshot is not "0 ms"), whole
    values are not (``5 ms``); exactly 0 is ``0 ms``.
    """
    if ms is None:
        return none
    value = float(ms)
    if value < 10 and not value.is_integer():
        return f"{value:.2f} ms" if value < 1 else f"{value:.1f} ms"
    if value < 1000:
        return f"{value:.0f} ms"
    if value < 60_000:
        return f"{value / 1000:.1f} s"
    if value < 3_600_000:
        return f"{int(value // 60_000)}m {int(value % 60_000 // 1000):02d}s"
    return f"{int(value // 3_600_000)}h {int(value % 3_600_000 // 60_000):02d}m"


def slowest(found: Mapping[str, Any] | None) -> str:
    """``checkpoint_detail``'s ``slowest`` in one line: ``word-counts#1 finished last, 840 ms
    after the trigger: keyed 610 ms`` (``why`` unknown: the line ends after the trigger)."""
    if not found:
        return NONE
    head = f"{found['task']} finished last, {duration(found['end_to_end_ms'])} after the trigger"
    if found.get("why") is None:
        return head
    return f"{head}: {found['why']} {duration(found['why_ms'])}"


def phases(found: Mapping[str, Any] | None) -> str:
    """A subtask's ``phases``: ``waiting to start 120 ms · read 3.0 ms · keyed 610 ms ·
    snapshot upload 90 ms · ack 1.0 ms`` (an unknown phase as ``NONE``)."""
    if not found:
        return NONE
    return " · ".join(f"{name} {duration(ms)}" for name, ms in found.items())


def span(seconds: float | None, none: str = NONE) -> str:
    """A configured duration in seconds, in its largest whole unit: ``0 s``, ``90 s``,
    ``10 min``, ``2 h``, ``250 ms``; otherwise seconds with their fraction (``1.5 s``)."""
    if seconds is None:
        return none
    ms = round(float(seconds) * 1000, 3)
    if ms == 0:
        return "0 s"
    for unit, length in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % length == 0:
            return f"{int(ms // length)} {unit}"
    return f"{ms:g} ms" if ms < 1000 else f"{ms / 1000:g} s"


def timestamp(ms: float | None, none: str = NONE) -> str:
    """Milliseconds since the epoch as ``YYYY-MM-DD HH:MM:SS`` in UTC."""
    if ms is None:
        return none
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _words(value: Any) -> str:
    """An enum's stored value in words: ``RETAIN_ON_CANCELLATION`` -> ``retain on cancellation``."""
    return str(value).lower().replace("_", " ")


def _on_off(value: Any) -> str:
    return "on" if value else "off"


def _count(value: Any) -> str:
    return str(value)


# Each stored setting: its label (Flink's words where Flink has the setting) and its text.
_SETTINGS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "pipeline": ("Pipeline", str),
    "storage": ("Checkpoint storage", str),
    "topics": ("Topics", lambda v: ", ".join(v) if v else NONE),
    "group_id": ("Kafka group id", lambda v: v or "default"),
    "mode": ("Mode", _words),
    "interval": ("Checkpoint interval", lambda v: span(v, none="none")),
    "timeout": ("Checkpoint timeout", span),
    "min_pause": ("Min pause", span),
    "max_concurrent": ("Max concurrent checkpoints", _count),
    "tolerable_failures": ("Tolerable failed checkpoints", _count),
    "retained": ("Retained checkpoints", _count),
    "externalized_cleanup": ("Externalized checkpoint cleanup", _words),
    "unaligned": ("Unaligned checkpoints", _on_off),
    "aligned_timeout": ("Aligned checkpoint timeout", span),
    "max_parallelism": ("Max parallelism", _count),
    "max_records_per_epoch": (
        "Max records per checkpoint",
        lambda v: "no limit" if v is None else str(v),
    ),
    "barrier_policy": ("Barrier policy", _words),
    "incremental": ("Incremental checkpoints", _on_off),
    "startup_mode": ("Startup mode", _words),
    "startup_timestamp_ms": (
        "Startup timestamp",
        lambda v: NONE if v is None else timestamp(v) + " UTC",
    ),
}


def setting(name: str, value: Any) -> tuple[str, str]:
    """``(label, text)`` of one stored setting.

    Edge case: a setting this version does not know (from a newer writer) keeps its name
    as the label and its JSON as the text, so nothing stored is hidden.
    """
    known = _SETTINGS.get(name)
    if known is None:
        return name.replace("_", " ").capitalize(), json.dumps(value)
    label, text = known
    return label, text(value)


def settings(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every stored setting as ``(label, text)``: the known ones in Flink's order, then the
    unknown ones by name."""
    known = [setting(name, config[name]) for name in _SETTINGS if name in config]
    if not config.get("group_id") and "pipeline" in config:
        # The id Kafka sees, as ``CheckpointConfig.effective_group_id`` derives it.
        label = _SETTINGS["group_id"][0]
        default = (label, f"microcheckpoint-{config['pipeline']} (default)")
        known = [default if row[0] == label else row for row in known]
    rest = [setting(name, config[name]) for name in sorted(config) if name not in _SETTINGS]
    return known + rest


def parallelism_change(
    before: Mapping[str, int] | None,
    after: Mapping[str, int] | None,
    requested: int | None = None,
    none: str = NONE,
) -> str:
    """A restore's subtasks per operator uid: ``agg 2→3, source 1`` once the parallelism
    after is known; before it, ``agg 2, source 1 → 3 requested`` (or the parallelism before
    alone, as for a cancel).

    Edge case: an operator in only one of the two shows ``none`` on its missing side.
    """
    if not before and not after:
        return none if requested is None else f"{none} → {requested} requested"
    if after is None:
        text = ", ".join(f"{uid} {n}" for uid, n in sorted((before or {}).items()))
        return text if requested is None else f"{text} → {requested} requested"
    parts = []
    for uid in sorted(set(before or {}) | set(after)):
        was, now = (before or {}).get(uid), after.get(uid)
        if was == now:
            parts.append(f"{uid} {now}")
        else:
            parts.append(f"{uid} {none if was is None else was}→{none if now is None else now}")
    return ", ".join(parts)


def point_name(url: str | None, none: str = NONE) -> str:
    """The last part of a point's folder URL: ``chk-0000000007``, ``savepoint-…``."""
    if not url:
        return none
    return url.rstrip("/").rsplit("/", 1)[-1]
