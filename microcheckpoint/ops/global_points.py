"""Global savepoints and global restores of a multi-stage pipeline, as every edge runs them.

The stages are ``PipelineTarget``s, first stage first; global savepoints may be written to
and restored from the first stage's roots.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import ConfigError
from microcheckpoint.ops.restore import _claim
from microcheckpoint.ops.target import PipelineTarget
from microcheckpoint.protocol.global_savepoints import (
    GlobalSavepoint,
    StageRuntime,
    create_global_savepoint,
    read_global_savepoint,
    restore_global,
)
from microcheckpoint.protocol.records import ClaimMode, RestoreMarker

__all__ = [
    "GlobalRestoreRequest",
    "apply_global_restore",
    "plan_global_restore",
    "stage_parallelisms",
    "take_global_savepoint",
]


def _stages_of(stages: Sequence[PipelineTarget]) -> None:
    names = [s.name for s in stages]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError("stages", names, "two or more stages with distinct names")


def take_global_savepoint(
    name: str, stages: Sequence[PipelineTarget], folder: str | None = None
) -> GlobalSavepoint:
    """Copy the stages' newest aligned cut into one global savepoint.

    ``folder``: a folder URL under the first stage's roots; empty means
    ``<first stage's storage>/<name>/global-savepoints``.

    Raises:
        ConfigError: the folder lies outside the roots.
        RestoreError: no aligned cut is retained.
    """
    _stages_of(stages)
    first = stages[0]
    text = "" if folder in (None, "None") else str(folder).strip()
    text = text or f"{first.config.storage}/{name}/global-savepoints"
    store, prefix = first.locations.locate(text, "target")
    return create_global_savepoint({s.name: s.store for s in stages}, store, prefix)


@dataclass(frozen=True)
class GlobalRestoreRequest:
    """A checked global restore: the point, the claim mode, and new parallelisms by stage."""

    point: GlobalSavepoint
    claim_mode: ClaimMode
    parallelism: dict[str, int]

    def summary(self) -> dict[str, Any]:
        return {
            "location": self.point.location,
            "checkpoints": {p.pipeline: p.checkpoint_id for p in self.point.stages},
            "claim_mode": self.claim_mode.value,
            "parallelism": dict(self.parallelism),
        }


def stage_parallelisms(value: Any, stages: Sequence[PipelineTarget]) -> dict[str, int]:
    """``{stage: subtasks}`` from a form's value (a mapping or its JSON; stages left out
    keep theirs).

    Raises:
        ConfigError: not a JSON object, an unknown stage, or a value outside 1..max_parallelism.
    """
    allowed = 'a JSON object {"<stage>": <subtasks>}'
    raw = value
    if isinstance(raw, str):
        try:
            raw = json.loads(raw.replace("'", '"')) if raw.strip() else {}
        except ValueError as exc:
            raise ConfigError("parallelism", value, allowed) from exc
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("parallelism", raw, allowed)
    by_name = {s.name: s for s in stages}
    out = {}
    for stage, number in raw.items():
        if stage not in by_name:
            raise ConfigError("parallelism", stage, f"one of the stages {sorted(by_name)}")
        limit = by_name[stage].config.max_parallelism
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= limit:
            raise ConfigError(
                f"parallelism of {stage}",
                number,
                f"an integer in 1..{limit} (the stage's max_parallelism)",
            )
        out[stage] = number
    return out


def plan_global_restore(
    stages: Sequence[PipelineTarget],
    point: str | None,
    *,
    claim_mode: ClaimMode | str | bool = ClaimMode.NO_CLAIM,
    parallelism: Any = None,
) -> GlobalRestoreRequest:
    """Check a global restore request; writes nothing.

    Raises:
        ConfigError: no point, a point outside the roots or of other stages, a bad claim
            mode or parallelism.
        RestoreError: no global savepoint there.
    """
    _stages_of(stages)
    text = "" if point in (None, "None") else str(point).strip()
    if not text:
        raise ConfigError("point", point, "the URL of a global savepoint folder")
    mode = _claim(claim_mode)
    store, prefix = stages[0].locations.locate(text, "point")
    found = read_global_savepoint(store, prefix)
    names = sorted(p.pipeline for p in found.stages)
    wanted = sorted(s.name for s in stages)
    if names != wanted:
        raise ConfigError(
            "point", found.location, f"a global savepoint of the stages {wanted} (it holds {names})"
        )
    return GlobalRestoreRequest(found, mode, stage_parallelisms(parallelism, stages))


def apply_global_restore(
    stages: Sequence[PipelineTarget],
    request: GlobalRestoreRequest,
    runtimes: Mapping[str, StageRuntime],
) -> dict[str, RestoreMarker]:
    """Re-base every stage on the global savepoint, then clear each stage's failures and stop.

    Steps: 1. ``protocol.global_savepoints.restore_global`` (every stage stopped, nothing in
    flight); 2. per stage, reset the failure count and allow triggering again.
    """
    # Step 1: the markers.
    markers = restore_global(request.point, runtimes, request.claim_mode, request.parallelism)
    # Step 2: a person restored them.
    for stage in stages:
        coord = runtimes[stage.name].coordinator
        coord.reset_failures()
        coord.resume()
    return markers
