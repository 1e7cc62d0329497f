"""Loading a pipeline from ``module:attribute``: the one loader of the CLI, the Airflow
tasks and ``spark_jobs/run_epoch.py``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from microcheckpoint.errors import ConfigError

__all__ = ["load_pipeline"]


def load_pipeline(
    ref: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    s3_options: Mapping[str, Any] | None = None,
) -> Any:
    """The ``Pipeline`` that ``ref`` names, checked.

    Args:
        ref: ``module:attribute`` of a ``Pipeline``, or of a function returning one (called
            with ``kwargs``); a bare ``module`` means its attribute ``pipeline``.
        kwargs: arguments of that function (refused for a ``Pipeline``).
        name: the pipeline name the caller expects (``--pipeline``, the DAG's spec).
        s3_options: the run's S3 settings, given to every sink without its own.

    Raises:
        ConfigError: the module does not import, the attribute is missing, it is not a
            pipeline, or its name is not ``name``. The message names the value and the fix.
    """
    from microcheckpoint.engine.api import Pipeline

    module, _, attr = ref.partition(":")
    attr = attr or "pipeline"
    if not module or not attr.isidentifier():
        raise ConfigError("pipeline module", ref, "module:attribute of a Pipeline")
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "pipeline module",
            ref,
            f"module {exc.name!r} is not importable; give module:attribute of a Pipeline on "
            "the Python path (run from the project root, or set PYTHONPATH)",
        ) from exc
    target = getattr(found, attr, None)
    if target is None:
        raise ConfigError("pipeline module", ref, f"module {module!r} has no attribute {attr!r}")
    if isinstance(target, Pipeline):
        if kwargs:
            raise ConfigError(
                "pipeline kwargs", dict(kwargs), f"none: {ref} is a Pipeline, not a function"
            )
        pipeline = target
    elif callable(target):
        pipeline = target(**dict(kwargs or {}))
    else:
        pipeline = target
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(
            "pipeline module",
            ref,
            f"a Pipeline or a function returning one, not {type(pipeline).__name__}",
        )
    if name is not None and pipeline.name != name:
        raise ConfigError(
            "pipeline", name, f"the name of the pipeline that {ref} builds ({pipeline.name!r})"
        )
    if s3_options:
        pipeline.use_storage(dict(s3_options))
    return pipeline
