"""The manifest of a global savepoint: ``<folder>/_global``, one savepoint per stage.

Written last and put-if-absent by ``protocol.global_savepoints.create_global_savepoint``, so
a global savepoint is whole or absent. Stored as::

    {"kind": "global-savepoint", "version": 1,
     "stages": [{"pipeline", "checkpoint_id", "folder",
                 "inputs": [{"upstream", "epoch", "topics"}, ...]}, ...]}

``folder`` is relative to the folder holding ``_global``. Manifests written before the
records' codec (indented JSON, the same fields) read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["GlobalManifest", "StageInput", "StagePoint"]


@dataclass(frozen=True)
class StageInput:
    """A stage input of a checkpoint: the upstream stage, the epoch its markers ended, the
    internal topics."""

    upstream: str
    epoch: int
    topics: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "epoch": self.epoch, "topics": list(self.topics)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> StageInput:
        return cls(str(body["upstream"]), int(body["epoch"]), tuple(map(str, body["topics"])))


@dataclass(frozen=True)
class StagePoint:
    """One stage in a global savepoint: its checkpoint, its savepoint folder (relative to
    the global savepoint's folder) and its stage inputs."""

    pipeline: str
    checkpoint_id: int
    folder: str
    inputs: tuple[StageInput, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "checkpoint_id": self.checkpoint_id,
            "folder": self.folder,
            "inputs": [i.to_json() for i in self.inputs],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> StagePoint:
        return cls(
            str(body["pipeline"]),
            int(body["checkpoint_id"]),
            str(body["folder"]),
            tuple(StageInput.from_json(i) for i in body["inputs"]),
        )


@dataclass(frozen=True)
class GlobalManifest:
    """``_global``: the stages of a global savepoint, in the order they were given."""

    kind: ClassVar[str] = "global-savepoint"

    stages: tuple[StagePoint, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "stages": [p.to_json() for p in self.stages]}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> GlobalManifest:
        """Raises ValueError for another kind of record (KeyError, TypeError: malformed)."""
        if body.get("kind") != cls.kind:
            raise ValueError(f"kind {body.get('kind')!r}, not {cls.kind!r}")
        return cls(tuple(StagePoint.from_json(s) for s in body["stages"]))
