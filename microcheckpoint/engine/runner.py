"""The process step of an epoch in Spark: read the barrier ranges, run the stages, ack.

``run_epoch`` runs one ``EpochPlan`` with DataFrame and Arrow APIs only (no RDD), so the same
code runs in-process, under ``spark-submit`` and as a Spark Connect client:

1. the source: ``spark.range(n_splits).mapInArrow(KafkaSplitReader)`` — each split of the
   barrier is read in an executor and becomes Arrow record batches;
2. the stages, in order:
   - plain DataFrame functions as they are;
   - a keyed operator: rows get their key group and subtask by its key group scheme
     (Spark SQL's hash, or ``routing.route`` once per distinct key); under Spark's hash a
     ``repartition(parallelism, key)`` makes each partition one subtask, run by
     ``keyed.process_partition``; otherwise one marker row per subtask makes every subtask
     run, and ``placement.per_subtask`` (an ``applyInArrow`` per subtask, the subtasks
     spread over the tasks) runs ``keyed.process_subtask`` — restore, ``fn`` per key,
     snapshot, ack from the executor; it runs in a job of its own (persisted), or, when a
     sink comes next, in the sink's job;
   - a built-in aggregation: Spark SQL aggregates per key first, so only one row per touched
     key reaches ``keyed.merge_aggregate``; with Spark-hash key groups and as many shuffle
     partitions as subtasks, in the partitions of the aggregation's own shuffle
     (``keyed.merge_partition``), with no shuffle of its own, and a sink right after it
     stages each partition where it is;
   - a sink: rows get a part by a hash of their columns, and each part is staged (or, at
     least once, published) and acked by ``sinkstage.stage_part``;
3. the source's ack (the barrier's ends) from the driver.

An epoch with no records and nothing to rewrite runs no Spark job at all: every task acks
its unchanged state from the driver.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.api import (
    FileSource,
    KafkaSource,
    KeyedOperator,
    Pipeline,
    StageSource,
    UnionSource,
    source_event_time,
)
from microcheckpoint.engine.declining import declining
from microcheckpoint.engine.epoch_time import epoch_watermarks, operator_event_options
from microcheckpoint.engine.event_time import store_watermarks
from microcheckpoint.engine.filescan import file_frame
from microcheckpoint.engine.keyed import (
    AGGREGATE,
    OperatorContext,
    merge_aggregate,
    merge_partition,
    process_partition,
    process_subtask,
)
from microcheckpoint.engine.operator_stage import partition_stage
from microcheckpoint.engine.operator_state import PartitionOperator
from microcheckpoint.engine.operator_subtask import idle_acks as partition_idle_acks
from microcheckpoint.engine.placement import per_partition, per_subtask
from microcheckpoint.engine.routing import KG, SUBTASK, route
from microcheckpoint.engine.sinkstage import SinkContext, stage_partition, stage_table
from microcheckpoint.engine.sources import (
    KafkaSplitReader,
    kafka_schema,
)
from microcheckpoint.engine.spark import arrow_schema, one_row_per_partition, spark_schema
from microcheckpoint.faults import Faults
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.ack_timing import AckTimer
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.declines import DRIVER
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.plan import EpochPlan
from microcheckpoint.protocol.records import CheckpointMetadata
from microcheckpoint.sinks.base import Sink
from microcheckpoint.state.chains import key_group_chains
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.keygroups import BLAKE2B, SCHEME_FIELD, SPARK_HASH, owned_key_groups
from microcheckpoint.storage.port import ObjectStore, each, started

__all__ = ["EpochResult", "expected_tasks", "run_epoch", "source_schema"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochResult:
    checkpoint_id: CheckpointId
    attempt: int
    records: int
    outputs: list[dict[str, Any]] | None
    metadata: CheckpointMetadata | None = None


def expected_tasks(pipeline: Pipeline, parallelism: int) -> list[TaskId]:
    """The acks a checkpoint of ``pipeline`` needs: the source, and every keyed subtask."""
    tasks = [TaskId.of(pipeline.source.uid, 0)]
    for uid in pipeline.parallel_uids:
        tasks.extend(TaskId.of(uid, i) for i in range(parallelism))
    return tasks


def source_schema(source: KafkaSource) -> str:
    """Spark DDL of a Kafka source's rows."""
    return kafka_schema(source.value_format, source.schema)[1]


def _markers(spark: Any, parallelism: int) -> Any:
    """One row per subtask, whose key group is null: every subtask runs, even with no rows."""
    from pyspark.sql import functions as F

    return spark.range(parallelism).select(
        F.lit(None).cast("int").alias(KG), F.col("id").cast("int").alias(SUBTASK)
    )


def read_columns(pipeline: Pipeline) -> tuple[str, ...] | None:
    """The columns of a Kafka source's rows the pipeline reads, when it reads fewer than
    all: a built-in aggregation as the first stage reads its key and value columns only
    (Spark cannot prune columns through the reader's ``mapInArrow``). None: all of them."""
    source = pipeline.source
    first = pipeline.stages[0] if pipeline.stages else None
    if (
        not isinstance(source, KafkaSource)
        or source_event_time(source) is not None
        or not isinstance(first, KeyedOperator)
        or first.aggregate is None
    ):
        return None
    names = kafka_schema(source.value_format, source.schema)[0].names
    wanted = {first.key, *([first.aggregate.value] if first.aggregate.value else [])}
    return tuple(n for n in names if n in wanted) if wanted <= set(names) else None


def _kafka_frame(
    spark: Any,
    source: KafkaSource,
    plan: EpochPlan,
    bootstrap: str,
    faults: Faults,
    checks: RangeChecks,
    columns: tuple[str, ...] | None = None,
) -> Any | None:
    from pyspark.sql.pandas.types import from_arrow_schema

    from microcheckpoint.adapters.kafka_reader import check_splits, split_ranges
    from microcheckpoint.protocol.barrier import Barrier

    # the rows' schema made here: a DDL string would be parsed by Spark (over Connect, a
    # request to the server) in every epoch
    schema = from_arrow_schema(kafka_schema(source.value_format, source.schema, columns)[0])
    kafka = Barrier(
        {
            tp: r
            for tp, r in plan.barrier.ranges.items()
            if tp not in plan.files and tp.topic in source.topics
        }
    )
    splits = split_ranges(kafka, source.max_records_per_split)
    if not splits:
        return spark.createDataFrame([], schema)
    # Every range against its partition (retention, a re-created topic), once for the epoch,
    # while the stages are planned: the job's first action waits for it (``RangeChecks``).
    checks.start(functools.partial(check_splits, bootstrap, splits, timeout_s=source.timeout_s))
    reader = KafkaSplitReader(
        bootstrap, tuple(splits), source.value_format, source.schema, faults,
        drop_markers=isinstance(source, StageSource), timeout_s=source.timeout_s,
        columns=columns,
    )  # fmt: skip
    return one_row_per_partition(spark, len(splits)).mapInArrow(reader, schema)


class RangeChecks:
    """The Kafka ranges' checks (``check_splits``) of one epoch, run while its stages are
    planned (the keyed stages' functions pickled, their schemas analysed: on Spark Connect,
    requests to the server). ``passed`` comes before every Spark action and the source's
    ack waits for ``ok``: no record is read and nothing acks before every range passed, and
    a failed check fails the epoch as it did when it ran first."""

    def __init__(self) -> None:
        self._begun: list[Future[None]] = []

    def start(self, check: Callable[[], None]) -> None:
        self._begun.append(started(check))

    def passed(self) -> None:
        """Wait for every check begun; raise the first one's error."""
        wait(self._begun)
        for check in self._begun:
            check.result()

    def ok(self) -> bool:
        """Wait for every check begun; whether all of them passed."""
        wait(self._begun)
        return all(check.exception() is None for check in self._begun)


def _file_names(source: FileSource, plan: EpochPlan) -> list[str]:
    return [n for tp, ns in plan.files.items() if tp.topic in source.topics for n in ns]


def _source(
    spark: Any,
    pipeline: Pipeline,
    plan: EpochPlan,
    bootstrap: str,
    faults: Faults,
    options: dict,
    checks: RangeChecks,
) -> Any:
    source = pipeline.source
    if isinstance(source, KafkaSource):
        return _kafka_frame(spark, source, plan, bootstrap, faults, checks, read_columns(pipeline))
    if isinstance(source, FileSource):
        return file_frame(spark, source, _file_names(source, plan), options, faults)
    if isinstance(source, UnionSource):
        from pyspark.sql import functions as F

        frames = [
            _kafka_frame(spark, i, plan, bootstrap, faults, checks).withColumn(
                "input", F.lit(i.uid)
            )
            for i in source.inputs
        ]
        return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    files = file_frame(spark, source.files, _file_names(source.files, plan), options, faults)
    kafka = _kafka_frame(spark, source.kafka, plan, bootstrap, faults, checks)
    return files.unionByName(kafka, allowMissingColumns=True)


def _collated(kind: Any) -> bool:
    """Whether ``kind`` is a string type of another collation than the binary one."""
    from pyspark.sql.types import StringType

    return (
        isinstance(kind, StringType) and getattr(kind, "collation", "UTF8_BINARY") != "UTF8_BINARY"
    )


def _spark_hash_fits(kind: Any) -> bool:
    """Whether a function's key of Spark type ``kind`` takes Spark's hash: a string of the
    binary collation, an integer, a float or a boolean. Their hash does not depend on the
    width (``_normalized_key`` widens them) and ``repartition`` hashes them as ``hash``
    does; a collated string's partitioning hash follows its collation, and a nested key's
    hash depends on the widths inside it."""
    from pyspark.sql.types import BooleanType, DoubleType, FloatType, IntegralType, StringType

    if isinstance(kind, StringType):
        return not _collated(kind)
    return isinstance(kind, (IntegralType, FloatType, DoubleType, BooleanType))


def _key_type(df: Any, key: str) -> Any | None:
    """The Spark type of ``df``'s column ``key`` (None: no such column)."""
    return next((f.dataType for f in df.schema.fields if f.name == key), None)


def key_group_scheme(plan: EpochPlan, op: KeyedOperator, key_type: Any | None = None) -> str:
    """Operator ``op``'s key group scheme (``state.keygroups``): its stored state's, else
    (no state yet) the Spark hash, unless ``key_type``, the type of a function's key, is
    not one that ``_spark_hash_fits`` (then blake2b)."""
    stored = plan.key_groups.get(op.uid)
    if stored:
        return stored
    if op.aggregate is None and key_type is not None and not _spark_hash_fits(key_type):
        return BLAKE2B
    return SPARK_HASH


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def _spark_places(spark: Any, ctx: OperatorContext, shuffle: bool) -> bool:
    """Whether a shuffle by the key puts every key in its subtask's partition under
    ``SPARK_HASH``: ``parallelism`` dividing ``max_parallelism``, adaptive execution off
    and, for the aggregation's own shuffle (``shuffle``), ``parallelism`` shuffle
    partitions (a ``repartition(parallelism, key)`` names its own)."""
    if ctx.key_groups != SPARK_HASH or ctx.max_parallelism % ctx.parallelism:
        return False
    # The session's settings in one request over Connect (a ``get`` each was two); a setting
    # the session has not set has Spark's default.
    settings = spark.conf.getAll
    if shuffle and int(settings.get(SHUFFLE_PARTITIONS, "200")) != ctx.parallelism:
        return False
    # Adaptive execution may coalesce the partitions, or plan an empty shuffle as none:
    # then some subtask would not run, nor ack.
    return settings.get("spark.sql.adaptive.enabled", "true").lower() != "true"


def _normalized_key(df: Any, key: str) -> tuple[Any, Any]:
    """``df`` with an integer key as a bigint and a float key as a double: Spark's hash of 5
    as an int is not its hash as a long, and a key's group must not depend on its width.
    A collated string key is compared byte by byte, as state keys are: its shuffle would
    otherwise partition by the collation, which ``hash`` does not. Also the schema of the
    frame returned (``df``'s, asked for once, with the key's new type)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ByteType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructField,
        StructType,
    )

    schema = df.schema
    kind = schema[key].dataType
    column = F.col(f"`{key}`")
    if _collated(kind):
        df, kind = df.withColumn(key, F.collate(column, "UTF8_BINARY")), StringType()
    elif isinstance(kind, (ByteType, ShortType, IntegerType)):
        df, kind = df.withColumn(key, column.cast("bigint")), LongType()
    elif isinstance(kind, FloatType):
        df, kind = df.withColumn(key, column.cast("double")), DoubleType()
    fields = [StructField(f.name, kind) if f.name == key else f for f in schema.fields]
    return df, StructType(fields)


def _aggregate_type(agg: Any, schema: Any) -> Any | None:
    """The Spark type of built-in aggregation ``agg``'s result over rows of ``schema``, where
    it is certain (a count; a sum of integers or floats; the min or max of any column);
    None otherwise (a decimal's sum, a column not found)."""
    from pyspark.sql.types import DoubleType, FloatType, IntegralType, LongType

    if agg.kind == "count":
        return LongType()
    kind = next((f.dataType for f in schema.fields if f.name == agg.value), None)
    if agg.kind in ("min", "max"):
        return kind
    if isinstance(kind, IntegralType):
        return LongType()
    return DoubleType() if isinstance(kind, (FloatType, DoubleType)) else None


def _with_schema(df: Any, fields: list[Any]) -> Any:
    """``df`` given its schema (``fields``, each made nullable; ``DataFrame.to``): over
    Connect, an Arrow function over it then needs no analysis request for its columns."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    routing = [StructField(KG, IntegerType()), StructField(SUBTASK, IntegerType())]
    return df.to(StructType([StructField(f.name, f.dataType) for f in [*fields, *routing]]))


def _with_key_groups(df: Any, op: KeyedOperator, ctx: OperatorContext) -> Any:
    """``df`` with each row's key group and subtask (``KG``, ``SUBTASK``) by its scheme:
    Spark SQL's hash in the JVM, or blake2b in a Python pass (``routing.route``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StructField, StructType

    if ctx.key_groups == SPARK_HASH:
        group = F.pmod(F.hash(F.col(f"`{op.key}`")), F.lit(ctx.max_parallelism))
        owner = F.pmod(group, F.lit(ctx.parallelism))
        return df.withColumns({KG: group.cast("int"), SUBTASK: owner.cast("int")})
    schema = StructType(
        [*df.schema.fields, StructField(KG, IntegerType()), StructField(SUBTASK, IntegerType())]
    )
    route_rows = functools.partial(
        route, key=op.key, max_parallelism=ctx.max_parallelism, parallelism=ctx.parallelism
    )
    return df.mapInArrow(route_rows, schema)


NO_ROWS = "__no_rows"
# The frame of no rows ``_never_empty`` adds, with the session it was made in.
_NO_ROWS: list[tuple[Any, Any]] = []


def _never_empty(spark: Any, df: Any) -> Any:
    """``df`` as a union with a frame of no rows in one partition (not a local relation):
    Spark neither prunes it as empty nor knows its partitioning, so a shuffle by the key
    after it always runs, into all its partitions, even for input that arrives as an empty
    local relation (an epoch with no split over Connect) or in one partition. That frame is
    made once per session; asking for ``df``'s columns would cost a request over Connect."""
    from pyspark.sql import functions as F

    made = _NO_ROWS[0] if _NO_ROWS else None
    if made is None or made[0] is not spark:
        made = (spark, spark.range(0, 0, 1, 1).select(F.lit(None).cast("int").alias(NO_ROWS)))
        _NO_ROWS[:] = [made]
    return df.unionByName(made[1], allowMissingColumns=True).drop(NO_ROWS)


def _keyed(spark: Any, df: Any, op: KeyedOperator, ctx: OperatorContext) -> tuple[Any, bool]:
    """The DataFrame of keyed operator ``op``'s outputs, each subtask run once, and whether
    its partition ``i`` holds the outputs of subtask ``i`` (and only those).

    A built-in aggregation is computed per key by Spark SQL first. Under ``SPARK_HASH``,
    when ``_spark_places`` it, each partition of the aggregation's shuffle is one subtask
    (``keyed.merge_partition``): one shuffle, as Structured Streaming has; a function's
    rows are repartitioned by the key into ``parallelism`` partitions, each one subtask
    (``keyed.process_partition``). Otherwise the rows go to their subtasks in a shuffle of
    their own (``placement.per_subtask``), one marker row per subtask making every subtask
    run.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField

    schema = None  # known under SPARK_HASH, where the fast paths below are taken
    if ctx.key_groups == SPARK_HASH:
        df, schema = _normalized_key(df, op.key)
    if op.aggregate is not None:
        agg = op.aggregate
        column = F.lit(1) if agg.value is None else F.col(agg.value)
        reduce = {"count": F.count, "sum": F.sum, "min": F.min, "max": F.max}[agg.kind]
        fast = _spark_places(spark, ctx, shuffle=True)
        if fast:
            df = _never_empty(spark, df)
        df = df.groupBy(op.key).agg(reduce(column).alias(AGGREGATE))
        if fast:
            merge_in = functools.partial(merge_partition, ctx)
            output = spark_schema(spark, op.output_schema)
            rows = _with_key_groups(df, op, ctx)
            result = None if schema is None else _aggregate_type(agg, schema)
            if result is not None:
                rows = _with_schema(rows, [schema[op.key], StructField(AGGREGATE, result)])
            return per_partition(rows, merge_in, output), True
    routed = _with_key_groups(df, op, ctx)
    fn = op.fn
    if op.aggregate is None and _spark_places(spark, ctx, shuffle=False):
        # Spark's hash partitioning of the key is pmod(hash(key), parallelism): the subtask.
        kept = _never_empty(spark, routed)
        placed = kept.repartition(ctx.parallelism, F.col(f"`{op.key}`"))
        if schema is not None:
            placed = _with_schema(placed, list(schema.fields))
        process_in = functools.partial(process_partition, ctx, fn)
        return per_partition(placed, process_in, spark_schema(spark, op.output_schema)), True
    grouped = routed.unionByName(_markers(spark, ctx.parallelism), allowMissingColumns=True)

    # Closures without annotations: pyspark 4.3 cannot inspect a functools.partial here.
    def process(subtask, table):  # type: ignore[no-untyped-def]
        return process_subtask(ctx, fn, subtask, table)

    def merge(subtask, table):  # type: ignore[no-untyped-def]
        return merge_aggregate(ctx, subtask, table)

    run = process if op.aggregate is None else merge
    output = spark_schema(spark, op.output_schema)
    return per_subtask(spark, grouped, SUBTASK, ctx.parallelism, run, output), False


def _staged_schema() -> Any:
    """``part int, rows long``: what a sink's staging reports per part."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    return StructType([StructField("part", IntegerType()), StructField("rows", LongType())])


def _sink_stage(
    spark: Any, df: Any, sink: Sink, ctx: SinkContext, parallelism: int, in_place: bool
) -> Any:
    """The DataFrame that pre-commits ``df`` into ``sink`` as ``parallelism`` parts.

    ``in_place``: ``df``'s partition ``i`` is keyed subtask ``i``'s output, so it becomes
    part ``i`` where it is (``sinkstage.stage_partition``). Otherwise each row goes to the
    part of its content's hash, in a shuffle.
    """
    from pyspark.sql import functions as F

    if in_place:

        def stage_in(part, batches):  # type: ignore[no-untyped-def]
            return stage_partition(ctx, sink, part, parallelism, batches)

        return per_partition(df, stage_in, _staged_schema())

    columns = [F.col(f"`{c}`") for c in df.columns]
    row = F.to_json(F.struct(*columns)) if columns else F.lit("")
    part = F.pmod(F.xxhash64(row), F.lit(parallelism)).cast("int")
    parts = df.select(*columns, F.lit(0).alias(KG), part.alias(SUBTASK))
    grouped = parts.unionByName(_markers(spark, parallelism), allowMissingColumns=True)

    def stage(subtask, table):  # type: ignore[no-untyped-def]
        return stage_table(ctx, sink, subtask, table)

    return per_subtask(spark, grouped, SUBTASK, parallelism, stage, _staged_schema())


def _idle_acks(pipeline: Pipeline, plan: EpochPlan, store: ObjectStore, parallelism: int) -> None:
    """Acks of an epoch with no records: every subtask's state is what it was restored to
    (nothing is uploaded: each ack's async part is 0 ms)."""
    layout = Layout(pipeline.name)
    acks = []
    for op in pipeline.operators:
        chains = key_group_chains(plan.restore.get(op.uid, ()))
        scheme = key_group_scheme(plan, op)
        named = {} if scheme == BLAKE2B else {SCHEME_FIELD: scheme}
        for subtask in range(parallelism):
            timer = AckTimer()
            owned = owned_key_groups(plan.max_parallelism, parallelism, subtask, scheme)
            handles: dict[str, StateHandle] = {}
            for kg in owned:
                handles.update({h.key: h for h in chains.get(kg, ())})
            task = TaskId.of(op.uid, subtask)
            acks.append(timer.ack(task, plan.attempt, handles.values(), named))
    partition_idle_acks(pipeline, plan, store, parallelism)  # engine/operator_subtask.py
    for sink in pipeline.sinks:
        acks += [AckTimer().ack(TaskId.of(sink.uid, p), plan.attempt) for p in range(parallelism)]
    # Independent writes: sent at once.
    each(lambda ack: record_ack(store, layout, plan.checkpoint_id, ack), acks)


def _idle(pipeline: Pipeline, plan: EpochPlan) -> bool:
    """Nothing to read and nothing to rewrite: the epoch needs no Spark job (a process
    function always runs: a timer may be due)."""
    return (
        plan.barrier.record_count == 0
        and not plan.full_snapshot
        and all(
            op.state_backend == "table" and op.process_function is None for op in pipeline.operators
        )
    )


def _source_ack(pipeline: Pipeline, plan: EpochPlan, store: ObjectStore, marks: Any | None) -> None:
    """The source's ack of ``plan``'s attempt: the barrier's ends, and the epoch's
    watermarks when its source has event time."""
    timer = AckTimer()
    offsets = {str(tp): end for tp, end in plan.barrier.ends.items()}
    handles = []
    if marks is not None:
        handles.append(
            store_watermarks(
                store,
                pipeline.name,
                plan.checkpoint_id,
                plan.attempt,
                pipeline.source.uid,
                marks[1],
                plan.trigger_time_ms,
            )
        )
    source_ack = timer.ack(TaskId.of(pipeline.source.uid, 0), plan.attempt, handles, offsets)
    record_ack(store, Layout(pipeline.name), plan.checkpoint_id, source_ack)


def run_epoch(
    spark: Any,
    pipeline: Pipeline,
    plan: EpochPlan,
    store: ObjectStore,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None = None,
    collect: bool = False,
    faults: Faults | None = None,
) -> EpochResult:
    """Process one attempt of a checkpoint, as ``plan`` says, in one Spark job; every task acks.

    Steps: 1. the source (or, for an idle epoch, the acks of unchanged state, and done);
    2. the source's ack, sent now (the rest does not wait for it); 3. the stages; 4. the
    actions: each sink's parts, then the outputs. When any of them raises, the attempt is
    declined (``engine.declining``): by the subtask that failed, which wrote its decline
    first, else by the driver.
    """
    cid, attempt = plan.checkpoint_id.value, plan.attempt
    with declining(lambda: store, pipeline.name, cid, attempt, DRIVER):
        return _run_epoch(
            spark,
            pipeline,
            plan,
            store,
            bootstrap=bootstrap,
            store_options=store_options,
            collect=collect,
            faults=faults,
        )


def _run_epoch(
    spark: Any,
    pipeline: Pipeline,
    plan: EpochPlan,
    store: ObjectStore,
    *,
    bootstrap: str,
    store_options: dict[str, Any] | None,
    collect: bool,
    faults: Faults | None,
) -> EpochResult:
    faults = faults or Faults.from_env()
    options = dict(store_options or {})
    checks = RangeChecks()
    pipeline.use_storage(options)  # one endpoint setting for every S3 client of the run
    parallelism = plan.parallelism(*pipeline.parallel_uids)
    # Step 1: the source.
    if _idle(pipeline, plan):
        _idle_acks(pipeline, plan, store, parallelism)
        df = None
    else:
        if plan.mode is CheckpointingMode.AT_LEAST_ONCE:
            for sink in pipeline.sinks:
                sink.open()  # the executors publish as they go
        df = _source(spark, pipeline, plan, bootstrap, faults, options, checks)
    staged = []
    cached = []
    if source_event_time(pipeline.source) is not None and df is not None:
        checks.passed()  # the event times are read now
        df = df.persist()  # read once: for the event times, then for the stages
        cached.append(df)
    marks = epoch_watermarks(pipeline, plan, store, df, bootstrap)
    # Step 2, sent now and waited for after step 4: the source's ack. Its operator state is
    # the barrier's ends (its sync part: taking them), fixed before any record is read, as
    # a Flink source snapshots its offsets when it emits the barrier. Completion waits for
    # every task's ack, so an ack before the job's end completes nothing by itself.
    ack = functools.partial(_source_ack, pipeline, plan, store, marks)
    source_ack = started(lambda: ack() if checks.ok() else None)  # no ack for a failed range
    try:
        # Step 3: the stages. ``in_place``: partition i of ``df`` is keyed subtask i's output.
        stages = pipeline.stages if df is not None else []
        in_place = False
        for i, stage in enumerate(stages):
            last = i == len(stages) - 1
            if isinstance(stage, Sink):
                if collect or not last:
                    df = df.persist()  # read again: by the next stages or for the outputs
                    cached.append(df)
                ctx = SinkContext(
                    store.url,
                    options,
                    pipeline.name,
                    plan.checkpoint_id.value,
                    plan.attempt,
                    plan.mode.value,
                )
                staged.append(_sink_stage(spark, df, stage, ctx, parallelism, in_place))
            elif isinstance(stage, KeyedOperator):
                stored = stage.aggregate is not None or stage.uid in plan.key_groups
                key_type = None if stored else _key_type(df, stage.key)
                op_ctx = OperatorContext(
                    store_url=store.url,
                    store_options=options,
                    pipeline=pipeline.name,
                    checkpoint_id=plan.checkpoint_id.value,
                    attempt=plan.attempt,
                    uid=stage.uid,
                    key=stage.key,
                    max_parallelism=plan.max_parallelism,
                    parallelism=parallelism,
                    backend=stage.state_backend,
                    trigger_time_ms=plan.trigger_time_ms,
                    output_schema=arrow_schema(spark, stage.output_schema),
                    ttl_ms=None if stage.state_ttl_s is None else int(stage.state_ttl_s * 1000),
                    full_snapshot=plan.full_snapshot,
                    restore=tuple(plan.restore.get(stage.uid, ())),
                    faults=faults,
                    aggregate=None if stage.aggregate is None else stage.aggregate.kind,
                    output_column="total" if stage.aggregate is None else stage.aggregate.output,
                    key_groups=key_group_scheme(plan, stage, key_type),
                    **operator_event_options(pipeline, stage, marks, df),
                )
                df, in_place = _keyed(spark, df, stage, op_ctx)
                if not last and not isinstance(stages[i + 1], Sink):
                    # Run it once now: its state and acks must not depend on what later
                    # stages let Spark prune or compute twice. A sink next reads every row
                    # of every subtask in its own job (persisted when read again), so that
                    # job runs this stage once: one Spark job, not two.
                    checks.passed()
                    df = df.persist()
                    df.count()
                    cached.append(df)
            elif isinstance(stage, PartitionOperator):  # operator state: engine/operator_stage.py
                checks.passed()
                df = partition_stage(
                    spark, df, stage, plan, store, options, parallelism, faults, persist=not last
                )
                cached.append(df)
                in_place = False
            else:
                checks.passed()  # a plain function may run an action of its own
                df = stage(df)
                in_place = False
        # Step 4: the actions.
        checks.passed()
        outputs: list[dict[str, Any]] | None = [] if collect else None
        if df is not None:
            for parts in staged:
                parts.toArrow()  # ``collect`` would ask for a setting first over Connect
            if collect:
                outputs = [r.asDict(recursive=True) for r in df.collect()]
            elif not (pipeline.stages and isinstance(pipeline.stages[-1], Sink)):
                df.count()
            for frame in cached:
                frame.unpersist()
        faults.slow(pipeline.name)
    finally:
        wait([source_ack])  # its error, if any, after the job's
    source_ack.result()
    return EpochResult(plan.checkpoint_id, plan.attempt, plan.barrier.record_count, outputs)
