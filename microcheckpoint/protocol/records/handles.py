"""State handles: how a checkpoint's records refer to the files its tasks wrote.

A handle is part of the protocol's records (an ack lists them, ``_metadata`` keeps them,
retention and restore follow them), so it lives here; ``microcheckpoint.state.handles``
re-exports it for the state layer and its users.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import CorruptFile

__all__ = ["StateHandle"]


@dataclass(frozen=True)
class StateHandle:
    """One state file: its key in checkpoint storage, its size, the key groups it holds,
    and the SHA-256 of its bytes.

    ``key_groups`` is empty for files that are not keyed state (staged sink output); the
    stored JSON then has no ``key_groups`` field, and one without it reads as empty.
    ``sha256`` (hex) is written with the file (``of``) and checked on every load
    (``check``); it is empty in handles written before files carried one, which are
    checked by size only.
    """

    key: str
    size: int
    key_groups: tuple[int, ...] = ()
    sha256: str = ""

    @classmethod
    def of(cls, key: str, data: bytes, key_groups: Iterable[int] = ()) -> StateHandle:
        """The handle of ``data`` stored under ``key``: its size and content hash."""
        return cls(key, len(data), tuple(key_groups), hashlib.sha256(data).hexdigest())

    def check(self, data: bytes, url: str, what: str = "state file") -> bytes:
        """``data``, once it is this handle's file: its size and, when the handle has one,
        its content hash.

        Raises:
            CorruptFile: the size or the hash differs; the message names the file (its URL
                holds the checkpoint folder) and what differs.
        """
        if len(data) != self.size:
            raise CorruptFile(
                f"{what} {url} is {len(data)} bytes, its checkpoint recorded {self.size}: "
                "truncated or replaced since it was written; restore an older checkpoint or "
                "savepoint (microcheckpoint verify says which are intact)"
            )
        if self.sha256:
            found = hashlib.sha256(data).hexdigest()
            if found != self.sha256:
                raise CorruptFile(
                    f"{what} {url} has sha256 {found[:16]}…, its checkpoint recorded "
                    f"{self.sha256[:16]}…: its bytes changed since it was written; restore an "
                    "older checkpoint or savepoint (microcheckpoint verify says which are intact)"
                )
        return data

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "size": self.size}
        if self.key_groups:
            out["key_groups"] = list(self.key_groups)
        if self.sha256:
            out["sha256"] = self.sha256
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateHandle:
        return cls(
            str(data["key"]),
            int(data["size"]),
            tuple(int(k) for k in data.get("key_groups", ())),
            str(data.get("sha256", "")),
        )
