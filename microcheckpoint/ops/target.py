"""The pipeline an operation works on: its settings, its storage and the roots it may use."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import CheckpointNotFound
from microcheckpoint.ops.stores import Locations, StorageSettings
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.storage import ObjectStore

__all__ = ["PipelineTarget", "list_pipelines"]


@dataclass
class PipelineTarget:
    """One pipeline in one storage root, as every edge names it.

    Args:
        config: the pipeline's checkpoint settings (name, storage root, limits, policies).
        locations: the roots its savepoints may be written to and restored from.
    """

    config: CheckpointConfig
    locations: Locations

    @classmethod
    def of(
        cls,
        pipeline: str,
        storage: str,
        *,
        settings: StorageSettings | None = None,
        savepoint_roots: tuple[str, ...] = (),
        checkpointing: Mapping[str, Any] | None = None,
    ) -> PipelineTarget:
        """The target for ``pipeline`` in ``storage`` (settings validated here).

        Raises:
            ConfigError: a bad name, URL or setting.
        """
        config = CheckpointConfig.from_mapping(
            {**dict(checkpointing or {}), "pipeline": pipeline, "storage": storage.rstrip("/")}
        )
        return cls(
            config, Locations(config.storage, settings or StorageSettings(), savepoint_roots)
        )

    @property
    def name(self) -> str:
        return self.config.pipeline

    @property
    def layout(self) -> Layout:
        return Layout(self.config.pipeline)

    @property
    def store(self) -> ObjectStore:
        return self.locations.store()

    def coordinator(self) -> CheckpointCoordinator:
        return CheckpointCoordinator(self.store, self.config)

    def require_known(self) -> None:
        """Refuse a pipeline with nothing stored (a misspelt ``--pipeline``).

        Raises:
            CheckpointNotFound: nothing is stored under ``<storage>/<pipeline>/``; the message
                names the pipelines that are there, with the closest one.
        """
        if next(iter(self.store.list(self.layout.root)), None) is not None:
            return
        known = list_pipelines(self.store)
        close = difflib.get_close_matches(self.name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        there = f"{hint}pipelines there: {', '.join(known)}" if known else "check the storage URL"
        raise CheckpointNotFound(
            f"pipeline {self.name!r} has nothing stored in {self.config.storage}; {there}"
        )


def list_pipelines(store: ObjectStore) -> list[str]:
    """Names of the pipelines with checkpoints, savepoints or markers in ``store``."""
    names = set()
    for key in store.list(""):
        name, sep, rest = key.partition("/")
        if sep and (
            rest.startswith("chk-") or rest.startswith("savepoints/") or rest.startswith("_")
        ):
            names.add(name)
    return sorted(names)
