"""The state-backend contract, run on the ``memory`` and ``table`` backends.

Whatever the backend, the key groups a snapshot holds read back exactly (keys, JSON values
and update times), a snapshot's bytes depend only on its state, and a corrupt file is
refused naming it.
"""

from __future__ import annotations

import abc

import pytest

from microcheckpoint.errors import MetadataFormatError, StateTooLarge
from microcheckpoint.state.backends import (
    MEMORY_LIMIT_BYTES,
    KeyGroupState,
    canonical_key,
    decode_memory,
    decode_table,
    encode_memory,
    encode_table,
)

STATES: list[dict[int, KeyGroupState]] = [
    {},
    {0: {}},
    {3: {canonical_key("a"): (1, 5)}},
    {
        1: {
            canonical_key("wörd"): ({"n": [1, 2.5, None, True]}, 7),
            canonical_key(["k", 1]): ("text", 8),
        },
        9: {canonical_key({"b": 2, "a": 1}): (2**62, 9)},
    },
]


# A snapshot is files, each with the key groups it holds (as a StateHandle records them).
Files = list[tuple[tuple[int, ...], bytes]]


class StateBackendContract(abc.ABC):
    """One backend: ``write`` a snapshot of key groups, ``decode`` one file's key group."""

    @abc.abstractmethod
    def write(self, groups: dict[int, KeyGroupState]) -> Files: ...

    @abc.abstractmethod
    def decode(self, data: bytes, kg: int) -> KeyGroupState: ...

    def read(self, files: Files, kg: int) -> KeyGroupState:
        holding = [data for kgs, data in files if kg in kgs]
        assert len(holding) <= 1, f"key group {kg} is in {len(holding)} files"
        return self.decode(holding[0], kg) if holding else {}

    @pytest.mark.parametrize("groups", STATES)
    def test_every_key_group_reads_back_exactly(self, groups: dict[int, KeyGroupState]) -> None:
        files = self.write(groups)
        for kg, state in groups.items():
            assert self.read(files, kg) == state

    @pytest.mark.parametrize("groups", STATES)
    def test_a_snapshot_depends_only_on_its_state(self, groups: dict[int, KeyGroupState]) -> None:
        reordered = {
            kg: dict(reversed(list(s.items()))) for kg, s in reversed(list(groups.items()))
        }
        assert self.write(groups) == self.write(reordered)

    def test_a_corrupt_file_is_refused_by_name(self) -> None:
        with pytest.raises(MetadataFormatError, match="state file s3://b/x is corrupt"):
            self.decode(b"\x00garbage{", 0)


class TestMemoryBackend(StateBackendContract):
    def write(self, groups: dict[int, KeyGroupState]) -> Files:
        return [(tuple(sorted(groups)), encode_memory("op", groups))]

    def decode(self, data: bytes, kg: int) -> KeyGroupState:
        return decode_memory(data, "s3://b/x", [kg]).get(kg, {})

    def test_a_snapshot_over_the_limit_names_the_operator_and_the_way_out(self) -> None:
        big: dict[int, KeyGroupState] = {
            0: {canonical_key(i): ("x" * 100, 0) for i in range(60_000)}
        }
        with pytest.raises(StateTooLarge) as caught:
            encode_memory("counts", big)
        assert f"exceeds the {MEMORY_LIMIT_BYTES} byte limit" in str(caught.value)
        assert "operator 'counts'" in str(caught.value)
        assert "use state_backend='table'" in str(caught.value)


class TestTableBackend(StateBackendContract):
    def write(self, groups: dict[int, KeyGroupState]) -> Files:
        return [((kg,), encode_table(state)) for kg, state in sorted(groups.items())]

    def decode(self, data: bytes, kg: int) -> KeyGroupState:
        return decode_table(data, "s3://b/x")
