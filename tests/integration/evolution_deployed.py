"""The version of ``evolution_pipeline``'s function that is "deployed" right now, for the
Airflow test of state evolution: the file named by ``EVOLUTION_DEPLOYED`` holds a version
name (``v1``, ``retyped``, ``dropped``, ...). The restore DAG's tasks load the pipeline
when they run, so each restore sees the version written just before it, as a person's
restore sees the code deployed just before.
"""

from __future__ import annotations

import os
from pathlib import Path

from microcheckpoint.engine import Pipeline
from tests.integration import evolution_pipeline

__all__ = ["deployed"]


def deployed() -> Pipeline:
    """The pipeline of the version the ``EVOLUTION_DEPLOYED`` file names.

    Raises:
        KeyError: ``EVOLUTION_DEPLOYED`` is not set, or the file names no known version.
    """
    version = Path(os.environ["EVOLUTION_DEPLOYED"]).read_text().strip()
    return evolution_pipeline.pipeline(version)
