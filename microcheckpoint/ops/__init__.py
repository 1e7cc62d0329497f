"""The operations a person starts, each one function below the edges.

The CLI, the Airflow operators and the Checkpoints page call these and only translate their
errors; each validates its own inputs before it writes anything, so an edge cannot accept
what another edge refuses.

| operation | function |
|---|---|
| open a store from a URL and endpoint | ``StorageSettings.open``, ``Locations`` |
| load a pipeline from ``module:attr`` | ``load_pipeline`` |
| savepoint | ``take_savepoint`` |
| stop with savepoint | ``stop_with_savepoint`` |
| dispose a savepoint | ``dispose_savepoint`` |
| restore / re-base | ``plan_restore`` + ``apply_restore`` (``restore_pipeline``: suspend, wait, apply) |
| a parallelism in 1..max_parallelism | ``parse_parallelism`` |
| cancel | ``cancel_pipeline`` |
| pipelines in a root | ``list_pipelines`` |
| global savepoint / restore | ``take_global_savepoint``, ``plan_global_restore`` + ``apply_global_restore`` |
| replay audit of epoch N | ``ops.audit.plan_audit`` + ``audit_epoch`` (imported on use: it needs Spark) |
"""

from __future__ import annotations

from microcheckpoint.ops.cancel import cancel_pipeline, cleanup_policy
from microcheckpoint.ops.global_points import (
    GlobalRestoreRequest,
    apply_global_restore,
    plan_global_restore,
    take_global_savepoint,
)
from microcheckpoint.ops.pipelines import load_pipeline
from microcheckpoint.ops.restore import (
    RestoreRequest,
    apply_restore,
    parse_parallelism,
    plan_restore,
    restore_pipeline,
)
from microcheckpoint.ops.savepoints import (
    SavepointTarget,
    await_quiet,
    dispose_savepoint,
    in_flight_now,
    plan_savepoint,
    savepoint_target,
    stop_with_savepoint,
    take_savepoint,
)
from microcheckpoint.ops.stores import Locations, StorageSettings
from microcheckpoint.ops.target import PipelineTarget, list_pipelines

__all__ = [
    "GlobalRestoreRequest",
    "Locations",
    "PipelineTarget",
    "RestoreRequest",
    "SavepointTarget",
    "StorageSettings",
    "apply_global_restore",
    "apply_restore",
    "await_quiet",
    "cancel_pipeline",
    "cleanup_policy",
    "dispose_savepoint",
    "in_flight_now",
    "list_pipelines",
    "load_pipeline",
    "parse_parallelism",
    "plan_global_restore",
    "plan_restore",
    "plan_savepoint",
    "restore_pipeline",
    "savepoint_target",
    "stop_with_savepoint",
    "take_global_savepoint",
    "take_savepoint",
]
