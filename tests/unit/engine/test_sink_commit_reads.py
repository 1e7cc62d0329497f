"""A sink's first request goes at once with the reads of its staged parts (``commit_sinks``).

``FileSink.commit`` looks for its manifest before it uses the parts: that GET and the
parts' GETs are one round trip of an epoch's notify, not two, and an epoch already
published reads no part at all. Real file stores; no Spark.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from types import SimpleNamespace

import pytest

from microcheckpoint.config import CheckpointingMode
from microcheckpoint.engine.sinkstage import SinkContext, SinkPublisher, commit_sinks, stage_part
from microcheckpoint.errors import MetadataFormatError
from microcheckpoint.ids import TaskId
from microcheckpoint.protocol.coordinator import record_ack
from microcheckpoint.protocol.records import Ack
from microcheckpoint.sinks.base import Sink
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


def staged(h, coord, sink: Sink):
    """Checkpoint 1 with ``ROWS`` staged by the sink's two subtasks, every task acked; its
    id and plan."""
    tasks = [TaskId.of("source", 0), TaskId.of(sink.uid, 0), TaskId.of(sink.uid, 1)]
    cid = coord.trigger(tasks, {TP0: 3}, h.startup({TP0: 0})).checkpoint_id
    plan = coord.plan(cid)
    ctx = SinkContext(
        h.store.url, {}, PIPELINE, cid.value, plan.attempt, CheckpointingMode.EXACTLY_ONCE.value
    )
    for part, rows in enumerate(ROWS):
        next(stage_part(ctx, sink, part, rows))
    record_ack(h.store, h.layout, cid, Ack(tasks[0], plan.attempt, (), {}, 3))
    return cid, plan


def staged_epoch(h, sink: Sink):
    """Checkpoint 1 with ``ROWS`` staged by the sink's two subtasks, completed."""
    coord = h.coordinator()
    return coord.complete(staged(h, coord, sink)[0])


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


class Rows(Sink):
    """A sink that takes its rows and publishes them to ``published`` (nothing to wait for
    of its own: ``parts`` waits for ``ready``)."""

    def __init__(self, uid: str) -> None:
        super().__init__(uid)
        self.published: list[list[dict]] = []

    def commit(self, epoch, parts) -> None:
        self.published.append([row for part in parts for row in part])


def test_a_sink_gets_its_rows_only_once_ready_returns(h) -> None:
    # ``ready``: notify's wait for the _metadata that complete(then_notify=True) sent.
    sink = Rows("out")
    meta = staged_epoch(h, sink)
    store = Watched(h.store.url, "/sink/", threading.Event())
    store.patience = 0.0
    seen: list[tuple[int, int]] = []

    def ready() -> None:  # the parts' reads need not wait for it: give them 5 s to come
        deadline = time.monotonic() + 5.0
        while len(store.gets) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append((len(store.gets), len(sink.published)))

    commit_sinks(store, [sink], meta, ready=ready)
    # Both parts were read meanwhile; nothing was published before it returned.
    assert seen == [(2, 0)]
    assert [[r["key"] for r in rows] for rows in sink.published] == [["a", "b", "c"]]


def test_the_file_sink_writes_its_data_files_before_ready_and_its_manifest_after(
    h, tmp_path
) -> None:
    target = (tmp_path / "out").as_uri()
    sink = FileSink("out", target)
    meta = staged_epoch(h, sink)
    seen: list[list[str]] = []

    def ready() -> None:
        seen.append(sorted(k.rsplit("/", 2)[-2] for k in FileStore(target).list("pipe/out/")))

    commit_sinks(h.store, [sink], meta, ready=ready)
    # Its data files were written (invisible), its manifest not yet.
    assert seen == [["epoch-0000000001", "epoch-0000000001"]]
    assert [r["key"] for r in read_committed(target, PIPELINE, "out")] == ["a", "b", "c"]


@pytest.mark.parametrize("make", [Rows, None], ids=["any sink", "file sink"])
def test_a_failed_ready_publishes_nothing(h, tmp_path, make) -> None:
    target = (tmp_path / "out").as_uri()
    sink = make("out") if make else FileSink("out", target)
    meta = staged_epoch(h, sink)

    def ready() -> None:
        raise OSError("PUT _metadata: connection reset")

    with pytest.raises(OSError, match="connection reset"):
        commit_sinks(h.store, [sink], meta, ready=ready)
    if make:
        assert sink.published == []
    else:
        assert read_committed(target, PIPELINE, "out") == []
        assert not [k for k in FileStore(target).list("pipe/out/") if "_manifests" in k]


class Logged(FileStore):
    """A file store that logs its GETs and, as a manifest is written, whether the
    checkpoint's ``_metadata`` (``metadata``, in ``checkpoints``) existed; its writes of a
    ``_metadata`` take 0.3 s."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gets: list[str] = []
        self.metadata: str | None = None
        self.checkpoints: FileStore | None = None
        self.restorable: list[bool] = []

    def get(self, key: str) -> StoredObject | None:
        self.gets.append(key)
        return super().get(key)

    def put_if_absent(self, key: str, data: bytes):
        if "/_manifests/" in key and self.checkpoints is not None:
            self.restorable.append(self.checkpoints.exists(self.metadata))
        if key.endswith("/_metadata"):
            time.sleep(0.3)  # a slow commit point: what the manifest must wait for
        return super().put_if_absent(key, data)


def test_the_publish_reads_before_the_checkpoint_is_decided(h, tmp_path) -> None:
    target = (tmp_path / "out").as_uri()
    sink = FileSink("out", target)
    output = sink._store = Logged(target)
    store = h.store = Logged(h.store.url)
    coord = h.coordinator()
    cid, plan = staged(h, coord, sink)
    output.metadata, output.checkpoints = h.layout.metadata(cid), store
    pipeline = SimpleNamespace(name=PIPELINE, sinks=[sink], source=SimpleNamespace(uid="source"))
    publisher = SinkPublisher(pipeline, store)

    publisher.prepare(plan)
    # Both staged parts and the manifest are read before the checkpoint is even claimed.
    deadline = time.monotonic() + 5.0
    while (len(store.gets) < 2 or not output.gets) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len([k for k in store.gets if "/sink/" in k]) == 2
    assert [k.rsplit("/", 1)[-1] for k in output.gets] == ["epoch-0000000001.json"]
    assert not coord.view().records[cid].outcome

    coord.complete(cid, then_notify=True)
    coord.notify(cid, commit_sinks=publisher)
    # Read once each, and the manifest written once _metadata was.
    assert len([k for k in store.gets if "/sink/" in k]) == 2
    assert len(output.gets) == 1
    assert output.restorable == [True]
    assert [r["key"] for r in read_committed(target, PIPELINE, "out")] == ["a", "b", "c"]


class FailsFirst(Logged):
    """A logged store whose first GET of every staged part fails."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.failed: set[str] = set()

    def get(self, key: str) -> StoredObject | None:
        if "/sink/" in key and key not in self.failed:
            self.failed.add(key)
            self.gets.append(key)
            raise OSError(f"GET {key}: connection reset")
        return super().get(key)


def test_a_staged_part_read_ahead_that_failed_is_read_again(h, tmp_path) -> None:
    target = (tmp_path / "out").as_uri()
    sink = FileSink("out", target)
    store = h.store = FailsFirst(h.store.url)
    coord = h.coordinator()
    cid, plan = staged(h, coord, sink)
    pipeline = SimpleNamespace(name=PIPELINE, sinks=[sink], source=SimpleNamespace(uid="source"))
    publisher = SinkPublisher(pipeline, store)

    coord.complete(cid, then_notify=True, on_acked=partial(publisher.prepare, plan))
    coord.notify(cid, commit_sinks=publisher)

    assert len(store.failed) == 2  # both reads ahead failed, and were sent again
    assert len([k for k in store.gets if "/sink/" in k]) == 4
    assert [r["key"] for r in read_committed(target, PIPELINE, "out")] == ["a", "b", "c"]
