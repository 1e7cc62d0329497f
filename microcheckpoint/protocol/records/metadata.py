"""The versioned ``_metadata`` format: what a completed checkpoint or savepoint holds.

Version 1 is JSON with ``"format": "microcheckpoint/metadata"``. A file of another
format is refused as foreign; a newer version is refused with the fix (upgrade).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.errors import CheckpointNotFound, MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier
from microcheckpoint.protocol.records.checkpoint import Ack
from microcheckpoint.protocol.records.handles import StateHandle
from microcheckpoint.protocol.records.statistics import CheckpointStatistics
from microcheckpoint.protocol.schemes import SCHEME_FIELD
from microcheckpoint.storage.port import ObjectStore

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointMetadata",
    "decode_metadata",
    "encode_metadata",
    "read_point_metadata",
]

FORMAT = "microcheckpoint/metadata"
# 2: some operator's acks name a key group scheme (``protocol.schemes``). Written only then,
# so versions before schemes still read every other ``_metadata``, and refuse such state
# rather than take its key groups for blake2b ones and misplace its keys.
VERSION = 2


@dataclass(frozen=True)
class CheckpointMetadata:
    """Everything needed to restore: offsets, state handles per task, config, timings.

    ``kind`` is ``checkpoint`` or ``savepoint``. ``relative`` handles (savepoints)
    are keys relative to the folder holding this ``_metadata``.
    """

    pipeline: str
    checkpoint_id: CheckpointId
    attempt: int
    barrier: Barrier
    acks: Mapping[TaskId, Ack]
    trigger_time_ms: int
    completed_time_ms: int
    config: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "checkpoint"
    relative: bool = False
    base: int | None = None
    writer: str = ""
    # Flink's checkpoint statistics (``protocol.statistics``); None in savepoints and in
    # checkpoints written before statistics existed (stored as ``{}``).
    statistics: CheckpointStatistics | None = None
    # Facts for people about this copy, e.g. a savepoint's ``created_ms`` and the Airflow
    # run that took it (``dag_id``, ``run_id``); empty in checkpoints.
    labels: Mapping[str, Any] = field(default_factory=dict)
    # The lineage (docs/protocol.md, "Content hashes"): the SHA-256 of the bytes of
    # ``base``'s ``_metadata`` this checkpoint continued from ("" without a completed base;
    # None in a ``_metadata`` written before the lineage existed), and the Airflow run that
    # triggered it (``dag_id/run_id``; "" without Airflow).
    previous_sha256: str | None = None
    run: str = ""

    @property
    def offsets(self) -> dict[TopicPartition, int]:
        """Source offsets: the next offset to read per partition (barrier ends, I1)."""
        return self.barrier.ends

    @property
    def handles(self) -> list[StateHandle]:
        return [h for ack in self.acks.values() for h in ack.handles]

    @property
    def state_size(self) -> int:
        return sum(h.size for h in self.handles)

    @property
    def duration_ms(self) -> int:
        return self.completed_time_ms - self.trigger_time_ms


def encode_metadata(meta: CheckpointMetadata) -> bytes:
    body = {
        "format": FORMAT,
        "version": VERSION
        if any(SCHEME_FIELD in a.operator_state for a in meta.acks.values())
        else 1,
        "kind": meta.kind,
        "pipeline": meta.pipeline,
        "checkpoint_id": meta.checkpoint_id.value,
        "attempt": meta.attempt,
        "trigger_time_ms": meta.trigger_time_ms,
        "completed_time_ms": meta.completed_time_ms,
        "barrier": meta.barrier.to_json(),
        "offsets": {str(tp): off for tp, off in sorted(meta.offsets.items())},
        "tasks": {
            str(t): a.to_json() for t, a in sorted(meta.acks.items(), key=lambda i: str(i[0]))
        },
        "config": dict(meta.config),
        "relative": meta.relative,
        "base": meta.base,
        "writer": meta.writer,
        "statistics": {} if meta.statistics is None else meta.statistics.to_json(),
    }
    if meta.labels:
        body["labels"] = dict(meta.labels)
    if meta.previous_sha256 is not None:
        body["previous_sha256"] = meta.previous_sha256
    if meta.run:
        body["run"] = meta.run
    return json.dumps(body, indent=1, sort_keys=True).encode()


def decode_metadata(data: bytes, source: str) -> CheckpointMetadata:
    """Parse ``_metadata`` bytes read from ``source`` (named in every error).

    Raises:
        MetadataFormatError: not JSON, not our format, a newer version, or malformed.
    """
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetadataFormatError(
            f"{source} is corrupt (not JSON: {exc}); restore from another checkpoint or savepoint"
        ) from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        found = body.get("format") if isinstance(body, dict) else type(body).__name__
        raise MetadataFormatError(
            f"{source} is not a microcheckpoint _metadata (format {found!r}, expected {FORMAT!r}); "
            "point the restore at a checkpoint or savepoint written by microcheckpoint"
        )
    version = body.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise MetadataFormatError(
            f"{source} has format version {version!r}; this microcheckpoint reads versions 1..{VERSION}. "
            "Upgrade microcheckpoint to read it"
        )
    try:
        acks = {TaskId.parse(k): Ack.from_json(v) for k, v in body["tasks"].items()}
        return CheckpointMetadata(
            pipeline=str(body["pipeline"]),
            checkpoint_id=CheckpointId(int(body["checkpoint_id"])),
            attempt=int(body["attempt"]),
            barrier=Barrier.from_json(body["barrier"]),
            acks=acks,
            trigger_time_ms=int(body["trigger_time_ms"]),
            completed_time_ms=int(body["completed_time_ms"]),
            config=dict(body.get("config", {})),
            kind=str(body.get("kind", "checkpoint")),
            relative=bool(body.get("relative", False)),
            base=body.get("base"),
            writer=str(body.get("writer", "")),
            statistics=CheckpointStatistics.from_json(body.get("statistics") or {}),
            labels=dict(body.get("labels") or {}),
            previous_sha256=(
                None if body.get("previous_sha256") is None else str(body["previous_sha256"])
            ),
            run=str(body.get("run", "")),
        )
    except (KeyError, TypeError, ValueError, AttributeError, MetadataFormatError) as exc:
        problem = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
        raise MetadataFormatError(
            f"{source} is malformed ({problem}); it cannot be restored: restore from another "
            "checkpoint or savepoint"
        ) from exc


def read_point_metadata(store: ObjectStore, prefix: str) -> CheckpointMetadata:
    """The ``_metadata`` in folder ``prefix`` of ``store`` (a checkpoint's or a savepoint's).

    Raises:
        CheckpointNotFound: the folder holds no ``_metadata``.
        MetadataFormatError: it is not a readable ``_metadata``.
    """
    key = prefix.rstrip("/") + "/_metadata"
    obj = store.get(key)
    if obj is None:
        raise CheckpointNotFound(
            f"no _metadata at {store.child_url(key)}; give the folder of a savepoint or checkpoint"
        )
    return decode_metadata(obj.data, store.child_url(key))
