"""The deferrable trigger behind every sensor: polls one check in the triggerer.

While a sensor waits here it holds no worker slot. The check runs in a thread (it reads
checkpoint storage with blocking calls); the first answer other than WAIT ends the wait.
Storage options travel in the trigger's kwargs (Airflow stores them encrypted), because
connections are resolved by the sensor, in the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from microcheckpoint_airflow.checks import AlignmentProbe, CheckState, run_check

__all__ = ["CheckpointConditionTrigger"]


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
