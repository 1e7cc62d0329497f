"""The deferrable trigger behind every sensor: polls one check in the triggerer.

While a sensor waits here it holds no worker slot. The check runs in a thread (it reads
checkpoint storage with blocking calls); the first answer other than WAIT ends the wait.
Storage options travel in the trigger's kwargs (Airflow stores them encrypted), because
connections are resolved by the sensor, in the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from airflow.triggers.base import (
    BaseTrigger,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)

from microcheckpoint_airflow.checks import (
    AlignmentProbe,
    CheckState,
    deadline_checker,
    run_check,
)

__all__ = ["CheckpointConditionTrigger", "CheckpointDeadlineTrigger"]

# Task states after which a task pushes no more XCom.
FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


# The deadline trigger's first poll delay; each next one is POLL_STEP_S longer, up to the
# trigger's poll interval: a short epoch is seen decided within about a quarter second (the
# DAG run ends with this task), a long one costs one poll per interval.
FIRST_POLL_S = 0.25
POLL_STEP_S = 0.05


def poll_delays(cap: float) -> Iterator[float]:
    """The delays between polls: ``FIRST_POLL_S``, growing by ``POLL_STEP_S`` up to ``cap``."""
    delay = min(FIRST_POLL_S, cap)
    while True:
        yield delay
        delay = min(cap, delay + POLL_STEP_S)


class CheckpointConditionTrigger(BaseTrigger):
    def __init__(
        self,
        kind: str,
        config: dict[str, Any],
        store_options: dict[str, Any],
        checkpoint_id: int | None = None,
        poll_interval: float = 2.0,
        stage: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.stage = stage
        self.kind = kind
        self.config = config
        self.store_options = store_options
        self.checkpoint_id = checkpoint_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "microcheckpoint_airflow.triggers.CheckpointConditionTrigger",
            {
                "kind": self.kind,
                "config": self.config,
                "store_options": self.store_options,
                "checkpoint_id": self.checkpoint_id,
                "poll_interval": self.poll_interval,
                "stage": self.stage,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The alignment check keeps its Kafka client and channel scans across polls.
        probe = AlignmentProbe(self.stage, self.store_options) if self.stage else None
        try:
            while True:
                check = await asyncio.to_thread(
                    run_check,
                    self.kind,
                    self.config,
                    self.store_options,
                    self.checkpoint_id,
                    probe,
                )
                if check.state is not CheckState.WAIT:
                    yield TriggerEvent(check.to_event())
                    return
                self.log.info("%s: %s", self.kind, check.message)
                await asyncio.sleep(self.poll_interval)
        finally:
            if probe is not None:
                await asyncio.to_thread(probe.close)


class CheckpointDeadlineTrigger(BaseTrigger):
    """The checkpoint timeout beside an epoch task; it ends its sensor's task itself.

    Steps: 1. resolve the storage options from connection ``storage_conn_id`` (here, in the
    triggerer: the kwargs come from the DAG and carry no secret); 2. wait for the id the
    task ``id_task`` pushes to XCom (key ``id_key``) once it placed the barrier; when that
    task ends without one, skip; 3. poll ``check_deadline`` until the checkpoint is
    decided, aborting it as EXPIRED at its deadline. Polls come quickly at first and slow
    down to one per ``poll_interval`` (``poll_delays``).

    Ends the task without a worker: success (completed in time), failure (expired: the
    message is logged), skipped (no checkpoint, or aborted for another reason).
    """

    def __init__(
        self,
        config: dict[str, Any],
        storage_conn_id: str,
        id_task: str,
        id_key: str = "return_value",
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__()
        self.config = config
        self.storage_conn_id = storage_conn_id
        self.id_task = id_task
        self.id_key = id_key
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "microcheckpoint_airflow.triggers.CheckpointDeadlineTrigger",
            {
                "config": self.config,
                "storage_conn_id": self.storage_conn_id,
                "id_task": self.id_task,
                "id_key": self.id_key,
                "poll_interval": self.poll_interval,
            },
        )

    def store_options(self) -> dict[str, Any]:
        from microcheckpoint_airflow.hooks import CheckpointStorageHook

        return CheckpointStorageHook(self.storage_conn_id).store_options(self.config["storage"])

    async def checkpoint_id(self) -> int | None:
        """The id ``id_task`` pushed (None: not yet)."""
        from airflow.sdk import BaseXCom

        ti = self.task_instance
        assert ti is not None
        value = await BaseXCom.aget_one(
            key=self.id_key, dag_id=ti.dag_id, task_id=self.id_task, run_id=ti.run_id, map_index=-1
        )
        return None if value in (None, "", "None") else int(value)

    async def id_task_state(self) -> str | None:
        """The state of ``id_task`` in this run (None: not known yet)."""
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        ti = self.task_instance
        assert ti is not None
        states = await asyncio.to_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=ti.dag_id,
            task_ids=[self.id_task],
            run_ids=[ti.run_id],
        )
        found = states.get(ti.run_id, {}).get(self.id_task)
        return None if found is None else str(found)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if self.task_instance is None:
            # ``dag.test()`` runs a trigger in line, without a task instance and after the
            # epoch task ended: the sensor looks once itself (``execute_complete``).
            yield TriggerEvent({"inline": True})
            return
        # Step 1
        options = await asyncio.to_thread(self.store_options)
        # Step 2: the XCom is asked for only once the task runs (Airflow logs each miss).
        cid = None
        delays = poll_delays(self.poll_interval)
        while cid is None:
            state = await self.id_task_state()
            if state == "running" or state in FINISHED:
                cid = await self.checkpoint_id()
            if cid is None and state in FINISHED:
                self.log.info("%s ended (%s) without a checkpoint", self.id_task, state)
                yield TaskSkippedEvent()
                return
            if cid is None:
                await asyncio.sleep(next(delays))
        # Step 3
        check_deadline = await asyncio.to_thread(deadline_checker, self.config, options)
        delays = poll_delays(self.poll_interval)
        while True:
            check = await asyncio.to_thread(check_deadline, cid)
            if check.state is CheckState.WAIT:
                await asyncio.sleep(next(delays))
                continue
            if check.state is CheckState.READY:
                self.log.info("%s", check.message)
                yield TaskSuccessEvent()
            elif check.state is CheckState.FAIL:
                self.log.error("%s", check.message)
                yield TaskFailedEvent()
            else:
                self.log.info("%s", check.message)
                yield TaskSkippedEvent()
            return
