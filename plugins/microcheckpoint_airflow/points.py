"""Savepoint targets and restore points named by a person in a Params form, validated.

A location must lie under one of the pipeline's configured roots (its checkpoint storage
and ``savepoint_roots``); a restore point must exist and belong to the pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from microcheckpoint.errors import CheckpointNotFound, ConfigError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.savepoints import RestorePoint, choose_restore
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
    """The restore point a Params value names.

    ``value`` is ``latest`` (the latest usable completed checkpoint), a checkpoint id
    (``7`` or ``chk-7``), or the URL of a savepoint or checkpoint folder under ``roots``.

    Raises:
        ConfigError: a malformed value or a URL outside the roots.
        CheckpointNotFound: nothing restorable there.
        IncompatibleCheckpoint: the point belongs to another pipeline.
    """
    text = str(value if value is not None else "latest").strip()
    if text in ("", "latest"):
        point = choose_restore(store, pipeline)
        if point is None:
            raise CheckpointNotFound(
                f"pipeline {pipeline!r} has no completed checkpoint to restore; give a savepoint URL"
            )
        return point
    match = re.fullmatch(r"(?:chk-)?0*([1-9]\d*)", text)
    if match:
        return choose_restore(store, pipeline, checkpoint=CheckpointId(int(match.group(1))))
    if "://" not in text:
        raise ConfigError(
            "point", text, "latest, a checkpoint id (7 or chk-7), or a savepoint folder URL"
        )
    root, prefix = split_location(text, roots, "point")
    if prefix.endswith("/_metadata") or prefix == "_metadata":
        prefix = prefix[: -len("_metadata")].rstrip("/")
    root_store = store if root == roots[0] else open_root(root)
    return choose_restore(store, pipeline, savepoint=(root_store, prefix))
