"""One pipeline's wiring, shared by its three DAGs and all their tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from microcheckpoint.config import BarrierPolicy, CheckpointConfig
from microcheckpoint.errors import ConfigError
from microcheckpoint.ops import Locations, PipelineTarget, StorageSettings, load_pipeline
from microcheckpoint_airflow.hooks import (
    DEFAULT_API_CONN_ID,
    DEFAULT_KAFKA_CONN_ID,
    DEFAULT_STORAGE_CONN_ID,
)

__all__ = ["PipelineSpec"]


@dataclass(frozen=True)
class PipelineSpec:
    """A pipeline as the DAGs see it.

    Args:
        name: pipeline name (the ``Pipeline``'s own name; DAG ids derive from it).
        pipeline: ``module:attribute`` of a ``Pipeline``, or of a function returning one
            (called with ``pipeline_kwargs``). Imported when a task runs, never at parse time.
        checkpointing: checkpoint settings (docs/operations.md), validated when the DAG file loads.
        parallelism: subtasks per keyed operator and sink (a restore may change it).
        savepoint_roots: storage roots besides ``storage`` where savepoints may be written
            and restored from; anything else is refused.
        after: for a stage of a multi-stage pipeline (docs/stages.md), the upstream stage's
            pipeline name: this pipeline's DAG runs when that one completes a checkpoint
            (its Asset), instead of at an interval.
        watch_conn_id: event-driven epochs (docs/airflow.md): a Kafka connection (type
            ``kafka``; extra ``bootstrap.servers`` and a ``group.id`` of this pipeline's
            own) whose consumer group watches the source topics (``topics``); the DAG runs
            when a record arrives that no completed checkpoint holds, and, with an
            ``interval``, at least that often.
    """

    name: str
    pipeline: str
    checkpointing: dict[str, Any]
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)
    parallelism: int = 2
    storage_conn_id: str = DEFAULT_STORAGE_CONN_ID
    kafka_conn_id: str = DEFAULT_KAFKA_CONN_ID
    api_conn_id: str = DEFAULT_API_CONN_ID
    savepoint_roots: tuple[str, ...] = ()
    after: str | None = None
    watch_conn_id: str | None = None

    def __post_init__(self) -> None:
        config = self.config  # validate now: a bad value fails the DAG file's import, loudly
        if (
            isinstance(self.parallelism, bool)
            or not isinstance(self.parallelism, int)
            or not (1 <= self.parallelism <= config.max_parallelism)
        ):
            raise ConfigError(
                "parallelism", self.parallelism, f"an integer in 1..{config.max_parallelism}"
            )
        for root in self.savepoint_roots:
            if not (root.startswith("s3://") or root.startswith("file:///")):
                raise ConfigError(
                    "savepoint_roots", root, "URLs s3://bucket[/prefix] or file:///path"
                )
        if ":" not in self.pipeline:
            raise ConfigError("pipeline", self.pipeline, "'module:attribute' of a Pipeline")
        if self.after is not None:
            if not self.after or self.after == self.name:
                raise ConfigError(
                    "after", self.after, "the name of the upstream stage's pipeline (not this one)"
                )
            if config.interval is not None:
                raise ConfigError(
                    "interval",
                    config.interval,
                    "no interval for a stage that runs after another (its upstream's "
                    "completed checkpoints schedule it)",
                )

        if self.watch_conn_id is not None:
            self._check_watch(config)

    def _check_watch(self, config: CheckpointConfig) -> None:
        if not isinstance(self.watch_conn_id, str) or not self.watch_conn_id:
            raise ConfigError("watch_conn_id", self.watch_conn_id, "a Kafka connection id")
        if self.after is not None:
            raise ConfigError(
                "watch_conn_id",
                self.watch_conn_id,
                "none for a stage that runs after another (its upstream's checkpoints schedule it)",
            )
        if config.barrier_policy is BarrierPolicy.DATA_INTERVAL:
            raise ConfigError(
                "watch_conn_id",
                self.watch_conn_id,
                "none with barrier_policy data_interval (its epochs follow the schedule's "
                "intervals)",
            )
        if not config.topics:
            raise ConfigError(
                "topics", [], "the source topics, in checkpointing, for the watcher to watch"
            )

    @cached_property
    def config(self) -> CheckpointConfig:
        return CheckpointConfig.from_mapping({"pipeline": self.name, **self.checkpointing})

    @property
    def config_mapping(self) -> dict[str, Any]:
        return self.config.to_mapping()

    @property
    def dag_id(self) -> str:
        return f"{self.name}_pipeline"

    @property
    def savepoint_dag_id(self) -> str:
        return f"{self.name}_savepoint"

    @property
    def restore_dag_id(self) -> str:
        return f"{self.name}_restore"

    @property
    def cancel_dag_id(self) -> str:
        return f"{self.name}_cancel"

    @property
    def roots(self) -> list[str]:
        """Storage roots a savepoint may be written to or restored from."""
        return [self.config.storage.rstrip("/")] + [r.rstrip("/") for r in self.savepoint_roots]

    def load_pipeline(self, s3_options: dict[str, Any] | None = None) -> Any:
        """Import the pipeline (at run time) and check it carries this spec's name; sinks
        without S3 settings of their own get ``s3_options`` (``ops.load_pipeline``)."""
        return load_pipeline(
            self.pipeline, self.pipeline_kwargs, name=self.name, s3_options=s3_options
        )

    def target(self, settings: StorageSettings) -> PipelineTarget:
        """The core's view of this pipeline: its settings and the roots of its savepoints."""
        return PipelineTarget(
            self.config, Locations(self.config.storage, settings, self.savepoint_roots)
        )
