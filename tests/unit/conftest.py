"""Fixtures for the pure-core unit tests: a file store under tmp_path and a settable clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import Ack, CheckpointMetadata
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.probe import PROBE_PREFIX

PIPELINE = "pipe"
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)


class Harness:
    """One pipeline in one file store, with a clock the test moves by hand."""

    def __init__(self, root: Path) -> None:
        self.store = FileStore(root.as_uri())
        self.layout = Layout(PIPELINE)
        self.t = [1000.0]
        self.startup_calls: list[list[TopicPartition]] = []

    def config(self, **overrides: Any) -> CheckpointConfig:
        values = {"pipeline": PIPELINE, "storage": self.store.url, **overrides}
        return CheckpointConfig.from_mapping(values)

    def coordinator(self, **overrides: Any) -> CheckpointCoordinator:
        return CheckpointCoordinator(self.store, self.config(**overrides), clock=lambda: self.t[0])

    def startup(self, offsets: Mapping[TopicPartition, int]):
        """A startup-offsets callable that records which partitions it was asked for."""

        def lookup(partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
            asked = sorted(partitions)
            self.startup_calls.append(asked)
            return {tp: offsets[tp] for tp in asked}

        return lookup

    def write_state(
        self, cid: CheckpointId, task: TaskId, name: str, data: bytes, attempt: int = 1
    ) -> StateHandle:
        """Write a state file where a task of ``attempt`` would, and return its handle."""
        key = self.layout.state_prefix(cid, attempt, task) + name
        self.store.put(key, data)
        return StateHandle.of(key, data, (0,))

    def ack(
        self,
        coord: CheckpointCoordinator,
        cid: CheckpointId,
        task: TaskId,
        attempt: int = 1,
        handles: Iterable[StateHandle] = (),
        operator_state: Mapping[str, Any] | None = None,
    ) -> AckResult:
        ack = Ack(task, attempt, tuple(handles), dict(operator_state or {}), 5)
        return coord.acknowledge(cid, ack)

    def epoch(
        self,
        coord: CheckpointCoordinator,
        ends: Mapping[TopicPartition, int],
        files: Mapping[TaskId, Iterable[StateHandle] | None] | None = None,
        notify: bool = True,
    ) -> CheckpointMetadata:
        """Trigger, ack every task (writing one state file per task unless given), complete."""
        tasks = (SRC, AGG)
        pending = coord.trigger(tasks, ends, self.startup(dict.fromkeys(ends, 0)))
        cid = pending.checkpoint_id
        for task in tasks:
            given = (files or {}).get(task)
            if given is None:
                data = f"{task}@{cid}".encode()
                given = [self.write_state(cid, task, "state.bin", data)]
            assert self.ack(coord, cid, task, handles=given) is AckResult.SUCCESS
        meta = coord.complete(cid)
        if notify:
            coord.notify(cid)
        return meta

    def keys(self, prefix: str = "") -> list[str]:
        """Stored keys, without the store probe's marker (it belongs to the root, not the
        pipeline: ``storage.probe``)."""
        return [k for k in self.store.list(prefix) if not k.startswith(PROBE_PREFIX)]

    def contents(self, prefix: str = "") -> dict[str, bytes]:
        result = {}
        for key in self.keys(prefix):
            obj = self.store.get(key)
            assert obj is not None
            result[key] = obj.data
        return result

    def chk_keys(self, n: int) -> list[str]:
        """Keys under ``chk-<n>/`` relative to that folder."""
        base = self.layout.chk(CheckpointId(n))
        return [k[len(base) :] for k in self.store.list(base)]


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path / "store")
