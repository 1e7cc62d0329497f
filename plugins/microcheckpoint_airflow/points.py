"""Savepoint targets and restore points named in a Params form: a thin shim over
``microcheckpoint.ops`` (``Locations.split`` and ``protocol.savepoints.resolve_point``),
kept for DAG files and tests that import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from microcheckpoint.ops import Locations
from microcheckpoint.protocol.savepoints import RestorePoint
from microcheckpoint.protocol.savepoints import resolve_point as resolve_savepoint_text
from microcheckpoint.storage import ObjectStore

__all__ = ["resolve_point", "split_location"]

OpenStore = Callable[[str], ObjectStore]


def split_location(url: str, roots: list[str], what: str) -> tuple[str, str]:
    """``(root, key prefix inside it)`` of ``url``; refuses URLs outside every root."""
    return Locations(roots[0], savepoint_roots=tuple(roots[1:])).split(url, what)


def resolve_point(
    value: Any, pipeline: str, store: ObjectStore, roots: list[str], open_root: OpenStore
) -> RestorePoint:
    """The restore point a Params value names; a URL must lie under ``roots``.

    Raises:
        ConfigError: a malformed value or a URL outside the roots.
        CheckpointNotFound: nothing restorable there.
        IncompatibleCheckpoint: the point belongs to another pipeline.
    """

    def locate(url: str) -> tuple[ObjectStore, str]:
        root, prefix = split_location(url, roots, "point")
        return (store if root == roots[0].rstrip("/") else open_root(root)), prefix

    text = str(value if value is not None else "latest")
    return resolve_savepoint_text(text, pipeline, store, locate)
