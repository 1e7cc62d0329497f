"""``RestoreEvent``: stored as sorted versioned JSON and read back equal."""

from __future__ import annotations

import json

import pytest

from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.protocol.records import (
    ClaimMode,
    EventKind,
    RestoreEvent,
    decode,
    encode,
)

RESCALE = RestoreEvent(
    event_kind=EventKind.RESCALE,
    at_ms=1_764_000_000_123,
    after_id=2,
    source="file:///data/chk/pipe/chk-0000000001",
    checkpoint_id=1,
    point_kind="checkpoint",
    claim_mode=ClaimMode.CLAIM,
    parallelism_before={"source": 1, "agg": 2},
    parallelism=3,
    records_to_replay=15,
    who="cli:alice",
    writer="0123456789ab",
    labels={"by": "microcheckpoint CLI", "user": "alice"},
)
CANCEL = RestoreEvent(
    event_kind=EventKind.CANCEL,
    at_ms=5,
    after_id=0,
    source="",
    checkpoint_id=None,
    point_kind="",
    claim_mode=None,
    parallelism_before={},
    parallelism=None,
    records_to_replay=None,
    who="pipe_cancel/manual__1",
    writer="ffffffffffff",
    note="DELETE_ON_CANCELLATION; aborted: none; deleted 0 objects",
)


@pytest.mark.parametrize("event", [RESCALE, CANCEL], ids=["rescale", "cancel"])
def test_an_event_round_trips_through_its_stored_bytes(event: RestoreEvent) -> None:
    data = encode(event)
    assert decode(RestoreEvent, data, "e") == event
    assert encode(decode(RestoreEvent, data, "e")) == data


def test_the_stored_json_names_every_field() -> None:
    assert json.loads(encode(RESCALE)) == {
        "version": 1,
        "kind": "rescale",
        "at_ms": 1_764_000_000_123,
        "after_id": 2,
        "source": "file:///data/chk/pipe/chk-0000000001",
        "checkpoint_id": 1,
        "point_kind": "checkpoint",
        "claim_mode": "CLAIM",
        "parallelism_before": {"agg": 2, "source": 1},
        "parallelism": 3,
        "records_to_replay": 15,
        "who": "cli:alice",
        "writer": "0123456789ab",
        "note": "",
        "labels": {"by": "microcheckpoint CLI", "user": "alice"},
    }


def test_an_unknown_kind_is_refused_naming_the_file() -> None:
    body = {**json.loads(encode(RESCALE)), "kind": "resize"}
    with pytest.raises(MetadataFormatError) as caught:
        decode(RestoreEvent, json.dumps(body).encode(), "s3://b/pipe/_events/restores/1-a")
    assert str(caught.value) == (
        "s3://b/pipe/_events/restores/1-a is not a valid restore event record "
        "('resize' is not a valid EventKind)"
    )
