"""Barrier markers: what a marker's headers say, and what is not a marker."""

from __future__ import annotations

from microcheckpoint.protocol.markers import MARKER_HEADER, Marker, is_marker, marker_of

WRITER = [("mcp-pipeline", b"stage-1"), ("mcp-uid", b"to-stage-2"), ("mcp-epoch", b"12")]


def test_a_marker_names_its_stage_sink_and_epoch() -> None:
    headers = [*WRITER, ("mcp-seq", b"3"), (MARKER_HEADER, b"12")]
    assert is_marker(headers)
    assert marker_of(headers) == Marker("stage-1", "to-stage-2", 12)


def test_data_records_and_malformed_markers_are_not_markers() -> None:
    assert marker_of([*WRITER, ("mcp-seq", b"0")]) is None
    assert not is_marker([*WRITER, ("mcp-seq", b"0")])
    assert not is_marker(None) and marker_of(None) is None
    assert not is_marker([])
    # A marker header on a record without a writer, or with a bad epoch, is malformed:
    # it is skipped by the reader (is_marker) but never taken as a stage's marker.
    assert is_marker([(MARKER_HEADER, b"1")])
    assert marker_of([(MARKER_HEADER, b"1")]) is None
    assert marker_of([*WRITER, (MARKER_HEADER, b"x")]) is None
    assert marker_of([*WRITER, (MARKER_HEADER, None)]) is None
    assert marker_of([("mcp-pipeline", b"\xff"), ("mcp-uid", b"u"), (MARKER_HEADER, b"1")]) is None
