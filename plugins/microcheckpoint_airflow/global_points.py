"""Operators for a multi-stage pipeline's global savepoint and global restore.

Each stage is its own pipeline (its own ``PipelineSpec`` and DAGs); these operators take
all of them, first stage first. The protocol is ``microcheckpoint.protocol.global_savepoints``:
a global savepoint copies the newest aligned cut of retained checkpoints; a global restore
re-bases every stage at it, each with its own parallelism.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from microcheckpoint.errors import ConfigError, MicrocheckpointError
from microcheckpoint.protocol.global_savepoints import (
    GlobalSavepoint,
    create_global_savepoint,
    read_global_savepoint,
    restore_global,
)
from microcheckpoint.protocol.records import ClaimMode
from microcheckpoint_airflow.hooks import CheckpointStorageHook, KafkaHook
from microcheckpoint_airflow.points import split_location
from microcheckpoint_airflow.run_conf import refuse_unknown_conf
from microcheckpoint_airflow.spec import PipelineSpec

__all__ = ["GlobalRestoreOperator", "GlobalSavepointOperator", "ValidateGlobalRestoreOperator"]


class StagesOperator(BaseOperator):
    """Base: the stages' specs (first stage first) and their stores."""

    ui_color = "#fef3e8"

    def __init__(self, *, name: str, specs: tuple[PipelineSpec, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.specs = specs

    @property
    def global_roots(self) -> list[str]:
        """Where global savepoints may be written and read: the first stage's roots."""
        return self.specs[0].roots

    def open_root(self, spec: PipelineSpec, root: str) -> Any:
        return CheckpointStorageHook(spec.storage_conn_id).get_store(root)

    def stores(self) -> dict[str, Any]:
        return {s.name: self.open_root(s, s.config.storage) for s in self.specs}

    def locate(self, url: str, what: str) -> tuple[Any, str]:
        """The store and key prefix of ``url`` (under one of ``roots``)."""
        root, prefix = split_location(url, self.global_roots, what)
        return self.open_root(self.specs[0], root), prefix


class GlobalSavepointOperator(StagesOperator):
    """Copy the stages' newest aligned cut into one global savepoint; returns its URL.

    ``target``: a folder URL under the first stage's roots; empty means
    ``<first stage's storage>/<name>/global-savepoints``.
    """

    template_fields = ("target",)

    def __init__(self, *, target: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def execute(self, context: Any) -> str:
        refuse_unknown_conf(context)
        target = (
            self.target or ""
        ).strip() or f"{self.global_roots[0]}/{self.name}/global-savepoints"
        try:
            store, prefix = self.locate(target, "target")
            point = create_global_savepoint(self.stores(), store, prefix)
        except MicrocheckpointError as exc:
            raise AirflowFailException(str(exc)) from exc
        for stage in point.stages:
            self.log.info("stage %s: checkpoint %s", stage.pipeline, stage.checkpoint_id)
        self.log.info("global savepoint of %s: %s", self.name, point.location)
        return point.location


class ValidateGlobalRestoreOperator(StagesOperator):
    """Check a global restore request before anything changes; returns what it restores."""

    template_fields = ("point", "claim_mode", "parallelism_param")

    def __init__(
        self,
        *,
        point: str = "",
        claim_mode: str = "NO_CLAIM",
        parallelism: str | dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.point = point
        self.claim_mode = claim_mode
        self.parallelism_param = parallelism

    def requested_parallelism(self) -> dict[str, int]:
        """``{stage: subtasks}`` from the form (a JSON object; stages left out keep theirs)."""
        raw = self.parallelism_param
        if isinstance(raw, str):
            try:
                raw = json.loads(raw.replace("'", '"')) if raw.strip() else {}
            except ValueError as exc:
                raise ConfigError(
                    "parallelism", raw, 'a JSON object {"<stage>": <subtasks>}'
                ) from exc
        raw = raw or {}
        if not isinstance(raw, dict):
            raise ConfigError("parallelism", raw, 'a JSON object {"<stage>": <subtasks>}')
        specs = {s.name: s for s in self.specs}
        out = {}
        for stage, value in raw.items():
            if stage not in specs:
                raise ConfigError("parallelism", stage, f"one of the stages {sorted(specs)}")
            limit = specs[stage].config.max_parallelism
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ConfigError(f"parallelism of {stage}", value, f"an integer in 1..{limit}")
            out[stage] = value
        return out

    def resolve(self) -> tuple[GlobalSavepoint, ClaimMode, dict[str, int]]:
        if not str(self.point or "").strip():
            raise ConfigError("point", self.point, "the URL of a global savepoint folder")
        try:
            claim = ClaimMode(str(self.claim_mode).upper())
        except ValueError as exc:
            raise ConfigError("claim_mode", self.claim_mode, "NO_CLAIM or CLAIM") from exc
        store, prefix = self.locate(str(self.point), "point")
        point = read_global_savepoint(store, prefix)
        names = sorted(p.pipeline for p in point.stages)
        if names != sorted(s.name for s in self.specs):
            raise ConfigError(
                "point",
                point.location,
                f"a global savepoint of the stages {sorted(s.name for s in self.specs)} "
                f"(it holds {names})",
            )
        return point, claim, self.requested_parallelism()

    def execute(self, context: Any) -> dict[str, Any]:
        refuse_unknown_conf(context)
        try:
            point, claim, parallelism = self.resolve()
        except MicrocheckpointError as exc:
            raise AirflowFailException(str(exc)) from exc
        return {
            "location": point.location,
            "checkpoints": {p.pipeline: p.checkpoint_id for p in point.stages},
            "claim_mode": claim.value,
            "parallelism": parallelism,
        }


class GlobalRestoreOperator(ValidateGlobalRestoreOperator):
    """Re-base every stage on the global savepoint; clears each stage's failure count and
    stop marker. Every stage must be stopped with nothing in flight (the DAG does that)."""

    def execute(self, context: Any) -> dict[str, Any]:
        from microcheckpoint.engine.cycle import stage_runtime

        try:
            point, claim, parallelism = self.resolve()
            stores = self.stores()
            kafkas = [KafkaHook(s.kafka_conn_id).get_offsets() for s in self.specs]
            try:
                runtimes = {}
                for spec, kafka in zip(self.specs, kafkas, strict=True):
                    pipeline = spec.load_pipeline()
                    options = CheckpointStorageHook(spec.storage_conn_id).store_options(
                        spec.config.storage
                    )
                    runtimes[spec.name] = stage_runtime(
                        pipeline, spec.config, stores[spec.name], kafka, options
                    )
                markers = restore_global(point, runtimes, claim, parallelism)
            finally:
                for kafka in kafkas:
                    kafka.close()
        except MicrocheckpointError as exc:
            raise AirflowFailException(str(exc)) from exc
        for runtime in runtimes.values():
            runtime.coordinator.reset_failures()
            runtime.coordinator.resume()
        for name, marker in markers.items():
            self.log.info("stage %s re-based on %s: %s", name, marker.source, marker.note)
        return {
            name: {
                "source": m.source,
                "offsets": {str(tp): o for tp, o in sorted(m.offsets.items())},
                "parallelism": m.parallelism,
            }
            for name, m in markers.items()
        }
