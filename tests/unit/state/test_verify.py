"""How verify tells state files from staged sink parts: by key tail and the ack's uid, for the
keys every writer makes (subtasks, sink staging, savepoints, imports, state import)."""

from __future__ import annotations

import pytest

from microcheckpoint.ids import CheckpointId, TaskId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.verify import Check, FileKind, classify

LAYOUT = Layout("wordcount")
CID = CheckpointId(3)
COUNTS = TaskId.of("word-counts", 1)
TOTALS = TaskId.of("word-totals", 0)
STATE_NAMES = ["base.parquet", "delta.parquet", "state.json", "kg-00007.parquet", "delta.json"]


def _state_key(name: str) -> str:
    return LAYOUT.state_prefix(CID, 2, COUNTS) + name


def _as_copied(key: str, folder: str = "wordcount/savepoints/savepoint-0000000003-abcdef/") -> str:
    """The key ``create_savepoint`` gives a file (relative), as a restore resolves it."""
    return folder + "files/" + key.split("/", 1)[1]


@pytest.mark.parametrize("name", STATE_NAMES)
def test_a_subtask_file_of_every_format_is_state_with_or_without_key_groups(name: str) -> None:
    for groups in [(), (7, 9)]:  # a memory subtask owning no key writes none
        handle = StateHandle(_state_key(name), 10, groups)
        assert classify(handle, "word-counts") == FileKind.STATE
        assert classify(StateHandle(_as_copied(handle.key), 10, groups), "word-counts") == (
            FileKind.STATE
        )


def test_a_staged_sink_part_is_a_sink_part_in_checkpoints_savepoints_and_imports() -> None:
    key = LAYOUT.sink_part(CID, TOTALS, 2)
    assert key == "wordcount/chk-0000000003/sink/word-totals/part-00000-a00002.jsonl"
    imported = "wordcount/savepoints/imported-0000000003-123456/files/" + _as_copied(key)
    for copy in [key, _as_copied(key), imported]:
        assert classify(StateHandle(copy, 10), "word-totals") == FileKind.SINK_PART


def test_a_state_import_base_file_is_state() -> None:
    key = "files/bootstrap/state/word-counts/00001/base.parquet"
    assert classify(StateHandle(key, 10, (64,)), "word-counts") == FileKind.STATE


@pytest.mark.parametrize(
    ("key", "uid"),
    [
        (_state_key("base.parquet"), "word-totals"),  # another operator's folder
        ("wordcount/chk-0000000003/sink/word-totals/part-00000-a00002.jsonl", "word-counts"),
        (_state_key("part-00000-a00002.jsonl"), "word-counts"),  # a sink name in a state folder
        ("wordcount/chk-0000000003/sink/word-totals/base.parquet", "word-totals"),
        (_state_key("state.parquet"), "word-counts"),  # a name of no format
        ("base.parquet", "word-counts"),  # too short to have the folders
        ("sink/word-totals/part-1.jsonl", "word-totals"),
    ],
)
def test_anything_else_is_unknown_and_never_passed_unread(key: str, uid: str) -> None:
    assert classify(StateHandle(key, 10), uid) == FileKind.UNKNOWN


def test_a_check_row_carries_warning_only_when_set() -> None:
    assert Check("x", True, "d").to_json() == {"check": "x", "ok": True, "detail": "d"}
    assert Check("x", True, "d", warning=True).to_json() == {
        "check": "x",
        "ok": True,
        "detail": "d",
        "warning": True,
    }
