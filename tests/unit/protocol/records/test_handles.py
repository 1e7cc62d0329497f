"""A state handle's content hash: written with the file, checked on every load."""

from __future__ import annotations

import hashlib

import pytest

from microcheckpoint.errors import CorruptFile, MetadataFormatError
from microcheckpoint.protocol.records.handles import StateHandle

URL = "s3://bucket/pipe/chk-0000000007/state/counts/00001-a00002/delta.parquet"
DATA = bytes(range(256)) * 4


def test_a_handle_of_data_carries_its_size_and_sha256_through_json() -> None:
    handle = StateHandle.of("pipe/k", DATA, [9, 3])
    assert handle == StateHandle("pipe/k", 1024, (9, 3), hashlib.sha256(DATA).hexdigest())
    assert handle.to_json()["sha256"] == hashlib.sha256(DATA).hexdigest()
    assert StateHandle.from_json(handle.to_json()) == handle
    assert handle.check(DATA, URL) is DATA


def test_a_handle_written_before_hashes_reads_as_before_and_is_checked_by_size() -> None:
    old = {"key": "pipe/k", "size": 1024, "key_groups": [3]}
    handle = StateHandle.from_json(old)
    assert handle.sha256 == "" and handle.to_json() == old
    flipped = bytearray(DATA)
    flipped[100] ^= 0x01
    assert handle.check(bytes(flipped), URL) == bytes(flipped)  # nothing to compare with
    with pytest.raises(CorruptFile, match="is 1023 bytes, its checkpoint recorded 1024"):
        handle.check(DATA[:-1], URL)


@pytest.mark.parametrize("at", [0, 511, 1023])
def test_one_flipped_bit_anywhere_is_caught_and_names_the_file(at: int) -> None:
    handle = StateHandle.of("pipe/k", DATA)
    flipped = bytearray(DATA)
    flipped[at] ^= 0x10
    with pytest.raises(CorruptFile) as caught:
        handle.check(bytes(flipped), URL, "state file")
    message = str(caught.value)
    assert message.startswith(f"state file {URL} has sha256 ")
    assert f"recorded {handle.sha256[:16]}" in message
    assert "restore an older checkpoint or savepoint" in message
    assert isinstance(caught.value, MetadataFormatError)  # handled wherever corruption is


def test_a_truncated_file_is_caught_by_its_size_first() -> None:
    handle = StateHandle.of("pipe/k", DATA)
    with pytest.raises(CorruptFile, match=f"state file {URL} is 512 bytes, .* recorded 1024"):
        handle.check(DATA[:512], URL)
