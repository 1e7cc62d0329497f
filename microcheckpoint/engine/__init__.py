"""The Spark epoch engine: pipelines of uid'd operators run one epoch per checkpoint."""

from microcheckpoint.engine.api import (
    Aggregate,
    FileSource,
    HybridSource,
    KafkaSource,
    KeyedOperator,
    KeyedProcess,
    Pipeline,
    StageSource,
    UnionSource,
    co_keyed,
    running_max,
    running_min,
    running_sum,
)
from microcheckpoint.engine.operator_state import (
    PartitionContext,
    PartitionFunction,
    PartitionOperator,
    broadcast_state,
    operator_list_state,
    union_list_state,
)
from microcheckpoint.engine.process import KeyedProcessFunction, ProcessContext
from microcheckpoint.engine.watermarks import EventTime
from microcheckpoint.engine.windows import (
    WindowAggregator,
    count_rows,
    max_of,
    min_of,
    session_window,
    sliding_window,
    sum_of,
    tumbling_window,
)
from microcheckpoint.state.kinds import (
    Aggregator,
    StateTtl,
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)

__all__ = [
    "Aggregate",
    "Aggregator",
    "EventTime",
    "KeyedProcess",
    "KeyedProcessFunction",
    "ProcessContext",
    "StateTtl",
    "aggregating_state",
    "list_state",
    "map_state",
    "reducing_state",
    "value_state",
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
    # operator state (engine/operator_state.py)
    "PartitionContext",
    "PartitionFunction",
    "PartitionOperator",
    "broadcast_state",
    "operator_list_state",
    "union_list_state",
    # windows (engine/windows.py)
    "WindowAggregator",
    "count_rows",
    "max_of",
    "min_of",
    "session_window",
    "sliding_window",
    "sum_of",
    "tumbling_window",
]
