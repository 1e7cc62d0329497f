"""A sink's first request goes at once with the reads of its staged parts (``commit_sinks``).

``FileSink.commit`` looks for its manifest before it uses the parts: that GET and the
parts' GETs are one round trip of an epoch's notify, not two, and an epoch already
published reads no part at all. Real file stores; no Spark.
"""

from __future__ import annotations

import threading

import pytest

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.sinkstage import SinkContext, commit_sinks, stage_part
from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import TaskId
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.records import Ack
from microcheckpoint.sinks.files import FileSink, read_committed
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import StoredObject
from tests.unit.conftest import PIPELINE, TP0

ROWS = [[{"key": "a", "n": 1}, {"key": "b", "n": 2}], [{"key": "c", "n": 3}]]


class Watched(FileStore):
    """A file store whose GETs of keys containing ``needle`` note whether ``began`` was set
    within ``patience`` seconds, and log every GET."""

    def __init__(self, url: str, needle: str, began: threading.Event) -> None:
        super().__init__(url)
        self.needle, self.began, self.patience = needle, began, 5.0
        self.waited: list[bool] = []
        self.gets: list[str] = []

    def get(self, key: str) -> StoredObject | None:
        self.gets.append(key)
        if self.needle in key:
            self.waited.append(self.began.wait(self.patience))
        return super().get(key)


class Checked(FileSink):
    """A file sink that sets ``checking`` as it looks for its manifest."""

    def __init__(self, uid: str, target: str) -> None:
        super().__init__(uid, target)
        self.checking = threading.Event()

    @property
    def store(self):  # type: ignore[override]
        store = super().store
        self.checking.set()
        return store


def staged_epoch(h, sink: FileSink):
    """Checkpoint 1 with ``ROWS`` staged by the sink's two subtasks, completed."""
    coord = h.coordinator()
    tasks = [TaskId.of("source", 0), TaskId.of(sink.uid, 0), TaskId.of(sink.uid, 1)]
    cid = coord.trigger(tasks, {TP0: 3}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    ctx = SinkContext(
        h.store.url, {}, PIPELINE, cid.value, plan.attempt, CheckpointingMode.EXACTLY_ONCE.value
    )
    for part, rows in enumerate(ROWS):
        next(stage_part(ctx, sink, part, rows))
    record_ack(h.store, h.layout, cid, Ack(tasks[0], plan.attempt, (), {}, 3))
    return coord.complete(cid)


def test_the_manifest_is_looked_for_while_the_parts_are_read(h, tmp_path) -> None:
    target = (tmp_path / "out").as_uri()
    sink = Checked("out", target)
    meta = staged_epoch(h, sink)
    store = Watched(h.store.url, "/sink/", sink.checking)
    commit_sinks(store, [sink], meta)
    # Both staged parts were read, and each read began after the sink began its check.
    assert store.waited == [True, True]
    assert [r["key"] for r in read_committed(target, PIPELINE, "out")] == ["a", "b", "c"]
    # Published already: the reads are sent with the check, and the parts are not used.
    store.gets.clear()
    commit_sinks(store, [sink], meta)
    assert len(store.gets) == 2
    assert [r["key"] for r in read_committed(target, PIPELINE, "out")] == ["a", "b", "c"]


def test_a_missing_staged_part_is_named_when_the_sink_uses_it(h, tmp_path) -> None:
    sink = FileSink("out", (tmp_path / "out").as_uri())
    meta = staged_epoch(h, sink)
    part = next(k for k in h.keys("pipe/") if "/sink/" in k and "part-00001" in k)
    h.store.delete(part)
    with pytest.raises(MetadataFormatError, match=f"staged output .*{part}.* epoch 1, is miss"):
        commit_sinks(h.store, [sink], meta)
    assert read_committed((tmp_path / "out").as_uri(), PIPELINE, "out") == []
