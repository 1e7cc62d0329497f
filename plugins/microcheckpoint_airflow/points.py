"""Savepoint targets and restore points named by a person in a Params form, validated.

A location must lie under one of the pipeline's configured roots (its checkpoint storage
and ``savepoint_roots``); a restore point must exist and belong to the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from microcheckpoint.errors import ConfigError
from microcheckpoint.protocol.savepoints import RestorePoint
from microcheckpoint.protocol.savepoints import resolve_point as resolve_savepoint_text
from microcheckpoint.storage import ObjectStore

__all__ = ["resolve_point", "split_location"]

OpenStore = Callable[[str], ObjectStore]


def split_location(url: str, roots: list[str], what: str) -> tuple[str, str]:
    """``(root, key prefix inside it)`` of ``url``; refuses URLs outside every root."""
    url = url.strip().rstrip("/")
    for root in roots:
        if url == root or url.startswith(root + "/"):
            inside = url[len(root) + 1 :]
            if any(part in ("", ".", "..") for part in inside.split("/")) and inside:
                raise ConfigError(what, url, "a path without empty, '.' or '..' segments")
            return root, inside
    raise ConfigError(
        what,
        url,
        f"a location under one of the configured roots ({', '.join(roots)}); add the root to "
        "savepoint_roots in the DAG file to allow it",
    )


def resolve_point(
    value: Any, pipeline: str, store: ObjectStore, roots: list[str], open_root: OpenStore
) -> RestorePoint:
    """The restore point a Params value names (``protocol.savepoints.resolve_point``): a URL
    must lie under ``roots``.

    Raises:
        ConfigError: a malformed value or a URL outside the roots.
        CheckpointNotFound: nothing restorable there.
        IncompatibleCheckpoint: the point belongs to another pipeline.
    """

    def locate(url: str) -> tuple[ObjectStore, str]:
        root, prefix = split_location(url, roots, "point")
        return (store if root == roots[0] else open_root(root)), prefix

    text = str(value if value is not None else "latest")
    return resolve_savepoint_text(text, pipeline, store, locate)
