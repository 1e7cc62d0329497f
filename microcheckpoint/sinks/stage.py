"""The stage sink: a stage's output to an internal topic, partitioned by key group, with
barrier markers.

A multi-stage pipeline joins its stages with internal Kafka topics. The upstream stage ends
with a ``StageSink``; the downstream stage starts with a ``StageSource`` over the same topic
(``microcheckpoint.engine.api``). The sink is the Kafka sink (exactly once per epoch by its
tail dedup, docs/sinks.md) with two differences:

- a row goes to the partition that owns its key's key group: partition ``p`` of ``P`` holds
  the blake2b key groups subtask ``p`` of parallelism ``P`` would own (Flink's keyBy between
  stages). All rows of a key go to one partition, in order; the downstream keyed stage still
  routes its rows by its own key group scheme (``state.keygroups``), so this placement is
  locality, never correctness;
- every partition ends each epoch with a barrier marker (``protocol.markers``), also when the
  epoch wrote no row there, so downstream knows where epoch ``n`` ends in every channel.

In AT_LEAST_ONCE the rows are written while the epoch runs and no marker is written: the
downstream stage, in AT_LEAST_ONCE too, does not align.

When the stage's source has event time, each marker also carries the stage's watermark
after the epoch (``mcp-watermark``; the ``EpochInfo``'s ``watermark``, which notify reads from
the checkpoint's source state), so the downstream stage's watermark is the upstream's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from microcheckpoint.errors import ConfigError, KafkaSinkError
from microcheckpoint.faults import channel_delay
from microcheckpoint.protocol.markers import MARKER_HEADER, NO_WATERMARK, WATERMARK_HEADER
from microcheckpoint.sinks.base import EpochInfo, Row
from microcheckpoint.sinks.kafka import KafkaSink
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.keygroups import key_group_for, subtask_for_key_group

__all__ = ["StageSink"]

_MARKER_VALUE = b""  # a data record's value is a JSON object, never empty


class StageSink(KafkaSink):
    """Writes a stage's rows to internal topic ``topic``, by key group, with markers.

    Args:
        uid: the sink's operator uid.
        bootstrap_servers: ``host:port[,host:port...]``.
        topic: the internal topic (created with ``partitions`` partitions if missing).
        key: the column whose value decides the partition (through its key group).
        partitions: the topic's partition count: the downstream stage's parallelism.
        max_parallelism: the number of key groups (as the pipelines' ``max_parallelism``).
    """

    commit_empty_epochs = True  # every epoch ends with markers, an empty one too

    def __init__(
        self,
        uid: str,
        bootstrap_servers: str,
        topic: str,
        key: str,
        partitions: int = 2,
        max_parallelism: int = 128,
        request_timeout_ms: int = 30_000,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ConfigError("key", key, "the name of the column that keys the rows")
        if (
            not isinstance(partitions, int)
            or not isinstance(max_parallelism, int)
            or not 1 <= partitions <= max_parallelism
        ):
            raise ConfigError(
                "partitions",
                partitions,
                f"an integer from 1 to max_parallelism ({max_parallelism})",
            )
        super().__init__(
            uid, bootstrap_servers, topic, key_column=key, partitions=partitions,
            request_timeout_ms=request_timeout_ms,
        )  # fmt: skip
        self.max_parallelism = max_parallelism
        self._watermark: bytes | None = None  # the markers' mcp-watermark of this commit

    def commit(self, epoch: EpochInfo, parts: Sequence[Sequence[Row]]) -> None:
        """The Kafka sink's commit; with ``epoch.event_time``, every marker of the epoch also
        carries ``epoch.watermark``, the stage's watermark after it (None: none yet, written
        as ``none``). Without it (the stage has no event time) markers carry none.
        """
        mark = NO_WATERMARK if epoch.watermark is None else str(epoch.watermark).encode()
        self._watermark = mark if epoch.event_time else None
        super().commit(epoch, parts)

    def _target(self, row: Row, key: bytes | None, part: int, index: int) -> int:
        """The partition that owns the key group of the row's key."""
        try:
            value = row[self.key_column]
        except KeyError:
            raise KafkaSinkError(
                f"stage sink {self.uid!r}: row has no key column {self.key_column!r} "
                f"(columns {sorted(row)}); fix key"
            ) from None
        group = key_group_for(canonical_key(value).encode("utf-8"), self.max_parallelism)
        return subtask_for_key_group(self.max_parallelism, self._count(), group)

    def _plan(self, parts: Sequence[Sequence[Row]]) -> dict[int, list[Any]]:
        """The rows by key group, numbered 0.. per partition, then one marker in every
        partition, numbered after the partition's rows."""
        plan = super()._plan(parts)
        for partition in range(self._count()):
            records = plan.setdefault(partition, [])
            records.append((len(records), None, _MARKER_VALUE))
        return plan

    def _send(
        self,
        producer: Any,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> Any:
        if value == _MARKER_VALUE:
            epoch = dict(headers)["mcp-epoch"]
            headers = [*headers, (MARKER_HEADER, epoch)]
            if self._watermark is not None:
                headers.append((WATERMARK_HEADER, self._watermark))
            delay = channel_delay(self.topic, partition)  # a test's slow channel
            if delay:
                producer.flush()
                time.sleep(delay)
        return super()._send(producer, partition, key, value, headers)
