"""The watermark in the runner: restore it, measure an epoch's event times, store it.

The pure rules are in ``engine.watermarks``; this module reads the source's restored
watermark file, asks Spark for the highest event time of each partition in the epoch's rows
(one aggregation over the persisted source frame), and writes the new state as the source's
state file (memory format, key group 0, key ``WATERMARKS_KEY``), which the source's ack
references, so the checkpoint holds it and a restore starts from it exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from microcheckpoint.engine.watermarks import WATERMARKS_KEY, WatermarkState
from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.backends import decode_memory, encode_memory
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.port import ObjectStore

__all__ = ["epoch_maxima", "restored_watermarks", "store_watermarks"]

_NAME = "state.json"


def restored_watermarks(store: ObjectStore, handles: Iterable[StateHandle]) -> WatermarkState:
    """The watermark state of the source's restored files (empty when it has none)."""
    for handle in handles:
        if not handle.key.endswith("/" + _NAME):
            continue
        obj = store.get(handle.key)
        if obj is None:
            continue
        url = store.child_url(handle.key)
        groups = decode_memory(handle.check(obj.data, url), url, [0])
        entry = groups.get(0, {}).get(WATERMARKS_KEY)
        if entry is not None:
            return WatermarkState.from_json(entry[0], store.child_url(handle.key))
    return WatermarkState()


def store_watermarks(
    store: ObjectStore,
    pipeline: str,
    checkpoint: CheckpointId,
    attempt: int,
    uid: str,
    state: WatermarkState,
    now_ms: int,
) -> StateHandle:
    """Write ``state`` as the source's state file of this attempt; its handle."""
    data = encode_memory(uid, {0: {WATERMARKS_KEY: (state.to_json(), now_ms)}})
    key = Layout(pipeline).state_prefix(checkpoint, attempt, TaskId.of(uid, 0)) + _NAME
    store.put(key, data)
    return StateHandle.of(key, data, (0,))


def epoch_maxima(df: Any, column: str, file_partitions: Iterable[str]) -> dict[str, int]:
    """The highest event time (ms) of each source partition among ``df``'s rows.

    A Kafka row's partition is ``topic:partition``; a file source's rows (no topic) belong
    to its one partition (``file_partitions``; a hybrid source's files have one).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    kinds = {f.name: f.dataType for f in df.schema.fields}
    if column not in kinds:
        from microcheckpoint.errors import ConfigError

        raise ConfigError(
            "event_time column", column, f"a column of the source's rows: {', '.join(kinds)}"
        )
    ms = F.col(column)
    if isinstance(kinds[column], TimestampType):
        ms = F.unix_millis(ms)
    files = list(file_partitions)
    if "topic" in kinds and "partition" in kinds:
        part = F.concat(F.col("topic"), F.lit(":"), F.col("partition").cast("string"))
        if files:
            part = F.coalesce(part, F.lit(files[0]))
    else:
        part = F.lit(files[0] if files else "")
    rows = df.groupBy(part.alias("p")).agg(F.max(ms).alias("m")).collect()
    return {r["p"]: int(r["m"]) for r in rows if r["m"] is not None}
