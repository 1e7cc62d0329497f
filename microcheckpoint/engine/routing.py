"""Routing rows to keyed subtasks: key → key group → subtask, as Arrow columns.

Runs in the executors (``mapInArrow``), with no Spark import. A key's group is a stable hash
of its canonical JSON (``state.keygroups``); it is computed once per distinct key of a batch
(Arrow's dictionary encoding finds them), so the Python work grows with the keys, not the
records. A subtask owns a contiguous range of key groups, so a restore with another
parallelism reassigns whole key groups.

Every subtask must run (and ack) once per epoch even when no row reaches it, so the runner
adds one *marker* row per subtask, whose key group is null; ``data_rows`` drops them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.keygroups import key_group_for, subtask_for_key_group

__all__ = ["KG", "SUBTASK", "data_rows", "key_groups", "route"]

KG = "__kg"
SUBTASK = "__subtask"


def key_groups(keys: pa.Array | pa.ChunkedArray, max_parallelism: int) -> pa.Array:
    """The key group of every value of ``keys`` (int32), hashing each distinct value once."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    try:
        encoded = pc.dictionary_encode(keys, null_encoding="encode")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        encoded = None  # nested keys (structs, lists): one hash per row
    if encoded is None:
        values = keys.to_pylist()
        return pa.array(
            [key_group_for(canonical_key(v).encode(), max_parallelism) for v in values], pa.int32()
        )
    groups = pa.array(
        [
            key_group_for(canonical_key(v).encode(), max_parallelism)
            for v in encoded.dictionary.to_pylist()
        ],
        pa.int32(),
    )
    return pc.take(groups, encoded.indices)


def route(
    batches: Iterator[pa.RecordBatch], key: str, max_parallelism: int, parallelism: int
) -> Iterator[pa.RecordBatch]:
    """Add ``__kg`` and ``__subtask`` to every batch (a ``mapInArrow`` function)."""
    owner = pa.array(
        [subtask_for_key_group(max_parallelism, parallelism, kg) for kg in range(max_parallelism)],
        pa.int32(),
    )
    for batch in batches:
        kgs = key_groups(batch.column(key), max_parallelism)
        subtasks = pc.take(owner, kgs)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, kgs, subtasks], names=[*batch.schema.names, KG, SUBTASK]
        )


def data_rows(table: pa.Table) -> pa.Table:
    """``table`` without the marker rows."""
    return table.filter(pc.is_valid(table.column(KG)))
