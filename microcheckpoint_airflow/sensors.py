"""Sensors of the checkpoint protocol; deferrable by default (no worker slot while waiting).

Each sensor checks once in the worker; only when it has to wait does it defer to
``CheckpointConditionTrigger``, which polls the same check in the triggerer.

- ``MinPauseSensor``: ``min_pause`` since the last completed checkpoint.
- ``ConcurrencySensor``: fewer than ``max_concurrent`` checkpoints in flight.
- ``BaseStateSensor``: the checkpoint this epoch continues from has all its state.
- ``AwaitAcksSensor``: every task acked, within ``timeout`` of the trigger; past it the
  checkpoint is aborted as EXPIRED and the task fails.
- ``CheckpointTimeoutSensor``: beside the epoch task where a checkpoint spans several tasks,
  the checkpoint is decided by its deadline, or it is aborted as EXPIRED then (it starts
  and ends in the triggerer). The one-task epoch enforces its timeout itself.
- ``QuietSensor``: nothing in flight (savepoint with stop, restore).
- ``AlignmentSensor``: a stage's input channels have the upstream's next barrier markers
  (by mode: all of them, one, or ``aligned_timeout`` passed), so the trigger cuts at once.

A pipeline stopped with a savepoint makes the gate sensors skip the run; failures past
``tolerable_failures`` make them fail it with the reason and the way to resume.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.triggers.base import StartTriggerArgs

from microcheckpoint_airflow.checks import (
    AlignmentProbe,
    Check,
    CheckState,
    deadline_checker,
    run_check,
    wait_out_short_pause,
)
from microcheckpoint_airflow.hooks import CheckpointStorageHook, KafkaHook
from microcheckpoint_airflow.run_conf import refuse_unknown_conf
from microcheckpoint_airflow.spec import PipelineSpec
from microcheckpoint_airflow.triggers import CheckpointConditionTrigger, CheckpointDeadlineTrigger

__all__ = [
    "AlignmentSensor",
    "AwaitAcksSensor",
    "BaseStateSensor",
    "CheckpointSensor",
    "CheckpointTimeoutSensor",
    "ConcurrencySensor",
    "MinPauseSensor",
    "QuietSensor",
    "end_of_check",
]


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def end_of_check(task: Any, kind: str, check: Check) -> bool:
    """What a check means for ``task``: FAIL fails it (no retries), SKIP skips it, else
    log; True when READY."""
    if check.state is CheckState.FAIL:
        raise AirflowFailException(check.message)
    if check.state is CheckState.SKIP:
        raise AirflowSkipException(check.message)
    task.log.info("%s: %s", kind, check.message)
    return check.state is CheckState.READY


class CheckpointSensor(BaseSensorOperator):
    """Wait for one protocol condition (``kind``) of the pipeline ``spec``."""

    kind = ""
    template_fields = ("checkpoint_id", "when")
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        spec: PipelineSpec,
        checkpoint_id: str | int | None = None,
        when: str | bool = True,
        deferrable: bool = True,
        poke_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("mode", "reschedule" if not deferrable else "poke")
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.spec = spec
        self.checkpoint_id = checkpoint_id
        self.when = when
        self.deferrable = deferrable

    def _cid(self) -> int | None:
        if self.checkpoint_id in (None, "", "None"):
            return None
        return int(self.checkpoint_id)  # type: ignore[arg-type]

    def _options(self) -> dict[str, Any]:
        hook = CheckpointStorageHook(self.spec.storage_conn_id)
        return hook.store_options(self.spec.config.storage)

    def _stage(self) -> dict[str, Any] | None:
        """What the ``aligned`` check needs besides storage (JSON, for the trigger)."""
        return None

    def _check(self) -> Check:
        if not _truthy(self.when):
            return Check(CheckState.READY, "not needed for this run")
        stage = self._stage()
        probe = AlignmentProbe(stage, self._options()) if stage else None
        try:
            return run_check(
                self.kind, self.spec.config_mapping, self._options(), self._cid(), probe
            )
        finally:
            if probe is not None:
                probe.close()

    def _finish(self, check: Check) -> bool:
        return end_of_check(self, self.kind, check)

    def poke(self, context: Any) -> bool:
        return self._finish(self._check())

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        check = wait_out_short_pause(
            self._check, lambda text: self.log.info("%s: %s", self.kind, text)
        )
        if check.state is not CheckState.WAIT:
            self._finish(check)
            return None
        self.log.info("%s: %s; deferring", self.kind, check.message)
        self.defer(
            trigger=CheckpointConditionTrigger(
                self.kind,
                self.spec.config_mapping,
                self._options(),
                self._cid(),
                self.poke_interval,
                self._stage(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        if event is None:
            raise AirflowFailException(f"{self.kind}: the trigger ended without an answer")
        self._finish(Check.from_event(event))


class MinPauseSensor(CheckpointSensor):
    """The pipeline DAG's first task: it refuses a run's conf with a key first (the DAG
    declares no params), then waits for ``min_pause``."""

    kind = "min_pause"

    def execute(self, context: Any) -> Any:
        refuse_unknown_conf(context)
        return super().execute(context)


class ConcurrencySensor(CheckpointSensor):
    kind = "concurrency"


class BaseStateSensor(CheckpointSensor):
    kind = "base_state"


class AwaitAcksSensor(CheckpointSensor):
    kind = "acks"


class QuietSensor(CheckpointSensor):
    kind = "quiet"


class CheckpointTimeoutSensor(BaseSensorOperator):
    """Flink's checkpoint timeout, beside the epoch task (in parallel with it), where a
    checkpoint spans several tasks (a separate trigger task); the one-task epoch enforces its
    timeout itself (``protocol.deadline.DeadlineWatch``).

    It starts and ends in the triggerer (``CheckpointDeadlineTrigger``): no worker process
    per epoch. It waits for the checkpoint id that task ``id_task`` pushes to XCom (key
    ``id_key``) when it places the barrier, then until the checkpoint is decided; at its
    deadline (trigger time + ``timeout``) it aborts it as EXPIRED and fails, so acks that
    arrive later are discarded and the epoch task fails with ``checkpoint N ... expired``.
    Completed in time: success. No checkpoint, or aborted for another reason: skipped.

    ``timeout`` (seconds) bounds the whole wait, the epoch task's retries before its
    barrier included. Started in a worker instead (``airflow tasks test``), ``execute``
    defers to the same trigger.
    """

    start_trigger_args = StartTriggerArgs(
        trigger_cls="microcheckpoint_airflow.triggers.CheckpointDeadlineTrigger",
        trigger_kwargs={},
        next_method="execute_complete",
        next_kwargs=None,
        timeout=None,
    )
    start_from_trigger = True
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        spec: PipelineSpec,
        id_task: str,
        id_key: str = "return_value",
        poke_interval: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.spec = spec
        self.id_task = id_task
        self.id_key = id_key
        self.start_trigger_args = replace(
            self.start_trigger_args,
            trigger_kwargs=self.trigger_kwargs(),
            timeout=timedelta(seconds=self.timeout),
        )

    def trigger_kwargs(self) -> dict[str, Any]:
        return {
            "config": self.spec.config_mapping,
            "storage_conn_id": self.spec.storage_conn_id,
            "id_task": self.id_task,
            "id_key": self.id_key,
            "poll_interval": self.poke_interval,
        }

    def poke(self, context: Any) -> bool:
        raise NotImplementedError("CheckpointTimeoutSensor waits in the triggerer only")

    def check_once(self, context: Any) -> None:
        """Under ``dag.test()`` (tasks one after another, the epoch task already ended): the
        trigger's verdict from one look, as the trigger would end the task."""
        cid = context["ti"].xcom_pull(task_ids=self.id_task, key=self.id_key)
        if cid in (None, "", "None"):
            raise AirflowSkipException(f"{self.id_task} placed no checkpoint")
        storage = self.spec.config.storage
        options = CheckpointStorageHook(self.spec.storage_conn_id).store_options(storage)
        check = deadline_checker(self.spec.config_mapping, options)(cid)
        if check.state is CheckState.FAIL:
            raise AirflowFailException(check.message)
        if check.state is not CheckState.READY:
            raise AirflowSkipException(check.message)
        self.log.info("%s", check.message)

    def execute(self, context: Any) -> None:
        self.defer(
            trigger=CheckpointDeadlineTrigger(**self.trigger_kwargs()),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        if event and event.get("inline"):
            self.check_once(context)
            return
        # The trigger ends the task itself; only a timed-out wait comes back here.
        raise AirflowFailException(
            f"checkpoint_timeout: no answer within {self.timeout:g} s (event {event!r})"
        )


class AlignmentSensor(CheckpointSensor):
    """Before a stage triggers: wait, deferred, until its stage inputs can be cut without
    waiting (docs/stages.md). The wait's start goes to XCom (key ``aligned_since``); the
    trigger counts it toward ``aligned_timeout`` and the checkpoint timeout."""

    kind = "aligned"

    def _stage(self) -> dict[str, Any] | None:
        return {
            "pipeline": self.spec.pipeline,
            "pipeline_kwargs": self.spec.pipeline_kwargs,
            "bootstrap": KafkaHook(self.spec.kafka_conn_id).bootstrap_servers(),
            "since": self._since,
        }

    def execute(self, context: Any) -> Any:
        # The task's start (kept across a deferral and, in Airflow, across reschedules).
        started = getattr(context["ti"], "start_date", None)
        self._since = started.timestamp() if started is not None else time.time()
        context["ti"].xcom_push(key="aligned_since", value=self._since)
        return super().execute(context)
