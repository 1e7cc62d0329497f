"""Event-driven epochs: what the pipeline DAG's Kafka ``AssetWatcher`` does with a record.

With ``PipelineSpec(watch_conn_id=...)`` the pipeline DAG is scheduled on an Asset whose
watcher is common.messaging's ``MessageQueueTrigger`` (scheme ``kafka``: the Kafka
provider's ``AwaitMessageTrigger``) on the source topics, running in the triggerer. It
consumes the topics with the watch connection's consumer group and hands each record to
``record_arrived``:

- a record that a completed checkpoint already holds (``protocol.arrivals``) is skipped:
  the trigger commits it and reads on, at once;
- any other record ends the trigger with an event (its topic, partition and offset): Airflow
  records an asset event and queues a run of the pipeline DAG; the triggerer starts the
  watcher again.

So an idle topic costs no run, and a burst costs about two: the first record wakes a run,
whose barrier takes every record there is; a record the watcher reads while that run is in
flight queues one more (Airflow folds the events queued meanwhile into one run, at most
``max_active_runs`` at a time), and the records after it are held by a completed checkpoint
by then. Min pause and max concurrent are the run's own gates, as for scheduled runs. The
event is only a wake-up: an epoch reads up to the end offsets when it starts, never the
events' offsets.

What the pipeline has processed is read from checkpoint storage; a record below the ends
read within the last ``FRESH_S`` seconds is skipped without reading again (a burst of
already processed records is skipped at the consumer's speed).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.arrivals import processed_offsets
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.view import scan

__all__ = ["FRESH_S", "record_arrived"]

FRESH_S = 2.0
# (storage, pipeline) -> (monotonic time read, processed offsets)
_READ: dict[tuple[str, str], tuple[float, dict[TopicPartition, int]]] = {}
_LOCK = threading.Lock()


def _processed(storage: str, pipeline: str, storage_conn_id: str) -> dict[TopicPartition, int]:
    from microcheckpoint_airflow.hooks import CheckpointStorageHook

    store = CheckpointStorageHook(storage_conn_id).get_store(storage)
    return processed_offsets(scan(store, Layout(pipeline)))


def record_arrived(
    message: Any, *, storage: str, pipeline: str, storage_conn_id: str
) -> dict[str, Any] | None:
    """The watcher's ``apply_function``: the record's position when no completed checkpoint
    of ``pipeline`` holds it (an event: wake the pipeline), else None (skip it)."""
    tp = TopicPartition(message.topic(), message.partition())
    offset = message.offset()
    key = (storage, pipeline)
    with _LOCK:
        read = _READ.get(key)
    if read is not None and time.monotonic() - read[0] < FRESH_S and offset < read[1].get(tp, 0):
        return None
    done = _processed(storage, pipeline, storage_conn_id)
    with _LOCK:
        _READ[key] = (time.monotonic(), done)
    if offset < done.get(tp, 0):
        return None
    return {"pipeline": pipeline, "topic": tp.topic, "partition": tp.partition, "offset": offset}
