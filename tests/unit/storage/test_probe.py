"""The store conformance probe on the file store and on a store that ignores the condition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import StoreNotConformant, TriggerRefused
from microcheckpoint.ids import TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.storage import FileStore, ObjectStore, StoredObject, WriteOutcome
from microcheckpoint.storage.probe import MARKER_KEY, ensure_put_if_absent, forget_probes

TP = TopicPartition("events", 0)
TASKS = (TaskId.of("source", 0),)


class CountingStore(ObjectStore):
    """A file store that counts reads and writes; ``ignore_condition`` makes put-if-absent a
    plain put that answers OK (a store that ignores ``If-None-Match``)."""

    def __init__(
        self, root: Path, ignore_condition: bool = False, always_conflict: bool = False
    ) -> None:
        self.inner = FileStore(root.as_uri())
        self.url = self.inner.url
        self.ignore_condition = ignore_condition
        self.always_conflict = always_conflict
        self.gets = 0
        self.writes = 0
        self.read_keys: list[str] = []

    def get(self, key: str) -> StoredObject | None:
        self.gets += 1
        self.read_keys.append(key)
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.writes += 1
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        self.writes += 1
        if self.always_conflict:
            return WriteOutcome.CONFLICT
        if self.ignore_condition:
            self.inner.put(key, data)
            return WriteOutcome.OK
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> WriteOutcome:
        self.writes += 1
        return self.inner.put_if_match(key, data, etag)

    def delete(self, key: str) -> None:
        self.writes += 1
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list(prefix)


@pytest.fixture(autouse=True)
def _fresh_process_cache() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def refusal(store: ObjectStore, what: str = "the second write answered OK") -> str:
    return (
        f"checkpoint storage {store.url} does not honour put-if-absent (If-None-Match: *): a "
        f"second put-if-absent of _probe/if-none-match/<token> must be refused, but {what}. "
        "With such a store two writers can both win a checkpoint id, an ack "
        "or an outcome: checkpoints would hold duplicated or lost data, so no checkpoint is "
        "taken. Use a store that supports conditional writes (AWS S3, or MinIO with its read "
        "quorum available), or a file:// store"
    )


def masked(exc: pytest.ExceptionInfo[StoreNotConformant]) -> str:
    text = str(exc.value)
    start = text.index("_probe/if-none-match/") + len("_probe/if-none-match/")
    return text[:start] + "<token>" + text[start + 32 :]


def test_the_file_store_passes_once_and_leaves_only_the_marker(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)

    assert ensure_put_if_absent(store) is True
    assert list(store.list()) == [MARKER_KEY]
    # Once passed, this process does not ask the store again.
    gets, writes = store.gets, store.writes
    assert ensure_put_if_absent(store) is False
    assert (store.gets, store.writes) == (gets, writes)


def test_another_process_reads_the_marker_once_and_writes_nothing(tmp_path: Path) -> None:
    ensure_put_if_absent(CountingStore(tmp_path))
    forget_probes()  # as a new process sees it
    store = CountingStore(tmp_path)

    assert ensure_put_if_absent(store) is False
    assert (store.gets, store.writes) == (1, 0)


def test_a_store_that_ignores_the_condition_is_refused_and_not_marked(tmp_path: Path) -> None:
    store = CountingStore(tmp_path, ignore_condition=True)

    with pytest.raises(StoreNotConformant) as exc:
        ensure_put_if_absent(store)

    assert masked(exc) == refusal(store)
    assert list(store.list()) == []  # no marker, and the probe object is removed
    with pytest.raises(StoreNotConformant):  # not remembered: asked again, refused again
        ensure_put_if_absent(store)


def test_a_store_that_refuses_even_a_new_key_is_refused(tmp_path: Path) -> None:
    store = CountingStore(tmp_path, always_conflict=True)

    with pytest.raises(StoreNotConformant) as exc:
        ensure_put_if_absent(store)

    assert masked(exc) == refusal(store, "the first one, of a new key, answered CONFLICT")
    assert list(store.list()) == []


def test_a_trigger_on_such_a_store_is_refused_before_the_pipeline_writes(tmp_path: Path) -> None:
    store = CountingStore(tmp_path, ignore_condition=True)
    config = CheckpointConfig.from_mapping({"pipeline": "pipe", "storage": store.url})
    coordinator = CheckpointCoordinator(store, config)

    with pytest.raises(StoreNotConformant) as exc:
        coordinator.trigger(TASKS, {TP: 10}, lambda tps: dict.fromkeys(tps, 0))

    assert masked(exc) == refusal(store)
    assert list(store.list()) == []


def test_a_coordinator_reads_the_marker_at_most_once(tmp_path: Path) -> None:
    ensure_put_if_absent(CountingStore(tmp_path))
    forget_probes()  # a new process: the marker is stored, the cache is empty
    store = CountingStore(tmp_path)
    config = CheckpointConfig.from_mapping({"pipeline": "pipe", "storage": store.url})
    coordinator = CheckpointCoordinator(store, config)

    coordinator.trigger(TASKS, {TP: 10}, lambda tps: dict.fromkeys(tps, 0))
    forget_probes()  # even without the process cache, this coordinator does not ask again
    with pytest.raises(TriggerRefused):  # max concurrent 1; the probe step comes first
        coordinator.trigger(TASKS, {TP: 20})

    assert store.read_keys.count(MARKER_KEY) == 1
    assert [k for k in store.list() if k.startswith("_probe/")] == [MARKER_KEY]


def test_the_probe_folder_is_not_a_pipeline_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="store probe"):
        CheckpointConfig.from_mapping({"pipeline": "_probe", "storage": tmp_path.as_uri()})
