"""The crash tests' sequence check with its output published: the cluster tests' pipeline.

``seq-check`` (``crash_pipeline.check_sequence``) emits one row ``{"k", "last"}`` per key
and epoch; a ``FileSink`` publishes them after ``_metadata``. The topic and the sink's
folder come from ``CRASH_TOPIC`` and ``CLUSTER_SINK``, read at import by the driver.
"""

from __future__ import annotations

import os

from microcheckpoint.engine.api import KafkaSource, KeyedOperator, Pipeline
from microcheckpoint.sinks.files import FileSink
from tests.integration.crash_pipeline import NAME, OPERATOR, TOPIC, check_sequence

__all__ = ["SINK", "pipeline"]

SINK = "seq-out"

pipeline = (
    Pipeline(
        NAME,
        KafkaSource("src", [TOPIC], value_format="json", schema={"k": "string", "seq": "long"}),
    )
    .then(KeyedOperator(OPERATOR, key="k", fn=check_sequence, output_schema="k string, last long"))
    .then(FileSink(SINK, os.environ.get("CLUSTER_SINK", "file:///tmp/cluster-sink")))
)
