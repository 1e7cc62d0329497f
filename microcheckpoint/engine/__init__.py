"""The Spark epoch engine: pipelines of uid'd operators run one epoch per checkpoint."""

from microcheckpoint.engine.api import (
    Aggregate,
    FileSource,
    HybridSource,
    KafkaSource,
    KeyedOperator,
    Pipeline,
    StageSource,
    UnionSource,
    co_keyed,
    running_max,
    running_min,
    running_sum,
)

__all__ = [
    "Aggregate",
    "FileSource",
    "HybridSource",
    "KafkaSource",
    "KeyedOperator",
    "Pipeline",
    "StageSource",
    "UnionSource",
    "co_keyed",
    "running_max",
    "running_min",
    "running_sum",
]
