"""State handles: how a checkpoint's records refer to the files its tasks wrote.

A handle is part of the protocol's records (an ack lists them, ``_metadata`` keeps them,
retention and restore follow them), so it lives here; ``microcheckpoint.state.handles``
re-exports it for the state layer and its users.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StateHandle"]


@dataclass(frozen=True)
class StateHandle:
    """One state file: its key in checkpoint storage, its size, and the key groups it holds.

    ``key_groups`` is empty for files that are not keyed state (staged sink output); the
    stored JSON then has no ``key_groups`` field, and one without it reads as empty.
    """

    key: str
    size: int
    key_groups: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "size": self.size}
        if self.key_groups:
            out["key_groups"] = list(self.key_groups)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateHandle:
        return cls(
            str(data["key"]), int(data["size"]), tuple(int(k) for k in data.get("key_groups", ()))
        )
