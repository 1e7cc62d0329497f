"""Shared steps of the coordinator tests: a file store, a clock moved by hand, and helpers."""

from __future__ import annotations

import json

from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.view import CheckpointStatus

TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
SRC = TaskId.of("source", 0)
AGG = TaskId.of("agg", 0)
TASKS = (SRC, AGG)
C1, C2, C3, C4 = (CheckpointId(n) for n in (1, 2, 3, 4))


def read(h, key: str) -> dict:
    obj = h.store.get(key)
    assert obj is not None, key
    return json.loads(obj.data)


def barrier_json(h, cid: CheckpointId) -> dict:
    """Barrier n as stored (it lives in ``_pending``; read through the coordinator)."""
    return h.coordinator().barrier(cid).to_json()


def status(coord: CheckpointCoordinator, cid: CheckpointId) -> CheckpointStatus:
    return coord.view().records[cid].status


def ack_all(h, coord, cid, attempt: int = 1, tasks=TASKS) -> None:
    for task in tasks:
        handle = h.write_state(cid, task, "s.bin", f"{task}/{attempt}".encode(), attempt)
        assert h.ack(coord, cid, task, attempt, [handle]) is AckResult.SUCCESS


def start(h, coord, ends, **offsets):
    """Trigger with every partition starting at 0 unless given."""
    return coord.trigger(TASKS, ends, h.startup({tp: offsets.get(str(tp), 0) for tp in ends}))


def expire_one(h, coord, ends) -> CheckpointId:
    cid = coord.trigger(TASKS, ends, h.startup(dict.fromkeys(ends, 0))).checkpoint_id
    h.t[0] += 601.0
    assert coord.abort_expired() == [cid]
    return cid


def complete_one(h, coord, ends) -> CheckpointId:
    cid = coord.trigger(TASKS, ends, h.startup(dict.fromkeys(ends, 0))).checkpoint_id
    ack_all(h, coord, cid)
    coord.complete(cid)
    return cid
