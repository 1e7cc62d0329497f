"""The versioned ``_metadata`` format: round trip and every way a file can be unreadable."""

from __future__ import annotations

import dataclasses
import json

import pytest

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier, OffsetRange
from microcheckpoint.protocol.records import Ack
from microcheckpoint.protocol.records.metadata import (
    FORMAT,
    VERSION,
    CheckpointMetadata,
    decode_metadata,
    encode_metadata,
)
from microcheckpoint.protocol.schemes import SCHEME_FIELD, SPARK_HASH
from microcheckpoint.state.handles import StateHandle

SOURCE = "file:///store/pipe/chk-0000000004/_metadata"
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 1)


def sample(**changes: object) -> CheckpointMetadata:
    meta = CheckpointMetadata(
        pipeline="pipe",
        checkpoint_id=CheckpointId(4),
        attempt=2,
        barrier=Barrier({TP0: OffsetRange(10, 25), TP1: OffsetRange(3, 3)}),
        acks={
            SRC: Ack(SRC, 2, (), {"events:0": 25, "events:1": 3}, 4),
            AGG: Ack(
                AGG,
                2,
                (
                    StateHandle("pipe/chk-0000000004/state/agg/00001-a00002/kg-5", 120, (5,)),
                    StateHandle("pipe/chk-0000000002/state/agg/00001-a00001/kg-6", 80, (6, 7)),
                ),
                {},
                30,
            ),
        },
        trigger_time_ms=1_000_000,
        completed_time_ms=1_004_500,
        config={"pipeline": "pipe", "retained": 2},
        base=3,
        writer="token-1",
    )
    return dataclasses.replace(meta, **changes)


def test_round_trip_equal_fields() -> None:
    meta = sample()
    decoded = decode_metadata(encode_metadata(meta), SOURCE)
    assert decoded == meta
    for f in dataclasses.fields(CheckpointMetadata):
        assert getattr(decoded, f.name) == getattr(meta, f.name), f.name
    assert decoded.offsets == {TP0: 25, TP1: 3}
    assert decoded.state_size == 200
    assert decoded.duration_ms == 4500
    assert [h.key for h in decoded.handles] == [
        "pipe/chk-0000000004/state/agg/00001-a00002/kg-5",
        "pipe/chk-0000000002/state/agg/00001-a00001/kg-6",
    ]


def test_round_trip_savepoint_kind() -> None:
    meta = sample(kind="savepoint", relative=True, base=None, config={})
    assert decode_metadata(encode_metadata(meta), SOURCE) == meta


def test_encoded_body() -> None:
    body = json.loads(encode_metadata(sample()))
    assert body["format"] == FORMAT == "microcheckpoint/metadata"
    assert body["version"] == 1  # no operator names a key group scheme: older versions read it
    assert body["offsets"] == {"events:0": 25, "events:1": 3}
    assert body["barrier"] == {"events:0": [10, 25], "events:1": [3, 3]}
    assert sorted(body["tasks"]) == ["agg#1", "source#0"]
    assert body["checkpoint_id"] == 4
    assert body["kind"] == "checkpoint"


def test_encoding_is_deterministic() -> None:
    assert encode_metadata(sample()) == encode_metadata(sample())


@pytest.mark.parametrize("data", [b"\x00\x01garbage", b"", b'{"format": ', b"\xff\xfe\xfa"])
def test_corrupt_bytes(data: bytes) -> None:
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(data, SOURCE)
    message = str(caught.value)
    assert message.startswith(f"{SOURCE} is corrupt (not JSON: ")
    assert message.endswith("restore from another checkpoint or savepoint")


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ({"magic": 0x4960F6, "version": 3, "checkpointId": 4}, "None"),
        ({"format": "flink/metadata", "version": 1}, "'flink/metadata'"),
        (["microcheckpoint/metadata", 1], "'list'"),
        ("microcheckpoint/metadata", "'str'"),
        (42, "'int'"),
    ],
)
def test_foreign_format(body: object, found: str) -> None:
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert str(caught.value) == (
        f"{SOURCE} is not a microcheckpoint _metadata (format {found}, expected "
        "'microcheckpoint/metadata'); point the restore at a checkpoint or savepoint "
        "written by microcheckpoint"
    )


def test_state_grouped_by_spark_hash_is_version_2_so_older_versions_refuse_it() -> None:
    # An older microcheckpoint would take the groups for blake2b ones and misplace keys.
    meta = sample()
    named = dataclasses.replace(meta.acks[AGG], operator_state={SCHEME_FIELD: SPARK_HASH})
    meta = dataclasses.replace(meta, acks={**meta.acks, AGG: named})
    body = json.loads(encode_metadata(meta))
    assert body["version"] == VERSION == 2
    assert decode_metadata(encode_metadata(meta), SOURCE) == meta
    assert body["tasks"]["agg#1"]["operator_state"] == {SCHEME_FIELD: SPARK_HASH}


@pytest.mark.parametrize("version", [3, 0, "1", None, 1.5])
def test_unreadable_version(version: object) -> None:
    body = json.loads(encode_metadata(sample()))
    body["version"] = version
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert str(caught.value) == (
        f"{SOURCE} has format version {version!r}; this microcheckpoint reads versions 1..2. "
        "Upgrade microcheckpoint to read it"
    )


def test_missing_version() -> None:
    body = json.loads(encode_metadata(sample()))
    del body["version"]
    with pytest.raises(MetadataFormatError, match="has format version None"):
        decode_metadata(json.dumps(body).encode(), SOURCE)


REQUIRED = [
    "pipeline",
    "checkpoint_id",
    "attempt",
    "trigger_time_ms",
    "completed_time_ms",
    "barrier",
    "tasks",
]


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_field_names_the_source_and_field(field: str) -> None:
    body = json.loads(encode_metadata(sample()))
    del body[field]
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert str(caught.value) == (
        f"{SOURCE} is malformed (missing field {field!r}); it cannot be restored: "
        "restore from another checkpoint or savepoint"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("checkpoint_id", 0), ("attempt", "two"), ("tasks", []), ("trigger_time_ms", None)],
)
def test_bad_field_value_names_the_source(field: str, value: object) -> None:
    body = json.loads(encode_metadata(sample()))
    body[field] = value
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert str(caught.value).startswith(f"{SOURCE} is malformed (")


def test_missing_field_message_names_the_fix() -> None:
    body = json.loads(encode_metadata(sample()))
    del body["barrier"]
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert "another checkpoint or savepoint" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("barrier", {"events:0": [25, 10]}), ("tasks", {"source#0": {"attempt": 2}})],
)
def test_malformed_barrier_or_ack_names_the_source(field: str, value: object) -> None:
    body = json.loads(encode_metadata(sample()))
    body[field] = value
    with pytest.raises(MetadataFormatError) as caught:
        decode_metadata(json.dumps(body).encode(), SOURCE)
    assert SOURCE in str(caught.value)
