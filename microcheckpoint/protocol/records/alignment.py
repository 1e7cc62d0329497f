"""A stage checkpoint's alignment: where its input channels were cut, and how long it took.

Written by an offsets port that aligns on an upstream stage's barrier markers
(``adapters.stage_offsets``, ``adapters.union_offsets``) and kept in the checkpoint's
``_pending`` labels (``"alignment"``) and in its statistics. Two stored shapes:

- one stage input (``InputAlignment``): a flat object, ``{"mode", "unaligned", "epoch",
  "upstream", "topics", "channels", "alignment_duration_ms", "start_delay_ms", "waited_ms",
  "inflight", "persisted_inflight_bytes"}`` (``"switched"`` when ``aligned_timeout`` made an
  aligned checkpoint unaligned); at-least-once stores only ``mode``, ``unaligned`` and
  ``waited_ms``;
- a fan-in (``FanInAlignment``): ``{"inputs": {uid: <one input>}, "unaligned": any}``.

Older records are read too: before ``mode`` existed the mode follows ``unaligned``; before
``upstream`` and ``topics`` were recorded they are None and empty (such a checkpoint cannot
anchor a global savepoint's cut).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "Alignment",
    "AlignmentMode",
    "FanInAlignment",
    "InflightChannel",
    "InputAlignment",
    "alignment_from_json",
]


class AlignmentMode(str, Enum):
    """Flink's three checkpointing modes between stages."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    AT_LEAST_ONCE = "at_least_once"


@dataclass(frozen=True)
class InflightChannel:
    """A channel an unaligned checkpoint read past: ``[from_offset, its marker)`` is owed.

    Stored as ``{"channel": "topic:partition", "from": offset, "until_marker": epoch}``.
    """

    channel: str
    from_offset: int
    until_marker: int

    def to_json(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "from": self.from_offset,
            "until_marker": self.until_marker,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> InflightChannel:
        return cls(str(body["channel"]), int(body["from"]), int(body["until_marker"]))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class InputAlignment:
    """One stage input's alignment (milliseconds; Flink's names).

    ``epoch`` is the upstream checkpoint whose markers ended the ranges (None for
    at-least-once); ``upstream`` the upstream stage's pipeline name (None in records written
    before it was recorded); ``inflight`` the channels an unaligned checkpoint read past.
    """

    mode: AlignmentMode
    waited_ms: int = 0
    epoch: int | None = None
    upstream: str | None = None
    topics: tuple[str, ...] = ()
    channels: int | None = None
    alignment_duration_ms: int | None = None
    start_delay_ms: int | None = None
    inflight: tuple[InflightChannel, ...] = ()
    persisted_inflight_bytes: int | None = None
    switched: str | None = None

    @property
    def unaligned(self) -> bool:
        return self.mode is AlignmentMode.UNALIGNED

    @property
    def parts(self) -> tuple[InputAlignment, ...]:
        """Every stage input's alignment: this one."""
        return (self,)

    def subtask_fields(self) -> dict[str, Any]:
        """What every subtask of the stage shows of it (each starts at the stage's one cut)."""
        fields: dict[str, Any] = {
            "alignment_duration_ms": self.alignment_duration_ms,
            "start_delay_ms": self.start_delay_ms,
            "unaligned": self.unaligned,
            "persisted_inflight_bytes": self.persisted_inflight_bytes,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "mode": self.mode.value,
            "unaligned": self.unaligned,
            "waited_ms": self.waited_ms,
        }
        if self.mode is AlignmentMode.AT_LEAST_ONCE:
            return body
        optional = {
            "epoch": self.epoch,
            "upstream": self.upstream,
            "channels": self.channels,
            "alignment_duration_ms": self.alignment_duration_ms,
            "start_delay_ms": self.start_delay_ms,
            "persisted_inflight_bytes": self.persisted_inflight_bytes,
            "switched": self.switched,
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        body["topics"] = list(self.topics)
        body["inflight"] = [channel.to_json() for channel in self.inflight]
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> InputAlignment:
        if "mode" in body:
            mode = AlignmentMode(body["mode"])
        else:  # written before the mode was recorded: aligned unless it says unaligned
            mode = AlignmentMode.UNALIGNED if body.get("unaligned") else AlignmentMode.ALIGNED
        upstream = body.get("upstream")
        switched = body.get("switched")
        return cls(
            mode=mode,
            waited_ms=int(body.get("waited_ms", 0)),
            epoch=_int_or_none(body.get("epoch")),
            upstream=None if upstream is None else str(upstream),
            topics=tuple(str(t) for t in body.get("topics", ())),
            channels=_int_or_none(body.get("channels")),
            alignment_duration_ms=_int_or_none(body.get("alignment_duration_ms")),
            start_delay_ms=_int_or_none(body.get("start_delay_ms")),
            inflight=tuple(InflightChannel.from_json(c) for c in body.get("inflight", ())),
            persisted_inflight_bytes=_int_or_none(body.get("persisted_inflight_bytes")),
            switched=None if switched is None else str(switched),
        )


@dataclass(frozen=True)
class FanInAlignment:
    """A fan-in stage's alignment: one ``InputAlignment`` per stage input, by input uid.

    Plain Kafka inputs are read to their end and have no entry; a fan-in of only plain
    inputs has no ``inputs``.
    """

    inputs: Mapping[str, InputAlignment]

    @property
    def unaligned(self) -> bool:
        return any(part.unaligned for part in self.inputs.values())

    @property
    def parts(self) -> tuple[InputAlignment, ...]:
        """Every stage input's alignment, in input order."""
        return tuple(self.inputs.values())

    def subtask_fields(self) -> dict[str, Any]:
        return {"unaligned": self.unaligned}

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": {uid: part.to_json() for uid, part in self.inputs.items()},
            "unaligned": self.unaligned,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> FanInAlignment:
        return cls({str(uid): InputAlignment.from_json(p) for uid, p in body["inputs"].items()})


Alignment = InputAlignment | FanInAlignment


def alignment_from_json(body: Mapping[str, Any]) -> Alignment:
    """Either stored shape: a fan-in has ``inputs``, one stage input does not.

    Raises:
        KeyError, TypeError, ValueError: a malformed alignment (the record's codec names
            the file).
    """
    if not isinstance(body, Mapping):
        raise TypeError(f"alignment is {type(body).__name__}, not an object")
    return FanInAlignment.from_json(body) if "inputs" in body else InputAlignment.from_json(body)
