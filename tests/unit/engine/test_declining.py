"""A task whose work raises declines its checkpoint with the cause in one line, then the
error goes on unchanged (``engine.declining``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint.engine.declining import declining
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.declines import read_decline
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.storage.file import FileStore


def test_a_failing_task_declines_and_reraises(tmp_path: Path) -> None:
    store = FileStore(tmp_path.as_uri())
    error = ValueError("bad row 3")
    with pytest.raises(ValueError) as raised, declining(lambda: store, "p", 4, 2, "agg#1"):
        raise error
    assert raised.value is error
    found = read_decline(store, Layout("p"), CheckpointId(4), 2)
    assert found is not None
    assert (found.task, found.cause, found.detail) == (
        "agg#1",
        "ValueError: bad row 3",
        "task agg#1: ValueError: bad row 3",
    )


def test_work_that_succeeds_declines_nothing_and_storage_trouble_hides_no_error(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path.as_uri())
    with declining(lambda: store, "p", 4, 2, "agg#1"):
        pass
    assert read_decline(store, Layout("p"), CheckpointId(4), 2) is None

    def unreachable() -> FileStore:
        raise OSError("storage down")

    with pytest.raises(KeyError), declining(unreachable, "p", 4, 2, "agg#1"):
        raise KeyError("word")
