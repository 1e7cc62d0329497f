"""Where protocol files live under a pipeline's storage root.

``<pipeline>/chk-<n>/`` holds one checkpoint:

- ``_pending``   trigger record (id, time, expected tasks, base, and barrier n: the offset
  range ``[start, end)`` of every source partition), written put-if-absent: allocates n
- ``_attempt-<k>`` one marker per processing attempt after the first (attempt 1 is
  implicit); acks of older attempts are discarded
- ``acks/<k>/<uid#subtask>.json`` one ack per task and attempt, written put-if-absent
- ``_declined-<k>`` the first task of attempt k that failed, and its cause (put-if-absent)
- ``_outcome``   COMPLETED or ABORTED (with the reason), written put-if-absent: one outcome only
- ``_metadata``  the completed checkpoint, written put-if-absent: the commit point (I2)
- ``_notified``  notify (group offsets, retention) finished
- anything else: state files written by tasks, named per attempt

``<pipeline>/_restore`` re-bases the pipeline on a savepoint or checkpoint;
``<pipeline>/_failures_reset`` records a person clearing the failure count;
``<pipeline>/_stopped`` deactivates triggering (stop with savepoint) until a restore;
``<pipeline>/savepoints/<name>/`` holds self-contained savepoints;
``<pipeline>/_events/restores/<at_ms>-<writer>`` one restore, rescale, fallback or cancel
each, written put-if-absent and never rewritten (``protocol.restores``).
"""

from __future__ import annotations

from microcheckpoint.ids import CheckpointId, TaskId

__all__ = ["Layout", "PROTOCOL_FILES"]

PENDING = "_pending"
OUTCOME = "_outcome"
METADATA = "_metadata"
NOTIFIED = "_notified"
ATTEMPT_PREFIX = "_attempt-"
DECLINED_PREFIX = "_declined-"
PROTOCOL_FILES = frozenset({PENDING, OUTCOME, METADATA, NOTIFIED})


class Layout:
    """Key names for one pipeline in one store."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.root = f"{pipeline}/"

    def chk(self, cid: CheckpointId) -> str:
        return f"{self.pipeline}/{cid.dirname}/"

    def pending(self, cid: CheckpointId) -> str:
        return self.chk(cid) + PENDING

    def outcome(self, cid: CheckpointId) -> str:
        return self.chk(cid) + OUTCOME

    def metadata(self, cid: CheckpointId) -> str:
        return self.chk(cid) + METADATA

    def notified(self, cid: CheckpointId) -> str:
        return self.chk(cid) + NOTIFIED

    def attempt(self, cid: CheckpointId, attempt: int) -> str:
        return self.chk(cid) + f"{ATTEMPT_PREFIX}{attempt:05d}"

    def declined(self, cid: CheckpointId, attempt: int) -> str:
        return self.chk(cid) + f"{DECLINED_PREFIX}{attempt:05d}"

    def acks(self, cid: CheckpointId, attempt: int) -> str:
        return self.chk(cid) + f"acks/{attempt:05d}/"

    def ack(self, cid: CheckpointId, attempt: int, task: TaskId) -> str:
        return self.acks(cid, attempt) + f"{task}.json"

    def sink_part(self, cid: CheckpointId, task: TaskId, attempt: int) -> str:
        """Where sink subtask ``task`` stages its output of one attempt (EXACTLY_ONCE)."""
        return self.chk(cid) + f"sink/{task.uid}/part-{task.subtask:05d}-a{attempt:05d}.jsonl"

    def state_prefix(self, cid: CheckpointId, attempt: int, task: TaskId) -> str:
        """Where a task writes state files for one attempt (unique per attempt)."""
        return self.chk(cid) + f"state/{task.uid}/{task.subtask:05d}-a{attempt:05d}/"

    @property
    def restore(self) -> str:
        return f"{self.pipeline}/_restore"

    @property
    def failures_reset(self) -> str:
        return f"{self.pipeline}/_failures_reset"

    @property
    def stopped(self) -> str:
        return f"{self.pipeline}/_stopped"

    @property
    def cancelled(self) -> str:
        return f"{self.pipeline}/_cancelled"

    @property
    def savepoints(self) -> str:
        return f"{self.pipeline}/savepoints/"

    @property
    def restore_events(self) -> str:
        """The folder of the pipeline's restore events (``records.RestoreEvent``)."""
        return f"{self.pipeline}/_events/restores/"

    def restore_event(self, at_ms: int, writer: str) -> str:
        """One event's key: the time first (13 digits), so keys sort by time."""
        return f"{self.restore_events}{at_ms:013d}-{writer}"
