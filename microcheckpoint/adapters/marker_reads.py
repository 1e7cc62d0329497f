"""Reading single records by offset: the barrier markers that end a stage's ranges.

A downstream stage learns the upstream's watermark from the marker that ends each input
partition's range (``engine.stage_watermarks``): one record per partition, read in the
driver by one consumer assigned to all of them, so the cost is one fetch round, not a
re-read of the epoch. Kafka clients only (no Spark).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as _CTP

from microcheckpoint.adapters.decoding import SourceRecord
from microcheckpoint.adapters.kafka_reader import (
    _consumer_config,
    _request_timeout_ms,
    to_record,
)
from microcheckpoint.errors import KafkaSourceError
from microcheckpoint.ids import TopicPartition

__all__ = ["records_at"]


def records_at(
    bootstrap_servers: str, offsets: Mapping[TopicPartition, int], *, timeout_s: float = 60
) -> dict[TopicPartition, SourceRecord | None]:
    """The record at each partition's offset; None where there is none (a gap: compaction
    or a transaction marker, or the offset is at or past the partition's end).

    Steps: 1. one consumer is assigned every partition at its offset; 2. it polls until
    each partition has given its record, a later one, or its end (records of a partition
    arrive in offset order, so the first one at or past the offset decides).

    Raises:
        KafkaSourceError: Kafka failed, or some partition gave nothing within
            ``timeout_s`` (the message names the partitions and the broker).
    """
    if not offsets:
        return {}
    found: dict[TopicPartition, SourceRecord | None] = {}
    config = _consumer_config(bootstrap_servers, 1024 * 1024, _request_timeout_ms(timeout_s))
    try:
        consumer = Consumer(config)
    except KafkaException as exc:
        raise _failed(bootstrap_servers, offsets, exc) from exc
    try:
        # Step 1
        consumer.assign([_CTP(tp.topic, tp.partition, off) for tp, off in offsets.items()])
        # Step 2
        deadline = time.monotonic() + timeout_s
        while len(found) < len(offsets):
            if time.monotonic() > deadline:
                missing = sorted(str(tp) for tp in offsets if tp not in found)
                raise KafkaSourceError(
                    f"reading the records at {', '.join(missing)} from Kafka at "
                    f"{bootstrap_servers!r} gave nothing for timeout_s={timeout_s}; check the "
                    "broker or raise the source's timeout_s"
                )
            for message in consumer.consume(num_messages=len(offsets), timeout=0.1):
                tp = TopicPartition(message.topic(), message.partition())
                if tp not in offsets or tp in found:
                    continue
                error = message.error()
                if error is None:
                    at = message.offset() == offsets[tp]
                    found[tp] = to_record(message) if at else None
                elif error.code() == KafkaError._PARTITION_EOF:
                    found[tp] = None
                elif error.fatal() or not error.retriable():
                    raise _failed(bootstrap_servers, offsets, error)
    except KafkaException as exc:
        raise _failed(bootstrap_servers, offsets, exc) from exc
    finally:
        consumer.close()
    return found


def _failed(
    bootstrap_servers: str, offsets: Mapping[TopicPartition, int], error: object
) -> KafkaSourceError:
    detail = error.str() if isinstance(error, KafkaError) else repr(error)
    at = ", ".join(f"{tp}@{off}" for tp, off in sorted(offsets.items(), key=lambda i: str(i[0])))
    return KafkaSourceError(
        f"reading the records at {at} from Kafka at {bootstrap_servers!r} failed: {detail}; "
        "check the broker, `bootstrap_servers` and that this client may read the topic"
    )
