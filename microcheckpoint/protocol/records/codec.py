"""One codec for every protocol record: versioned JSON, decoded with errors that name the file."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Protocol, TypeVar

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.storage.port import ObjectStore

__all__ = ["RECORD_VERSION", "decode", "encode", "id_or_none", "read"]

RECORD_VERSION = 1


class _Record(Protocol):
    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R")


def encode(record: _Record) -> bytes:
    """The stored bytes of ``record``: sorted JSON with its ``version``."""
    return json.dumps({**record.to_json(), "version": RECORD_VERSION}, sort_keys=True).encode()


def decode(cls: type[R], data: bytes, source: str) -> R:
    """Parse the bytes of a ``cls`` record read from ``source`` (named in every error).

    Raises:
        MetadataFormatError: not a JSON object, a newer version, or a malformed field.
    """
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetadataFormatError(f"{source} is corrupt: {exc}") from exc
    if not isinstance(body, dict):
        raise MetadataFormatError(f"{source} is not a JSON object")
    version = body.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= RECORD_VERSION:
        raise MetadataFormatError(
            f"{source} has record version {version!r}; this microcheckpoint reads versions "
            f"1..{RECORD_VERSION}. Upgrade microcheckpoint to read it"
        )
    try:
        return cls.from_json(body)  # type: ignore[attr-defined,no-any-return]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise MetadataFormatError(
            f"{source} is not a valid {cls.kind} record ({problem})"  # type: ignore[attr-defined]
        ) from exc


def read(store: ObjectStore, key: str, cls: type[R]) -> R | None:
    """The ``cls`` record stored under ``key``, or None when there is none."""
    obj = store.get(key)
    return None if obj is None else decode(cls, obj.data, store.child_url(key))


def id_or_none(value: Any) -> CheckpointId | None:
    return None if value is None else CheckpointId(int(value))
