"""The Spark epoch engine: pipelines of uid'd operators run one epoch per checkpoint."""

from microcheckpoint.engine.api import (
    KafkaSource,
    KeyedOperator,
    Pipeline,
    running_sum,
)

__all__ = ["KafkaSource", "KeyedOperator", "Pipeline", "running_sum"]
