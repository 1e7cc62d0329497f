"""Restore (re-base) a pipeline on a checkpoint or savepoint: the one sequence of the CLI's
``restore``, the restore DAG and the page.

A point is named one way everywhere: ``latest``, a checkpoint id (``7``, ``chk-7``), or the
URL of a savepoint or checkpoint folder (what ``take_savepoint`` returns).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import ConfigError, MetadataFormatError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops.savepoints import await_quiet
from microcheckpoint.ops.target import PipelineTarget
from microcheckpoint.protocol.records import ClaimMode, RestoreMarker
from microcheckpoint.protocol.savepoints import (
    RestorePoint,
    check_restorable,
    resolve_point,
    restore,
)
from microcheckpoint.state.evolution import Declared, check_evolution, recorded_descriptors

__all__ = [
    "RestoreRequest",
    "apply_restore",
    "parse_parallelism",
    "plan_restore",
    "restore_pipeline",
]


@dataclass(frozen=True)
class RestoreRequest:
    """A checked restore: what it starts from and how.

    ``dropped`` are operator uids whose state the point holds and the pipeline no longer
    has, ``dropped_states`` the ``uid/state`` names of states the pipeline's operators no
    longer declare (both only with ``allow_non_restored_state``).
    """

    point: RestorePoint
    claim_mode: ClaimMode
    parallelism: int | None
    dropped: tuple[str, ...]
    dropped_states: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """What a person sees before it happens (a task's XCom, ``--json``);
        ``dropped_states`` only when a state is left unread."""
        meta = self.point.metadata
        return (
            {
                "location": self.point.location,
                "checkpoint": meta.checkpoint_id.value,
                "kind": meta.kind,
                "claim_mode": self.claim_mode.value,
                "parallelism": self.parallelism,
                "dropped_state": list(self.dropped),
                "offsets": {str(tp): o for tp, o in sorted(meta.offsets.items())},
            }
            | ({"note": self.point.note} if self.point.note else {})
            | ({"dropped_states": list(self.dropped_states)} if self.dropped_states else {})
        )


def _claim(value: ClaimMode | str | bool) -> ClaimMode:
    if isinstance(value, ClaimMode):
        return value
    if isinstance(value, bool):
        return ClaimMode.CLAIM if value else ClaimMode.NO_CLAIM
    try:
        return ClaimMode(str(value).strip().upper())
    except ValueError as exc:
        raise ConfigError("claim_mode", value, "NO_CLAIM or CLAIM") from exc


def parse_parallelism(value: Any, limit: int) -> int | None:
    """``value`` (an int or its text, as a form or a command line gives it) as a parallelism
    in 1..``limit``; None, ``""`` or ``"None"`` mean None (keep the current one).

    Raises:
        ConfigError: not an integer (a boolean included), or outside 1..``limit``.
    """
    if value in (None, "", "None"):
        return None
    allowed = f"an integer in 1..{limit} (the pipeline's max_parallelism)"
    if isinstance(value, bool):
        raise ConfigError("parallelism", value, allowed)
    try:
        number = int(str(value).strip())
    except ValueError as exc:
        raise ConfigError("parallelism", value, allowed) from exc
    if not 1 <= number <= limit:
        raise ConfigError("parallelism", number, allowed)
    return number


def _max_parallelism(target: PipelineTarget, point: RestorePoint) -> int:
    stored = point.metadata.config.get("max_parallelism")
    try:
        return int(stored) if stored not in (None, "") else target.config.max_parallelism
    except (TypeError, ValueError):
        return target.config.max_parallelism


def _current(target: PipelineTarget) -> tuple[list[str], Declared] | None:
    """The operator uids and state descriptors of the pipeline's newest readable completed
    checkpoint (None: none yet). A corrupt ``_metadata`` is passed over, as
    ``choose_restore`` passes it over for ``latest``: it must not fail a restore that falls
    back to an older checkpoint."""
    view = target.coordinator().view()
    for cid in reversed(view.completed):
        try:
            meta = view.metadata(cid)
        except MetadataFormatError:
            continue
        return sorted({str(t.uid) for t in meta.acks}), recorded_descriptors(meta)
    return None


def plan_restore(
    target: PipelineTarget,
    point: str | None = "latest",
    *,
    claim_mode: ClaimMode | str | bool = ClaimMode.NO_CLAIM,
    parallelism: Any = None,
    allow_non_restored_state: bool = False,
    uids: Iterable[str] | None = None,
    descriptors: Declared | None = None,
) -> RestoreRequest:
    """Check a restore request; writes nothing.

    Args:
        target: the pipeline.
        point: ``latest`` (or empty), a checkpoint id, or a folder URL under the roots.
        claim_mode: ``NO_CLAIM`` (default) or ``CLAIM``.
        parallelism: subtasks from now on, 1..max_parallelism (None: keep).
        allow_non_restored_state: drop state of operators the pipeline no longer has, and
            leave unread states its operators no longer declare (``state.evolution``).
        uids: the pipeline's operator uids (None: those of its latest checkpoint, if any).
        descriptors: the pipeline's state descriptors per keyed operator
            (``state.evolution.pipeline_descriptors``; None: those its latest checkpoint
            records, if any).

    Raises:
        ConfigError: a malformed value, a URL outside the roots, parallelism out of range.
        CheckpointNotFound: nothing restorable there (or a misspelt pipeline).
        IncompatibleCheckpoint: another pipeline's point, state without an operator, or
            state descriptors the pipeline's cannot read (a changed kind or type; a dropped
            state without ``allow_non_restored_state``).
    """
    mode = _claim(claim_mode)
    text = "latest" if point in (None, "None") else str(point)
    found = resolve_point(text, target.name, target.store, target.locations.locate)
    number = parse_parallelism(parallelism, _max_parallelism(target, found))
    current = _current(target) if uids is None or descriptors is None else None
    known = list(uids) if uids is not None else current and current[0]
    dropped = check_restorable(found, known, allow_non_restored_state) if known else []
    declared = descriptors if descriptors is not None else current and current[1]
    states = check_evolution(found, declared, allow_non_restored_state) if declared else []
    return RestoreRequest(
        found, mode, number, tuple(dropped), tuple(f"{c.uid}/{c.name}" for c in states)
    )


def apply_restore(
    target: PipelineTarget, request: RestoreRequest, labels: Mapping[str, Any] | None = None
) -> RestoreMarker:
    """Re-base the pipeline on a checked request, clear its failures and its stop.

    Steps: 1. write the restore marker (a point outside the pipeline's storage is copied in
    first); 2. reset the failure count; 3. allow triggering again.
    """
    coord = target.coordinator()
    # Step 1: the marker.
    marker = restore(
        coord.store,
        target.name,
        request.point,
        request.claim_mode,
        request.parallelism,
        labels=labels,
    )
    # Step 2 and 3: a person restored it: failures are acknowledged, triggering resumes.
    coord.reset_failures()
    coord.resume()
    return marker


def restore_pipeline(
    target: PipelineTarget,
    request: RestoreRequest,
    *,
    labels: Mapping[str, Any] | None = None,
    timeout_s: float = 600.0,
    on_wait: Callable[[list[CheckpointId]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RestoreMarker:
    """The whole restore of a request ``plan_restore`` checked (nothing was written on bad
    input), as the restore DAG runs it in tasks.

    Steps: 1. stop triggering; 2. wait until no checkpoint is in flight; 3.
    ``apply_restore``. If step 2 or 3 fails, a pipeline that was running keeps running.
    """
    coord = target.coordinator()
    was_stopped = coord.suspended() is not None
    # Step 1: stop triggering.
    coord.suspend(
        f"restore ({(labels or {}).get('run_id') or (labels or {}).get('by') or 'requested'})"
    )
    try:
        # Step 2: nothing in flight.
        await_quiet(coord, timeout_s, on_wait=on_wait, sleep=sleep)
    except BaseException:
        if not was_stopped:
            coord.resume()
        raise
    # Step 3: re-base (it also resumes triggering).
    return apply_restore(target, request, labels)
