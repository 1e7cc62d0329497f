"""Operators for a multi-stage pipeline's global savepoint and global restore.

Each stage is its own pipeline (its own ``PipelineSpec`` and DAGs); these operators take
all of them, first stage first. The protocol is ``microcheckpoint.protocol.global_savepoints``:
a global savepoint copies the newest aligned cut of retained checkpoints; a global restore
re-bases every stage at it, each with its own parallelism.
"""

from __future__ import annotations

import functools
from typing import Any

from airflow.sdk import BaseOperator

from microcheckpoint.ops import (
    GlobalRestoreRequest,
    PipelineTarget,
    apply_global_restore,
    plan_global_restore,
    take_global_savepoint,
)
from microcheckpoint_airflow import metrics
from microcheckpoint_airflow.hooks import CheckpointStorageHook, KafkaHook
from microcheckpoint_airflow.operators import event_kind, task_errors
from microcheckpoint_airflow.run_conf import refuse_unknown_conf
from microcheckpoint_airflow.spec import PipelineSpec

__all__ = ["GlobalRestoreOperator", "GlobalSavepointOperator", "ValidateGlobalRestoreOperator"]


class StagesOperator(BaseOperator):
    """Base: the stages' specs (first stage first), as the core's targets."""

    ui_color = "#fef3e8"

    def __init__(self, *, name: str, specs: tuple[PipelineSpec, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.specs = specs

    def targets(self) -> list[PipelineTarget]:
        """Each stage's ``PipelineTarget`` with its own storage connection's settings."""
        return [s.target(CheckpointStorageHook(s.storage_conn_id).settings()) for s in self.specs]


class GlobalSavepointOperator(StagesOperator):
    """Copy the stages' newest aligned cut into one global savepoint; returns its URL
    (``ops.take_global_savepoint``).

    ``target``: a folder URL under the first stage's roots; empty means
    ``<first stage's storage>/<name>/global-savepoints``.
    """

    template_fields = ("target",)

    def __init__(self, *, target: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def execute(self, context: Any) -> str:
        refuse_unknown_conf(context)
        with task_errors():
            point = take_global_savepoint(self.name, self.targets(), self.target)
        for stage in point.stages:
            self.log.info("stage %s: checkpoint %s", stage.pipeline, stage.checkpoint_id)
        self.log.info("global savepoint of %s: %s", self.name, point.location)
        return point.location


class ValidateGlobalRestoreOperator(StagesOperator):
    """Check a global restore request before anything changes (``ops.plan_global_restore``);
    returns what it restores."""

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

    def request(self, targets: list[PipelineTarget]) -> GlobalRestoreRequest:
        return plan_global_restore(
            targets, self.point, claim_mode=self.claim_mode, parallelism=self.parallelism_param
        )

    def execute(self, context: Any) -> dict[str, Any]:
        refuse_unknown_conf(context)
        with task_errors():
            return self.request(self.targets()).summary()


class GlobalRestoreOperator(ValidateGlobalRestoreOperator):
    """Re-base every stage on the global savepoint; clears each stage's failure count and
    stop marker (``ops.apply_global_restore``). Every stage must be stopped with nothing in
    flight (the DAG does that)."""

    def execute(self, context: Any) -> dict[str, Any]:
        from microcheckpoint.engine.cycle import stage_runtime

        with task_errors():
            targets = self.targets()
            request = self.request(targets)
            kafkas = [KafkaHook(s.kafka_conn_id).get_offsets() for s in self.specs]
            try:
                runtimes = {}
                for spec, target, kafka in zip(self.specs, targets, kafkas, strict=True):
                    settings = target.locations.settings
                    pipeline = spec.load_pipeline(settings.s3_options())
                    options = settings.options(spec.config.storage)
                    runtimes[spec.name] = stage_runtime(
                        pipeline, spec.config, target.store, kafka, options
                    )
                markers = apply_global_restore(targets, request, runtimes)
            finally:
                for kafka in kafkas:
                    kafka.close()
        stores = {t.name: t for t in targets}
        for name, marker in markers.items():
            self.log.info("stage %s re-based on %s: %s", name, marker.source, marker.note)
            metrics.restore_event(name, functools.partial(event_kind, stores[name], marker.at_ms))
        return {
            name: {
                "source": m.source,
                "offsets": {str(tp): o for tp, o in sorted(m.offsets.items())},
                "parallelism": m.parallelism,
            }
            for name, m in markers.items()
        }
