"""The example pipelines as tests/integration/test_verify.py runs them with ``microcheckpoint
run --module tests.integration.verify_pipelines:<name>``: the examples' own builders, on the
topics (``VERIFY_TAG``) and file-sink folder (``VERIFY_SINK``) the test puts in the script's
environment.

| attribute | example | state backend | sink |
|---|---|---|---|
| ``wordcount_table`` | examples/wordcount.py | ``table`` | file sink |
| ``wordcount_memory`` | examples/wordcount.py | ``memory`` | file sink |
| ``nexmark_table`` | examples/nexmark.py (two keyed operators) | ``table`` | none |
| ``join_stage`` | examples/nexmark_stages.py, stage 1 | ``table`` | stage sink (Kafka) |
| ``hot_items_stage`` | examples/nexmark_stages.py, stage 2 | ``table`` | none |
"""

from __future__ import annotations

import dataclasses
import os

from examples import nexmark, nexmark_stages, wordcount
from microcheckpoint.engine.api import KeyedOperator, Pipeline

__all__ = [
    "NAMES",
    "hot_items_stage",
    "join_stage",
    "nexmark_table",
    "topics",
    "wordcount_memory",
    "wordcount_table",
]

NAMES = {
    "wordcount_table": "wordcount",
    "wordcount_memory": "wordcount-memory",
    "nexmark_table": "nexmark",
    "join_stage": "nexmark-join",
    "hot_items_stage": "nexmark-hot-items",
}


def topics(tag: str) -> dict[str, str]:
    """The topics of run ``tag``: the word count's lines, Nexmark's bids, the stages' three."""
    names = ("lines", "bids", "auctions", "stage-bids", "joined")
    return {name: f"verify-{tag}-{name}" for name in names}


def _with_backend(pipeline: Pipeline, backend: str) -> Pipeline:
    """``pipeline`` with every keyed operator on state backend ``backend``."""
    stages = [
        dataclasses.replace(s, state_backend=backend) if isinstance(s, KeyedOperator) else s
        for s in pipeline.stages
    ]
    return Pipeline(pipeline.name, pipeline.source, stages)


_TOPICS = topics(os.environ.get("VERIFY_TAG", "none"))
_SINK = os.environ.get("VERIFY_SINK", "file:///nonexistent/verify-sink")
_BOOTSTRAP = os.environ.get("MICROCHECKPOINT_KAFKA_BOOTSTRAP", "127.0.0.1:9")

wordcount_table = wordcount.build(_TOPICS["lines"], NAMES["wordcount_table"], _SINK)
wordcount_memory = _with_backend(
    wordcount.build(_TOPICS["lines"], NAMES["wordcount_memory"], _SINK), "memory"
)
nexmark_table = nexmark.build(_TOPICS["bids"], NAMES["nexmark_table"])
join_stage, hot_items_stage = nexmark_stages.build(
    _BOOTSTRAP,
    _TOPICS["auctions"],
    _TOPICS["stage-bids"],
    _TOPICS["joined"],
    (NAMES["join_stage"], NAMES["hot_items_stage"]),
)
