"""The record codec: every record round-trips, carries its version, and bad bytes are named."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier, OffsetRange
from microcheckpoint.protocol.records import (
    RECORD_VERSION,
    AbortReason,
    Ack,
    AttemptRecord,
    ClaimMode,
    FailuresReset,
    NotifiedRecord,
    OutcomeRecord,
    PendingRecord,
    RestoreMarker,
    StopRecord,
    decode,
    encode,
    read,
)
from microcheckpoint.protocol.records.alignment import (
    AlignmentMode,
    FanInAlignment,
    InflightChannel,
    InputAlignment,
)
from microcheckpoint.protocol.records.global_savepoint import GlobalManifest, StageInput, StagePoint
from microcheckpoint.protocol.records.interval import DataInterval
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore

TP0 = TopicPartition("events", 0)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 1)

RECORDS = [
    PendingRecord(
        pipeline="pipe",
        checkpoint_id=CheckpointId(3),
        barrier=Barrier({TP0: OffsetRange(10, 25)}),
        trigger_time_ms=1_000,
        expected=frozenset({SRC, AGG}),
        base=CheckpointId(2),
        writer="w",
        labels={"run_id": "scheduled__x"},
        data_interval=DataInterval(
            datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC)
        ),
        restored_from="s3://b/pipe/savepoints/sp",
    ),
    PendingRecord("pipe", CheckpointId(1), Barrier({}), 5, frozenset({SRC})),
    AttemptRecord(2, "w", 7),
    Ack(AGG, 2, (StateHandle("pipe/chk-0000000003/state/agg/x", 12, (4, 5)),), {"a": 1}, 9),
    OutcomeRecord.completed_by(2, 11, "w"),
    OutcomeRecord.aborted(AbortReason.EXPIRED, "timeout 60.0s", 12, "w"),
    NotifiedRecord(13),
    RestoreMarker(
        source="s3://b/pipe/savepoints/sp",
        prefix="pipe/savepoints/sp/",
        point_kind="savepoint",
        checkpoint_id=3,
        pipeline_checkpoint=None,
        claim_mode=ClaimMode.NO_CLAIM,
        after_id=4,
        offsets={TP0: 25},
        handle_keys=("pipe/savepoints/sp/files/a",),
        note="",
        parallelism=3,
    ),
    RestoreMarker(
        "u", "pipe/chk-0000000001/", "checkpoint", 1, CheckpointId(1), ClaimMode.CLAIM, 2, {}
    ),
    StopRecord("stop with savepoint", 14),
    FailuresReset(5, 15),
    PendingRecord(
        "pipe",
        CheckpointId(4),
        Barrier({TopicPartition("files.src", 0): OffsetRange(2, 4)}),
        6,
        frozenset({SRC}),
        files={TopicPartition("files.src", 0): ("day-03.parquet", "day-04.parquet")},
    ),
    PendingRecord(
        "down",
        CheckpointId(5),
        Barrier({TopicPartition("mid", 0): OffsetRange(2, 4)}),
        7,
        frozenset({SRC}),
        alignment=FanInAlignment(
            {
                "a": InputAlignment(
                    AlignmentMode.UNALIGNED,
                    12,
                    4,
                    "up",
                    ("mid",),
                    2,
                    3,
                    40,
                    (InflightChannel("mid:1", 6, 4),),
                    0,
                    "aligned_timeout 1 s",
                ),
                "b": InputAlignment(AlignmentMode.AT_LEAST_ONCE),
            }
        ),
    ),
    GlobalManifest(
        (
            StagePoint("up", 2, "up/savepoint-2", ()),
            StagePoint("down", 2, "down/savepoint-2", (StageInput("up", 2, ("mid",)),)),
        )
    ),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_with_its_version(record) -> None:
    data = encode(record)
    assert json.loads(data)["version"] == RECORD_VERSION
    assert decode(type(record), data, "somewhere") == record
    assert encode(decode(type(record), data, "somewhere")) == data


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_written_before_versions_reads_as_version_1(record) -> None:
    body = json.loads(encode(record))
    del body["version"]
    assert decode(type(record), json.dumps(body).encode(), "old") == record


def test_a_newer_version_is_refused_with_the_fix() -> None:
    body = {**json.loads(encode(StopRecord("x", 1))), "version": RECORD_VERSION + 1}
    with pytest.raises(MetadataFormatError) as caught:
        decode(StopRecord, json.dumps(body).encode(), "s3://b/pipe/_stopped")
    assert str(caught.value) == (
        f"s3://b/pipe/_stopped has record version {RECORD_VERSION + 1}; this microcheckpoint "
        f"reads versions 1..{RECORD_VERSION}. Upgrade microcheckpoint to read it"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "file:///x/_pending is corrupt: "),
        (b"[1, 2]", "file:///x/_pending is not a JSON object"),
        (b'{"pipeline": "p"}', "file:///x/_pending is not a valid _pending record (missing field "),
    ],
)
def test_bad_bytes_are_named(data: bytes, message: str) -> None:
    with pytest.raises(MetadataFormatError) as caught:
        decode(PendingRecord, data, "file:///x/_pending")
    assert str(caught.value).startswith(message)


def test_a_restore_marker_contradicting_its_claim_mode_is_refused() -> None:
    body = RECORDS[7].to_json() | {"first_snapshot_full": False}
    with pytest.raises(MetadataFormatError, match="first_snapshot_full contradicts claim_mode"):
        decode(RestoreMarker, json.dumps(body).encode(), "m")


def test_read_gives_none_for_a_missing_key(tmp_path) -> None:
    store = FileStore(tmp_path.as_uri())
    assert read(store, "pipe/_stopped", StopRecord) is None
    store.put("pipe/_stopped", encode(StopRecord("why", 3)))
    assert read(store, "pipe/_stopped", StopRecord) == StopRecord("why", 3)


def test_outcomes_say_what_was_decided() -> None:
    done, aborted = RECORDS[4], RECORDS[5]
    assert (done.completed, done.attempt, done.reason) == (True, 2, None)
    assert (aborted.completed, aborted.reason, aborted.detail) == (
        False,
        AbortReason.EXPIRED,
        "timeout 60.0s",
    )
    assert AbortReason.EXPIRED.counts_as_failure and AbortReason.DECLINED.counts_as_failure
    assert not any(
        r.counts_as_failure
        for r in (AbortReason.SUBSUMED, AbortReason.TRIGGER_REFUSED, AbortReason.BASE_ABORTED)
    )


def test_a_restore_marker_covers_the_checkpoints_before_it() -> None:
    marker = RECORDS[7]
    assert marker.first_snapshot_full is True
    assert marker.covers(None) and marker.covers(CheckpointId(4))
    assert not marker.covers(CheckpointId(5))
    assert RECORDS[8].first_snapshot_full is False


def test_typed_labels_are_stored_among_the_labels_and_refused_as_free_labels() -> None:
    body = RECORDS[0].to_json()
    assert body["labels"] == {
        "run_id": "scheduled__x",
        "data_interval": ["2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00"],
        "restored_from": "s3://b/pipe/savepoints/sp",
    }
    with pytest.raises(ValueError) as caught:
        PendingRecord("p", CheckpointId(1), Barrier({}), 5, frozenset(), labels={"alignment": {}})
    assert str(caught.value) == (
        "labels ['alignment'] of checkpoint 1 are typed fields: pass them as data_interval=, "
        "alignment= or restored_from="
    )
