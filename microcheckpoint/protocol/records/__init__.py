"""The JSON records the protocol writes, as frozen dataclasses with one codec each.

Every record carries ``"version"``; version 1 is read, and so are records written before
versions were recorded (no ``"version"``, read as 1). A newer version is refused with the
fix (upgrade), never half-read. ``_metadata`` (``records.metadata``), the commit point,
carries its own format name and version.

| record | key | written |
|---|---|---|
| ``PendingRecord`` | ``chk-<n>/_pending`` | put-if-absent: allocates n, holds barrier n |
| ``AttemptRecord`` | ``chk-<n>/_attempt-<k>`` | put-if-absent: attempt k began |
| ``Ack`` | ``chk-<n>/acks/<k>/<uid#i>.json`` | put-if-absent: one per task and attempt |
| ``DeclineRecord`` | ``chk-<n>/_declined-<k>`` | put-if-absent: the first task of attempt k that failed |
| ``OutcomeRecord`` | ``chk-<n>/_outcome`` | put-if-absent: COMPLETED or ABORTED, once |
| ``NotifiedRecord`` | ``chk-<n>/_notified`` | put: notify finished |
| ``RestoreMarker`` | ``<pipeline>/_restore`` | put: the pipeline is re-based on a point |
| ``StopRecord`` | ``<pipeline>/_stopped`` | put: triggering stopped until a restore |
| ``FailuresReset`` | ``<pipeline>/_failures_reset`` | put: a person cleared the failures |
| ``RestoreEvent`` | ``<pipeline>/_events/restores/<at>-<writer>`` | put-if-absent: one restore, rescale, fallback or cancel |
| ``CheckpointMetadata`` | ``chk-<n>/_metadata``, savepoint folders | put-if-absent: the commit point |
"""

from microcheckpoint.protocol.records.checkpoint import (
    AbortReason,
    Ack,
    AttemptRecord,
    DeclineRecord,
    NotifiedRecord,
    Outcome,
    OutcomeRecord,
    PendingRecord,
)
from microcheckpoint.protocol.records.codec import RECORD_VERSION, decode, encode, read
from microcheckpoint.protocol.records.handles import StateHandle
from microcheckpoint.protocol.records.metadata import (
    CheckpointMetadata,
    decode_metadata,
    encode_metadata,
    read_point_metadata,
)
from microcheckpoint.protocol.records.pipeline import (
    CancelRecord,
    ClaimMode,
    FailuresReset,
    RestoreMarker,
    StopRecord,
)
from microcheckpoint.protocol.records.restore_event import EventKind, RestoreEvent

__all__ = [
    "RECORD_VERSION",
    "AbortReason",
    "Ack",
    "AttemptRecord",
    "DeclineRecord",
    "CancelRecord",
    "CheckpointMetadata",
    "ClaimMode",
    "EventKind",
    "FailuresReset",
    "NotifiedRecord",
    "Outcome",
    "OutcomeRecord",
    "PendingRecord",
    "RestoreEvent",
    "RestoreMarker",
    "StateHandle",
    "StopRecord",
    "decode",
    "decode_metadata",
    "encode",
    "encode_metadata",
    "read",
    "read_point_metadata",
]
