"""The pipeline API: a Kafka source, stateless DataFrame code, and managed keyed operators.

A pipeline is a source followed by stages. A stage is either a function
``DataFrame -> DataFrame`` (stateless PySpark code) or a ``KeyedOperator`` (managed keyed
state, snapshotted every epoch). Every stateful operator has a ``uid``; state is matched
to operators by uid on restore, so a uid must be stable and unique.

The word count of Flink's documentation::

    from pyspark.sql import functions as F
    from microcheckpoint.engine import KafkaSource, Pipeline, running_sum

    pipeline = (
        Pipeline("wordcount", KafkaSource("lines-source", ["lines"], value_format="text"))
        .then(lambda df: df.select(F.explode(F.split("value", r"\\s+")).alias("word")))
        .then(lambda df: df.where("word != ''"))
        .then(running_sum("word-counts", key="word"))
    )
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.engine.operator_state import PartitionOperator
from microcheckpoint.engine.process import LATE_POLICIES, KeyedProcessFunction
from microcheckpoint.engine.source_api import (
    FileSource,
    HybridSource,
    KafkaSource,
    Source,
    StageSource,
    UnionSource,
    source_event_time,
    uid_of,
)
from microcheckpoint.errors import ConfigError
from microcheckpoint.ids import OperatorUid
from microcheckpoint.sinks.base import Sink
from microcheckpoint.state.backends import check_backend

__all__ = [
    "Aggregate",
    "FileSource",
    "HybridSource",
    "KafkaSource",
    "KeyedOperator",
    "KeyedProcess",
    "Pipeline",
    "StageSource",
    "UnionSource",
    "co_keyed",
    "running_max",
    "running_min",
    "running_sum",
    "source_event_time",
]

# fn(key, rows of this epoch for the key, previous state or None) -> (outputs, new state);
# a new state of None deletes the key's state.
KeyedFunction = Callable[[Any, list[dict[str, Any]], Any], tuple[list[dict[str, Any]], Any]]


@dataclass(frozen=True)
class Aggregate:
    """A built-in aggregation: Spark SQL computes it per key, the state merges it per key.

    ``kind`` is ``sum`` or ``count`` (the state adds), ``min`` or ``max``; ``value`` is the
    column (None for ``count``); ``output`` names the result column next to ``key``.
    """

    kind: str
    value: str | None
    output: str

    def __post_init__(self) -> None:
        if self.kind not in ("sum", "count", "min", "max"):
            raise ConfigError("aggregate", self.kind, "one of sum, count, min, max")
        if (self.value is None) != (self.kind == "count"):
            raise ConfigError(
                "value", self.value, f"a column for {self.kind} (None only for count)"
            )


@dataclass(frozen=True)
class KeyedOperator:
    """A general keyed stateful operator.

    Args:
        uid: stable, unique operator id.
        key: the column holding the key (JSON-serializable values).
        fn: a ``KeyedProcessFunction`` (named state of every kind, timers: see
            ``KeyedProcess``), or ``fn(key, rows, state) -> (outputs, new_state)``; rows are
            this epoch's rows of the key in a deterministic order (by source position when the rows carry
            ``partition`` and ``offset``, else by their content); ``state`` is None for a
            new key (or one whose state expired); returning None as new state deletes it.
        output_schema: Spark DDL of the output rows, e.g. ``"word string, count long"``.
        state_ttl_s: a key's state expires this long after its last update (measured in
            checkpoint trigger time, so re-runs are deterministic); None keeps it forever.
        state_backend: ``table`` (incremental Parquet files) or ``memory``.
        aggregate: set by the built-ins (``running_sum``, ``running_min``, ...): the engine
            then computes the per-key aggregate with Spark SQL and merges it with the state,
            with no Python per record; ``fn`` stays the reference of what it computes.
        late: with event time, what happens to a row at or below the watermark the epoch
            started with: ``drop`` (counted) or ``side_output`` (counted, and given to the
            function's ``on_late``, whose rows join the output).
    """

    uid: str
    key: str
    fn: KeyedFunction
    output_schema: str
    state_ttl_s: float | None = None
    state_backend: str = "table"
    aggregate: Aggregate | None = None
    late: str = "drop"

    def __post_init__(self) -> None:
        object.__setattr__(self, "uid", uid_of("stateful operator", self.uid))
        check_backend(self.state_backend)
        if self.state_ttl_s is not None and self.state_ttl_s <= 0:
            raise ConfigError("state_ttl_s", self.state_ttl_s, "a duration > 0 or None")
        if self.late not in LATE_POLICIES:
            raise ConfigError("late", self.late, f"one of {', '.join(LATE_POLICIES)}")
        if isinstance(self.fn, KeyedProcessFunction):
            if self.state_ttl_s is not None:
                raise ConfigError(
                    "state_ttl_s", self.state_ttl_s, "None: give each state a StateTtl instead"
                )
            names = [d.name for d in self.fn.states]
            if len(set(names)) != len(names):
                raise ConfigError("states", names, "descriptors with distinct names")
        elif not callable(self.fn):
            raise ConfigError(
                "fn", self.fn, "a function (key, rows, state) or a KeyedProcessFunction"
            )

    @property
    def process_function(self) -> KeyedProcessFunction | None:
        """The operator's ``KeyedProcessFunction`` (None for a plain ``fn``)."""
        return self.fn if isinstance(self.fn, KeyedProcessFunction) else None


def KeyedProcess(
    uid: str,
    key: str,
    function: KeyedProcessFunction,
    output_schema: str,
    **options: Any,
) -> KeyedOperator:
    """A keyed process function as an operator (Flink's ``KeyedProcessFunction``).

    ``function`` declares its named states (``value_state``, ``list_state``, ``map_state``,
    ``reducing_state``, ``aggregating_state``, each with an optional ``StateTtl``) and
    implements ``process(key, rows, ctx)``, optionally ``on_timer(key, timestamp, ctx)`` and
    ``on_late(key, rows, ctx)``; ``options`` are ``KeyedOperator``'s (``late``,
    ``state_backend``). See docs/engine.md.
    """
    if not isinstance(function, KeyedProcessFunction):
        raise ConfigError("function", function, "an instance of a KeyedProcessFunction subclass")
    return KeyedOperator(uid, key, function, output_schema, **options)


# fn(key, left rows, right rows, state) -> (outputs, new state), as KeyedFunction.
CoKeyedFunction = Callable[
    [Any, list[dict[str, Any]], list[dict[str, Any]], Any], tuple[list[dict[str, Any]], Any]
]


@dataclass(frozen=True)
class _CoFunction:
    """A two-input function as a keyed function: the rows are split by their ``input``."""

    fn: CoKeyedFunction
    left: str
    right: str

    def __call__(
        self, key: Any, rows: list[dict[str, Any]], state: Any
    ) -> tuple[list[dict[str, Any]], Any]:
        left = [r for r in rows if r.get("input") == self.left]
        right = [r for r in rows if r.get("input") == self.right]
        return self.fn(key, left, right, state)


def co_keyed(
    uid: str,
    key: str,
    fn: CoKeyedFunction,
    output_schema: str,
    left: str,
    right: str,
    **options: Any,
) -> KeyedOperator:
    """A two-input keyed operator (Flink's ``KeyedCoProcessFunction``) after a
    ``UnionSource``: ``fn(key, left_rows, right_rows, state)``, where the left rows came from
    input ``left`` and the right rows from input ``right`` (their uids), each in source order.
    One state per key, shared by both sides, e.g. a join of bids with auctions."""
    if left == right:
        raise ConfigError("right", right, "an input other than the left one")
    return KeyedOperator(uid, key, _CoFunction(fn, left, right), output_schema, **options)


def _running_sum_fn(value: str | None) -> KeyedFunction:
    def fn(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict[str, Any]], Any]:
        total = (state or 0) + sum((1 if value is None else row[value]) for row in rows)
        return [{"key": key if isinstance(key, str) else json.dumps(key), "total": total}], total

    return fn


def _running_extreme_fn(pick: Callable[..., Any], value: str, output: str) -> KeyedFunction:
    def fn(key: Any, rows: list[dict[str, Any]], state: Any) -> tuple[list[dict[str, Any]], Any]:
        seen = [row[value] for row in rows if row[value] is not None]
        best = pick([*seen, *([] if state is None else [state])])
        return [{"key": key if isinstance(key, str) else json.dumps(key), output: best}], best

    return fn


def running_sum(uid: str, key: str, value: str | None = None, **options: Any) -> KeyedOperator:
    """Running sum of ``value`` per key (a count when ``value`` is None).

    Outputs ``key string, total long`` (a key that is not a string is output as its JSON).
    Computed by Spark SQL and merged with the state per key (see ``Aggregate``).
    """
    aggregate = Aggregate("count" if value is None else "sum", value, "total")
    return KeyedOperator(
        uid,
        key,
        _running_sum_fn(value),
        "key string, total long",
        aggregate=aggregate,
        **options,
    )


def _running_extreme(
    kind: str, uid: str, key: str, value: str, value_type: str, options: dict[str, Any]
) -> KeyedOperator:
    return KeyedOperator(
        uid,
        key,
        _running_extreme_fn(min if kind == "min" else max, value, kind),
        f"key string, {kind} {value_type}",
        aggregate=Aggregate(kind, value, kind),
        **options,
    )


def running_min(
    uid: str, key: str, value: str, value_type: str = "long", **options: Any
) -> KeyedOperator:
    """The smallest ``value`` seen per key; outputs ``key string, min <value_type>``."""
    return _running_extreme("min", uid, key, value, value_type, options)


def running_max(
    uid: str, key: str, value: str, value_type: str = "long", **options: Any
) -> KeyedOperator:
    """The largest ``value`` seen per key; outputs ``key string, max <value_type>``."""
    return _running_extreme("max", uid, key, value, value_type, options)


@dataclass
class Pipeline:
    """A named pipeline: a source and its stages."""

    name: str
    source: Source
    stages: list[Callable[[Any], Any] | KeyedOperator | Sink] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            OperatorUid(self.name)
        except ValueError as exc:
            raise ConfigError("pipeline", self.name, str(exc)) from exc
        stages, self.stages = list(self.stages), []
        for stage in stages:
            self.then(stage)

    def _check(self, stage: Callable[[Any], Any] | KeyedOperator | Sink) -> None:
        if isinstance(stage, PartitionOperator):  # operator state (engine/operator_state.py)
            inputs = self.source.inputs if isinstance(self.source, UnionSource) else None
            stage.check_source(None if inputs is None else [i.uid for i in inputs])
        elif not isinstance(stage, KeyedOperator | Sink) and not callable(stage):
            raise ConfigError(
                "stage", stage, "a function DataFrame -> DataFrame, a KeyedOperator or a Sink"
            )

    def then(self, stage: Callable[[Any], Any] | KeyedOperator | Sink) -> Pipeline:
        """Append a stage; refuses a stateful operator or sink whose uid is already used.

        A sink passes its input on unchanged, so more stages (or sinks) may follow it.
        """
        self._check(stage)
        if isinstance(stage, KeyedOperator | Sink | PartitionOperator) and stage.uid in self.uids:
            raise ConfigError("uid", stage.uid, "unique within the pipeline; it is used twice")
        self.stages.append(stage)
        return self

    @property
    def operators(self) -> list[KeyedOperator]:
        return [s for s in self.stages if isinstance(s, KeyedOperator)]

    @property
    def partition_operators(self) -> list[PartitionOperator]:
        return [s for s in self.stages if isinstance(s, PartitionOperator)]

    @property
    def sinks(self) -> list[Sink]:
        return [s for s in self.stages if isinstance(s, Sink)]

    @property
    def uids(self) -> list[str]:
        return [self.source.uid, *self.parallel_uids]

    @property
    def parallel_uids(self) -> list[str]:
        """The uids of the operators that run (and ack) once per subtask: keyed operators,
        operators with operator state, sinks."""
        keyed = [op.uid for op in self.operators]
        partition = [op.uid for op in self.partition_operators]
        return [*keyed, *partition, *(s.uid for s in self.sinks)]

    def use_storage(self, s3_options: dict[str, Any]) -> Pipeline:
        """Give every sink without S3 settings of its own the run's (``Sink.use_storage``);
        file sources get them from the run already. Idempotent; returns the pipeline."""
        for sink in self.sinks:
            sink.use_storage(s3_options)
        return self
