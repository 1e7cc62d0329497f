"""Savepoint operations as every edge runs them: take, stop with, dispose.

The CLI commands, the Airflow tasks and the page call these; each validates its own inputs
(the target folder lies under the pipeline's roots, the point is a savepoint of this
pipeline) before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import (
    CheckpointNotFound,
    ConfigError,
    MicrocheckpointError,
    RestoreError,
    ServiceError,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops.target import PipelineTarget
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.records import read_point_metadata
from microcheckpoint.protocol.savepoints import create_savepoint
from microcheckpoint.storage import ObjectStore

__all__ = [
    "SavepointTarget",
    "await_quiet",
    "dispose_savepoint",
    "in_flight_now",
    "plan_savepoint",
    "savepoint_target",
    "stop_with_savepoint",
    "take_savepoint",
]


@dataclass(frozen=True)
class SavepointTarget:
    """Where a savepoint goes: a store and a folder prefix (None: ``<pipeline>/savepoints/``)."""

    store: ObjectStore | None
    prefix: str | None


def savepoint_target(target: PipelineTarget, folder: str | None) -> SavepointTarget:
    """The folder URL ``folder`` checked against the pipeline's roots (empty: the default).

    Raises:
        ConfigError: the folder lies outside every root, or has ``.``/``..`` segments.
    """
    text = "" if folder in (None, "None") else str(folder).strip()
    if not text:
        return SavepointTarget(None, None)
    store, prefix = target.locations.locate(text, "target")
    return SavepointTarget(store, prefix)


def plan_savepoint(target: PipelineTarget, folder: str | None) -> SavepointTarget:
    """Check a savepoint request before anything stops or is written: the folder lies under
    the roots, and there is a checkpoint to take it from (completed, or in flight).

    Raises:
        ConfigError: the folder lies outside every root.
        CheckpointNotFound: no checkpoint (or a misspelt pipeline).
    """
    where = savepoint_target(target, folder)
    _has_a_checkpoint(target, target.coordinator())
    return where


def _has_a_checkpoint(target: PipelineTarget, coord: CheckpointCoordinator) -> None:
    view = coord.view()
    if view.latest_completed is None and not view.in_flight:
        raise CheckpointNotFound(
            f"pipeline {target.name!r} has no completed checkpoint to take a savepoint from, "
            "and none in flight; let a checkpoint complete first"
        )


def take_savepoint(
    target: PipelineTarget,
    folder: str | None = None,
    *,
    checkpoint: CheckpointId | None = None,
    labels: Mapping[str, Any] | None = None,
) -> str:
    """A savepoint of the latest completed checkpoint (or ``checkpoint``); returns its URL.

    Raises:
        ConfigError: ``folder`` outside the roots.
        CheckpointNotFound: nothing to take a savepoint from (or a misspelt pipeline).
    """
    where = savepoint_target(target, folder)
    coord = target.coordinator()
    _has_a_checkpoint(target, coord)
    return create_savepoint(
        coord.store,
        target.name,
        checkpoint,
        target=where.store,
        target_prefix=where.prefix,
        labels=labels,
    )


def in_flight_now(coord: CheckpointCoordinator) -> list[CheckpointId]:
    """Checkpoints in flight, after aborting those past their timeout."""
    coord.abort_expired()
    return coord.view().in_flight


def await_quiet(
    coord: CheckpointCoordinator,
    timeout_s: float,
    *,
    on_wait: Callable[[list[CheckpointId]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until no checkpoint of ``coord``'s pipeline is in flight.

    Raises:
        RestoreError: some are still in flight after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while busy := in_flight_now(coord):
        if time.monotonic() > deadline:
            raise RestoreError(
                f"checkpoints {[c.value for c in busy]} of {coord.config.pipeline!r} are still "
                f"in flight after {timeout_s:g} s; try again, or allow a longer timeout"
            )
        if on_wait is not None:
            on_wait(busy)
        sleep(1.0)


def stop_with_savepoint(
    target: PipelineTarget,
    folder: str | None = None,
    *,
    timeout_s: float = 600.0,
    labels: Mapping[str, Any] | None = None,
    pause: Callable[[], None] | None = None,
    on_wait: Callable[[list[CheckpointId]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Stop triggering, take a savepoint, then ``pause`` the scheduler (Flink's stop).

    Steps: 1. check the folder and that there is a checkpoint (nothing is written before);
    2. suspend triggering; 3. wait until no checkpoint is in flight; 4. take the savepoint;
    5. ``pause`` (the Airflow DAG, when the edge can reach it). If step 3 or 4 fails,
    triggering resumes: the pipeline keeps running, as in Flink. Returns the savepoint's URL.

    Raises:
        ConfigError, CheckpointNotFound: bad input (nothing changed).
        RestoreError: checkpoints still in flight after ``timeout_s`` (triggering resumed).
        ServiceError: the savepoint exists and triggering is stopped, but ``pause`` failed;
            the message names the savepoint.
    """
    # Step 1: validate.
    plan_savepoint(target, folder)
    coord = target.coordinator()
    # Step 2: stop triggering.
    coord.suspend(f"stop with savepoint ({_who(labels)})")
    try:
        # Step 3: no checkpoint in flight.
        await_quiet(coord, timeout_s, on_wait=on_wait, sleep=sleep)
        # Step 4: the savepoint.
        url = take_savepoint(target, folder, labels=labels)
    except BaseException:
        coord.resume()
        raise
    # Step 5: the scheduler stops starting runs.
    if pause is not None:
        try:
            pause()
        except MicrocheckpointError as exc:
            raise ServiceError(
                f"savepoint {url} was taken and triggering of {target.name!r} is stopped, but "
                f"the scheduler was not paused: {exc}"
            ) from exc
    return url


def _who(labels: Mapping[str, Any] | None) -> str:
    labels = labels or {}
    return str(labels.get("run_id") or labels.get("by") or "requested")


def dispose_savepoint(target: PipelineTarget, url: str) -> int:
    """Delete the savepoint at folder ``url`` (Flink's ``savepoint --dispose``); returns the
    number of objects deleted.

    Steps: 1. check: under the pipeline's roots, a savepoint (not a checkpoint) of this
    pipeline, and not the point of a restore no checkpoint has completed after; 2. delete
    its ``_metadata`` first (it stops being restorable at once), then its files.

    Raises:
        ConfigError: outside the roots, or a checkpoint's folder.
        CheckpointNotFound: no savepoint there.
        IncompatibleCheckpoint: another pipeline's savepoint.
        RestoreError: the pipeline still needs it (its restore has no checkpoint yet).
    """
    from microcheckpoint.errors import IncompatibleCheckpoint

    store, prefix = target.locations.locate(url.rstrip("/").removesuffix("/_metadata"), "savepoint")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    # Step 1: what it is.
    meta = read_point_metadata(store, prefix)
    location = store.child_url(prefix.rstrip("/"))
    if meta.kind != "savepoint":
        raise ConfigError(
            "savepoint", location, "a savepoint folder; checkpoints are deleted by retention"
        )
    if meta.pipeline != target.name:
        raise IncompatibleCheckpoint(
            f"{location} is a savepoint of pipeline {meta.pipeline!r}, not {target.name!r}; "
            "dispose it with that pipeline"
        )
    view = target.coordinator().view()
    marker = view.restore_marker
    if (
        marker is not None
        and store.child_url(prefix.rstrip("/")) == marker.source
        and not any(c.value > marker.after_id for c in view.completed)
    ):
        raise RestoreError(
            f"{location} is the point {target.name!r} was restored from, and no checkpoint "
            "has completed since; dispose it after the next checkpoint completes"
        )
    if store.url == target.store.url:
        for cid in view.completed:
            if any(h.key.startswith(prefix) for h in view.metadata(cid).handles):
                raise RestoreError(
                    f"{location} holds state files that checkpoint {cid} of {target.name!r} "
                    "references (it was restored in CLAIM mode); dispose it once retention "
                    "has dropped that checkpoint"
                )
    # Step 2: the commit point first, then the files.
    store.delete(prefix + "_metadata")
    deleted = 1
    for key in list(store.list(prefix)):
        store.delete(key)
        deleted += 1
    return deleted
