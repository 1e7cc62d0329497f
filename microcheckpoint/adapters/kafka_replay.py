"""Replayability against a real Kafka: reads what ``protocol.replay`` decides on.

``replay_warnings`` is what the retention task and the Checkpoints page call: every
retained checkpoint and savepoint of a pipeline, checked against Kafka's log starts and
retention. ``assess`` checks given points with an open ``KafkaOffsets`` (``verify`` uses
it for the one point it verifies).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.protocol.replay import (
    DEFAULT_HORIZON_MS,
    ReplayPoint,
    ReplayWarning,
    endangered,
    kafka_positions,
    retained_points,
)
from microcheckpoint.storage.port import ObjectStore

__all__ = ["assess", "replay_warnings"]


def assess(
    kafka: KafkaOffsets,
    points: Sequence[ReplayPoint],
    now_ms: int | None = None,
    horizon_ms: int = DEFAULT_HORIZON_MS,
) -> list[ReplayWarning]:
    """The replay warnings of ``points`` (see ``protocol.replay.endangered``).

    Steps: 1. the Kafka partitions and offsets the points would replay from; 2. each
    partition's log start; 3. the timestamp of the record at each offset still in the log;
    4. each topic's ``retention.ms`` (a broker that cannot describe configs counts as one
    that reports none: Kafka's default is assumed and the messages say so); 5. decide.

    Raises:
        KafkaSourceError: Kafka did not answer, or a partition does not exist.
    """
    # Step 1: what a restore would read from.
    positions = kafka_positions(points)
    if not positions:
        return []
    tps = sorted({tp for tp, _ in positions}, key=lambda tp: (tp.topic, tp.partition))
    # Step 2: the log starts.
    starts = kafka.beginning_offsets(tps)
    # Step 3: the records that retention would delete next.
    times = kafka.record_timestamps((tp, o) for tp, o in positions if o >= starts[tp])
    # Step 4: retention.ms per topic.
    try:
        retention = kafka.retention_ms({tp.topic for tp in tps})
    except KafkaSourceError:
        retention = {}
    # Step 5: the pure decision.
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return endangered(points, starts, times, retention, now, horizon_ms)


def replay_warnings(
    store: ObjectStore,
    pipeline: str,
    bootstrap: str,
    now_ms: int | None = None,
    horizon_ms: int = DEFAULT_HORIZON_MS,
    request_timeout_ms: int = 10_000,
    kafka: KafkaOffsets | None = None,
) -> list[dict[str, Any]]:
    """Warnings for every retained checkpoint and savepoint of ``pipeline`` whose offsets
    Kafka deleted (``severity`` ``lost``) or deletes within ``horizon_ms`` (``soon``).
    ``kafka``: a client already open, to ask instead of connecting to ``bootstrap`` (its
    owner closes it; ``request_timeout_ms`` is then its own).

    Each warning is a JSON-able dict (``ReplayWarning.to_dict``): ``point`` (checkpoint id
    or savepoint URL), ``kind``, ``partition`` (``topic:p``), ``offset``, ``log_start``,
    ``record_time_ms``, ``retention_ms``, ``retention_assumed``, ``deleted_at_ms``
    (estimated; None when lost), ``severity`` and ``message``. A pipeline whose points have
    no Kafka partitions gives ``[]`` without connecting.

    Raises:
        KafkaSourceError: Kafka at ``bootstrap`` did not answer within
            ``request_timeout_ms``, or a partition of a point no longer exists; the message
            names the bootstrap servers.
    """
    points = retained_points(store, pipeline)
    if not kafka_positions(points):
        return []
    if kafka is not None:
        return [w.to_dict() for w in assess(kafka, points, now_ms, horizon_ms)]
    with KafkaOffsets(bootstrap, request_timeout_ms=request_timeout_ms) as own:
        warnings = assess(own, points, now_ms, horizon_ms)
    return [w.to_dict() for w in warnings]
