"""Which records a pipeline has processed: what an event-driven schedule wakes it for.

A record at ``offset`` of a partition is processed when a completed checkpoint the pipeline
continues from holds it: its offset is below that checkpoint's end offset for the partition.
After a restore written since the latest completed checkpoint, the pipeline continues from
the restored point, so its offsets count instead (records after them are processed again).
A record in a checkpoint still in flight counts as not processed: that checkpoint may yet
abort, and then only another run reads the record again.
"""

from __future__ import annotations

from microcheckpoint.ids import TopicPartition
from microcheckpoint.protocol.view import PipelineView

__all__ = ["processed_offsets"]


def processed_offsets(view: PipelineView) -> dict[TopicPartition, int]:
    """Per partition, the offset below which every record is processed (module doc); a
    partition missing has no processed record."""
    latest = view.latest_completed
    marker = view.restore_marker
    if marker is not None and marker.covers(latest):
        return dict(marker.offsets)
    if latest is None:
        return {}
    return dict(view.metadata(latest).offsets)
