"""The operators' ``execute`` over ``file://`` checkpoint storage: no Airflow database, no
scheduler, no Kafka, no Spark.

Operators build their own coordinator with the real clock, so a checkpoint that must look
old is triggered through a setup coordinator whose clock runs an hour behind. Templated
fields are given as the strings Jinja renders (``"False"``, ``"3"``, ``"None"``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from microcheckpoint.engine.api import KafkaSource, Pipeline, running_sum
from microcheckpoint.engine.runner import expected_tasks
from microcheckpoint.errors import (
    AcksMissing,
    CheckpointNotFound,
    ConfigError,
    IncompatibleCheckpoint,
    TooManyFailures,
)
from microcheckpoint.ids import CheckpointId, TaskId, TopicPartition
from microcheckpoint.protocol import recovery
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.decider import Verdict
from microcheckpoint.protocol.history import checkpoint_history
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.pending import AckResult
from microcheckpoint.protocol.records import AbortReason, Ack, decode_metadata
from microcheckpoint.protocol.savepoints import create_savepoint
from microcheckpoint.protocol.view import CheckpointStatus
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.storage.file import FileStore
from microcheckpoint_airflow import checks, operators
from microcheckpoint_airflow.operators import (
    AbortCheckpointOperator,
    CompleteCheckpointOperator,
    RestoreOperator,
    ResumeTriggeringOperator,
    RetentionOperator,
    SavepointOperator,
    SetPausedOperator,
    SuspendPipelineOperator,
    ValidateRestoreOperator,
    ValidateSavepointOperator,
    failed_run_detail,
)
from microcheckpoint_airflow.spec import PipelineSpec
from tests.stored import read_json

PIPELINE = Pipeline("pipe", KafkaSource("src", ["events"], value_format="text")).then(
    running_sum("counts", key="value")
)
PIPELINE_REF = "tests.unit.plugin.test_operators:PIPELINE"
TASKS = expected_tasks(PIPELINE, 2)  # src#0, counts#0, counts#1
GONE = TaskId.of("gone", 0)  # an operator the pipeline no longer has
TP0 = TopicPartition("events", 0)
TP1 = TopicPartition("events", 1)
C1, C2, C3 = CheckpointId(1), CheckpointId(2), CheckpointId(3)
LAYOUT = Layout("pipe")
# What a task's execute reads of Airflow's context (the run's conf is checked by the e2e test).
CONTEXT = {
    "run_id": "manual__x",
    "dag": SimpleNamespace(dag_id="pipe_pipeline", params={}),
    "task": SimpleNamespace(params={}),
    "dag_run": SimpleNamespace(conf={}),
}
HOUR = 3600.0
API_ENV = "AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API"


class Env:
    """Checkpoint storage under ``tmp_path``, a second savepoint root, and setup steps."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.store = FileStore((tmp_path / "checkpoints").as_uri())
        self.url = self.store.url
        self.exports = tmp_path / "exports"
        self.exports_url = self.exports.as_uri()

    def spec(self, savepoint_roots: tuple[str, ...] = (), **checkpointing: Any) -> PipelineSpec:
        return PipelineSpec(
            name="pipe",
            pipeline=PIPELINE_REF,
            checkpointing={"storage": self.url, **checkpointing},
            savepoint_roots=savepoint_roots,
        )

    def coordinator(self, spec: PipelineSpec, age_s: float = 0.0) -> CheckpointCoordinator:
        """A setup coordinator whose clock runs ``age_s`` seconds behind the real one."""
        return CheckpointCoordinator(self.store, spec.config, clock=lambda: time.time() - age_s)

    def trigger(
        self, coord: CheckpointCoordinator, ends: dict[TopicPartition, int], tasks=TASKS
    ) -> CheckpointId:
        startup = lambda tps: dict.fromkeys(tps, 0)  # noqa: E731
        return coord.trigger(tasks, ends, startup).checkpoint_id

    def ack(self, coord: CheckpointCoordinator, cid: CheckpointId, *tasks: TaskId) -> None:
        """Ack ``tasks`` (attempt 1), each with one state file."""
        for task in tasks:
            key = LAYOUT.state_prefix(cid, 1, task) + "state.bin"
            data = f"{task}@{cid}".encode()
            self.store.put(key, data)
            ack = Ack(task, 1, (StateHandle(key, len(data), (0,)),), {}, 5)
            assert coord.acknowledge(cid, ack) is AckResult.SUCCESS

    def epoch(
        self, coord: CheckpointCoordinator, ends: dict[TopicPartition, int], tasks=TASKS
    ) -> CheckpointId:
        """Trigger, ack every task, complete (no notify, so no retention runs)."""
        cid = self.trigger(coord, ends, tasks)
        self.ack(coord, cid, *tasks)
        coord.complete(cid)
        return cid

    def contents(self, root: Path | None = None) -> dict[str, bytes]:
        """Every key and its bytes (the full listing, to prove nothing changed)."""
        store = self.store if root is None else FileStore(root.as_uri())
        return {key: store.get(key).data for key in store.list("")}  # type: ignore[union-attr]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def record(env: Env, cid: CheckpointId):
    return CheckpointCoordinator(env.store, env.spec().config).view().records[cid]


def outcome(env: Env, cid: CheckpointId) -> dict[str, Any] | None:
    return read_json(env.store, LAYOUT.outcome(cid))


# ---- AbortCheckpointOperator ---------------------------------------------------------------


def test_abort_expires_a_pending_checkpoint_past_its_timeout(env: Env) -> None:
    spec = env.spec(timeout=60, tolerable_failures=5)
    cid = env.trigger(env.coordinator(spec, age_s=HOUR), {TP0: 10})
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="1")
    assert op.execute(CONTEXT) is None
    assert record(env, cid).status is CheckpointStatus.ABORTED
    assert record(env, cid).abort_reason is AbortReason.EXPIRED
    assert outcome(env, cid)["detail"] == "timeout 60.0s"  # type: ignore[index]


def test_abort_declines_a_pending_checkpoint_within_its_timeout(env: Env) -> None:
    spec = env.spec(timeout=600, tolerable_failures=5)
    cid = env.trigger(env.coordinator(spec), {TP0: 10})
    env.ack(env.coordinator(spec), cid, TASKS[0])
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="1")
    assert op.execute(CONTEXT) is None
    assert record(env, cid).abort_reason is AbortReason.DECLINED
    assert outcome(env, cid)["detail"] == "a task of Airflow run manual__x failed"  # type: ignore[index]
    # A failed checkpoint's acks and state files are cleaned up at once.
    assert sorted(env.store.list(LAYOUT.chk(cid))) == [LAYOUT.outcome(cid), LAYOUT.pending(cid)]


@pytest.mark.parametrize("checkpoint_id", ["None", "", None])
def test_abort_without_a_checkpoint_id_aborts_nothing(env: Env, checkpoint_id) -> None:
    """The trigger task never ran (its XCom renders as "None"): nothing is declined."""
    spec = env.spec(timeout=600)
    cid = env.trigger(env.coordinator(spec), {TP0: 10})
    before = env.contents()
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id=checkpoint_id)
    assert op.execute(CONTEXT) is None
    assert env.contents() == before
    assert record(env, cid).status is CheckpointStatus.PENDING


def test_abort_without_a_checkpoint_id_still_expires_old_checkpoints(env: Env) -> None:
    spec = env.spec(timeout=60, tolerable_failures=5)
    cid = env.trigger(env.coordinator(spec, age_s=HOUR), {TP0: 10})
    AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="None").execute(CONTEXT)
    assert record(env, cid).abort_reason is AbortReason.EXPIRED


def test_abort_leaves_a_completed_checkpoint_alone(env: Env) -> None:
    spec = env.spec()
    cid = env.epoch(env.coordinator(spec), {TP0: 10})
    before = env.contents()
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="1")
    assert op.execute(CONTEXT) is None
    assert env.contents() == before
    assert record(env, cid).status is CheckpointStatus.COMPLETED


def test_abort_within_tolerable_failures_returns(env: Env) -> None:
    spec = env.spec(tolerable_failures=1)
    env.trigger(env.coordinator(spec), {TP0: 10})
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="1")
    assert op.execute(CONTEXT) is None
    assert env.coordinator(spec).consecutive_failures() == 1


def test_abort_beyond_tolerable_failures_fails_naming_the_restore_dag(env: Env) -> None:
    spec = env.spec(tolerable_failures=1)
    coord = env.coordinator(spec)
    env.trigger(coord, {TP0: 10})
    AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="1").execute(CONTEXT)
    env.trigger(coord, {TP0: 10})
    op = AbortCheckpointOperator(task_id="abort", spec=spec, checkpoint_id="2")
    with pytest.raises(AirflowFailException) as caught:
        op.execute(CONTEXT)
    assert str(caught.value) == (
        "pipeline 'pipe': 2 consecutive checkpoint failures exceed tolerable_failures=1; "
        "triggering is stopped. Fix the cause, then reset the failure count (reset_failures) "
        "to resume. To resume, trigger DAG pipe_restore (point 'latest')"
    )
    assert isinstance(caught.value.__cause__, TooManyFailures)
    # The abort itself happened before the failure was raised.
    assert record(env, C2).abort_reason is AbortReason.DECLINED
    assert coord.trigger_decision().verdict is Verdict.STOPPED


# ---- CompleteCheckpointOperator ------------------------------------------------------------


def complete_op(spec: PipelineSpec, checkpoint_id: str = "1") -> CompleteCheckpointOperator:
    return CompleteCheckpointOperator(task_id="complete", spec=spec, checkpoint_id=checkpoint_id)


def test_complete_writes_metadata_and_returns_the_summary(env: Env) -> None:
    spec = env.spec(timeout=600)
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10, TP1: 5})
    env.ack(coord, cid, *TASKS)
    result = complete_op(spec).execute(CONTEXT)
    assert env.store.exists("pipe/chk-0000000001/_metadata")
    meta = coord.view().metadata(cid)
    assert meta.duration_ms >= 0
    assert result == {
        "checkpoint": 1,
        "attempt": 1,  # the trigger's: nothing began another, and these acks are its
        "duration_ms": meta.duration_ms,
        "records": 15,
        "offsets": {"events:0": 10, "events:1": 5},
    }
    # A retry (the same instance, or a new process) returns the same checkpoint.
    assert complete_op(spec).execute(CONTEXT) == result
    assert complete_op(spec).execute(CONTEXT) == result
    assert record(env, cid).status is CheckpointStatus.COMPLETED


def test_complete_past_the_timeout_expires_the_checkpoint(env: Env) -> None:
    spec = env.spec(timeout=60)
    coord = env.coordinator(spec, age_s=HOUR)
    cid = env.trigger(coord, {TP0: 10})
    env.ack(coord, cid, *TASKS)
    with pytest.raises(AirflowFailException) as caught:
        complete_op(spec).execute(CONTEXT)
    assert str(caught.value) == (
        "checkpoint 1 of 'pipe' expired: not complete within timeout=60.0s of its trigger "
        "(aborted as EXPIRED; the next epoch re-reads its range)"
    )
    assert record(env, cid).status is CheckpointStatus.ABORTED
    assert record(env, cid).abort_reason is AbortReason.EXPIRED
    assert not env.store.exists(LAYOUT.metadata(cid))


def test_complete_with_missing_acks_raises_acks_missing(env: Env) -> None:
    """AcksMissing is not an AirflowFailException: Airflow retries the task (if it has
    retries), which suits acks that are still on their way."""
    spec = env.spec(timeout=600)
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10})
    env.ack(coord, cid, TASKS[0], TASKS[1])
    with pytest.raises(AcksMissing) as caught:
        complete_op(spec).execute(CONTEXT)
    assert type(caught.value) is AcksMissing
    assert str(caught.value) == "checkpoint 1 is waiting for 1 task(s): counts#1"
    assert record(env, cid).status is CheckpointStatus.PENDING
    assert not env.store.exists(LAYOUT.outcome(cid))


def test_complete_of_a_declined_checkpoint_fails(env: Env) -> None:
    spec = env.spec(timeout=600, tolerable_failures=5)
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10})
    env.ack(coord, cid, *TASKS)
    coord.abort_declined(cid, "a task failed")
    with pytest.raises(AirflowFailException) as caught:
        complete_op(spec).execute(CONTEXT)
    assert str(caught.value) == "checkpoint 1 is ABORTED, it cannot complete"
    assert not env.store.exists(LAYOUT.metadata(cid))


def test_complete_retry_finishes_a_claimed_completion(env: Env) -> None:
    spec = env.spec(timeout=600)
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10})
    env.ack(coord, cid, *TASKS)
    # The first try claimed the outcome (step 2 of complete), then its worker died.
    claim = b'{"at_ms": 1, "attempt": 1, "outcome": "COMPLETED", "writer": "dead"}'
    env.store.put(LAYOUT.outcome(cid), claim)
    assert record(env, cid).status is CheckpointStatus.COMPLETING
    result = complete_op(spec).execute(CONTEXT)
    assert result["checkpoint"] == 1
    assert result["offsets"] == {"events:0": 10}
    assert record(env, cid).status is CheckpointStatus.COMPLETED


def test_complete_of_an_unknown_checkpoint_fails_cleanly(env: Env) -> None:
    spec = env.spec()
    env.epoch(env.coordinator(spec), {TP0: 10})
    with pytest.raises((AirflowFailException, CheckpointNotFound)) as caught:
        complete_op(spec, checkpoint_id="7").execute(CONTEXT)
    assert "checkpoint 7 of 'pipe'" in str(caught.value)


# ---- SuspendPipelineOperator and RetentionOperator -----------------------------------------


@pytest.mark.parametrize("when", ["False", "false", "0", "no", ""])
def test_suspend_when_false_does_nothing(env: Env, when: str) -> None:
    spec = env.spec()
    before = env.contents()
    op = SuspendPipelineOperator(task_id="suspend", spec=spec, when=when, reason="upgrade")
    assert op.execute(CONTEXT) is False
    assert env.contents() == before
    assert not env.store.exists(LAYOUT.stopped)


def test_suspend_when_true_writes_the_stop_marker_with_the_reason(env: Env) -> None:
    spec = env.spec()
    op = SuspendPipelineOperator(task_id="suspend", spec=spec, when="True", reason="upgrade")
    start_ms = int(time.time() * 1000)
    assert op.execute(CONTEXT) is True
    marker = read_json(env.store, LAYOUT.stopped)
    assert marker is not None
    assert set(marker) == {"reason", "at_ms", "version"}
    assert marker["reason"] == "upgrade"
    assert start_ms <= marker["at_ms"] <= int(time.time() * 1000)
    decision = env.coordinator(spec).trigger_decision()
    assert decision.verdict is Verdict.SUSPENDED
    assert decision.reason == "stopped: upgrade; restore to resume"


def test_suspend_without_a_reason_names_the_run(env: Env) -> None:
    op = SuspendPipelineOperator(task_id="suspend", spec=env.spec(), when="true")
    assert op.execute(CONTEXT) is True
    assert read_json(env.store, LAYOUT.stopped)["reason"] == "requested by manual__x"  # type: ignore[index]


def test_retention_keeps_the_newest_retained_checkpoints(env: Env) -> None:
    spec = env.spec(retained=2)
    coord = env.coordinator(spec)
    for end in (10, 20, 30):
        env.epoch(coord, {TP0: end})
    assert coord.view().completed == [C1, C2, C3]
    assert RetentionOperator(task_id="retention", spec=spec).execute(CONTEXT) == [2, 3]
    assert coord.view().completed == [C2, C3]
    assert list(env.store.list(LAYOUT.chk(C1))) == []
    # Idempotent.
    assert RetentionOperator(task_id="retention", spec=spec).execute(CONTEXT) == [2, 3]


# ---- SavepointOperator ---------------------------------------------------------------------


def savepoint_op(spec: PipelineSpec, target: str) -> SavepointOperator:
    return SavepointOperator(task_id="savepoint", spec=spec, target=target)


def two_epochs(env: Env, spec: PipelineSpec) -> CheckpointCoordinator:
    coord = env.coordinator(spec)
    env.epoch(coord, {TP0: 10, TP1: 5})
    env.epoch(coord, {TP0: 20, TP1: 7})
    return coord


def assert_savepoint(store: FileStore, url: str, checkpoint: int) -> None:
    key = url[len(store.url) + 1 :] + "/_metadata"
    stored = store.get(key)
    assert stored is not None, f"no {key} in {store.url}"
    meta = decode_metadata(stored.data, url)
    assert (meta.kind, meta.checkpoint_id.value, meta.relative) == ("savepoint", checkpoint, True)


@pytest.mark.parametrize("target", ["", "  "])
def test_savepoint_default_target_is_the_pipelines_savepoints_folder(env: Env, target) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    url = savepoint_op(spec, target).execute(CONTEXT)
    assert re.fullmatch(
        re.escape(env.url) + r"/pipe/savepoints/savepoint-0000000002-[0-9a-f]{6}", url
    )
    assert_savepoint(env.store, url, 2)


def test_savepoint_under_a_savepoint_root(env: Env) -> None:
    spec = env.spec(savepoint_roots=(env.exports_url,), retained=2)
    two_epochs(env, spec)
    before = env.contents()
    url = savepoint_op(spec, f"{env.exports_url}/keep").execute(CONTEXT)
    assert re.fullmatch(re.escape(env.exports_url) + r"/keep/savepoint-0000000002-[0-9a-f]{6}", url)
    assert (env.exports / url[len(env.exports_url) + 1 :] / "_metadata").is_file()
    assert_savepoint(FileStore(env.exports_url), url, 2)
    assert env.contents() == before  # the checkpoint storage is only read


def test_savepoint_under_a_folder_of_the_checkpoint_storage(env: Env) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    url = savepoint_op(spec, f"{env.url}/exports/").execute(CONTEXT)
    assert re.fullmatch(re.escape(env.url) + r"/exports/savepoint-0000000002-[0-9a-f]{6}", url)
    assert_savepoint(env.store, url, 2)


def test_savepoint_outside_every_root_is_refused_and_changes_nothing(env: Env) -> None:
    spec = env.spec(savepoint_roots=(env.exports_url,))
    two_epochs(env, spec)
    before = env.contents()
    elsewhere = env.tmp_path / "elsewhere"
    target = f"{elsewhere.as_uri()}/sp"
    with pytest.raises(AirflowFailException) as caught:
        savepoint_op(spec, target).execute(CONTEXT)
    assert str(caught.value) == (
        f"config field 'target' = {target!r} is invalid: a location under one of the "
        f"configured roots ({env.url}, {env.exports_url}); add its root to savepoint_roots "
        "(Airflow) or --savepoint-root (CLI) to allow it"
    )
    assert isinstance(caught.value.__cause__, ConfigError)
    assert env.contents() == before
    assert not elsewhere.exists()
    assert not env.exports.exists()


def test_savepoint_target_climbing_out_of_its_root_is_refused(env: Env) -> None:
    spec = env.spec()
    two_epochs(env, spec)
    before = env.contents()
    with pytest.raises(AirflowFailException, match=r"a path without empty, '\.' or '\.\.'"):
        savepoint_op(spec, f"{env.url}/../escape").execute(CONTEXT)
    assert env.contents() == before


def test_savepoint_without_a_completed_checkpoint_fails(env: Env) -> None:
    spec = env.spec()
    env.trigger(env.coordinator(spec), {TP0: 10})  # pending only
    before = env.contents()
    with pytest.raises(AirflowFailException) as caught:
        savepoint_op(spec, "").execute(CONTEXT)
    # (The doubled space is the message's: ``{cid or ''}`` with no id.)
    assert str(caught.value) == (
        "pipeline 'pipe' has no completed checkpoint to take a savepoint from "
        "(completed: []); run a checkpoint first"
    )
    assert isinstance(caught.value.__cause__, CheckpointNotFound)
    assert env.contents() == before


# ---- ValidateRestoreOperator and RestoreOperator -------------------------------------------


def restore_args(**overrides: Any) -> dict[str, Any]:
    """Templated fields as Jinja renders them from the restore DAG's Params."""
    return {
        "point": "latest",
        "claim_mode": "NO_CLAIM",
        "allow_non_restored_state": "False",
        "parallelism": "3",
        **overrides,
    }


def validate_op(spec: PipelineSpec, **overrides: Any) -> ValidateRestoreOperator:
    return ValidateRestoreOperator(task_id="validate", spec=spec, **restore_args(**overrides))


def restore_op(spec: PipelineSpec, **overrides: Any) -> RestoreOperator:
    return RestoreOperator(task_id="restore", spec=spec, **restore_args(**overrides))


def test_validate_returns_what_will_be_restored_and_changes_nothing(env: Env) -> None:
    spec = env.spec(retained=2, max_parallelism=8)
    two_epochs(env, spec)
    before = env.contents()
    assert validate_op(spec).execute(CONTEXT) == {
        "location": f"{env.url}/pipe/chk-0000000002",
        "checkpoint": 2,
        "kind": "checkpoint",
        "claim_mode": "NO_CLAIM",
        "parallelism": 3,
        "dropped_state": [],
        "offsets": {"events:0": 20, "events:1": 7},
    }
    assert env.contents() == before


def test_validate_an_older_checkpoint_in_claim_mode(env: Env) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    result = validate_op(spec, point="chk-1", claim_mode="claim").execute(CONTEXT)
    assert (result["checkpoint"], result["claim_mode"]) == (1, "CLAIM")
    assert result["offsets"] == {"events:0": 10, "events:1": 5}


@pytest.mark.parametrize("parallelism", ["", "None", None])
def test_validate_without_a_parallelism_keeps_the_dags(env: Env, parallelism) -> None:
    spec = env.spec()
    two_epochs(env, spec)
    assert validate_op(spec, parallelism=parallelism).execute(CONTEXT)["parallelism"] == 2


@pytest.mark.parametrize("operator", [validate_op, restore_op])
@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        (
            "0",
            "config field 'parallelism' = 0 is invalid: an integer in 1..8 (the pipeline's max_parallelism)",
        ),
        (
            "-1",
            "config field 'parallelism' = -1 is invalid: an integer in 1..8 (the pipeline's max_parallelism)",
        ),
        (
            "9",
            "config field 'parallelism' = 9 is invalid: an integer in 1..8 (the pipeline's max_parallelism)",
        ),
        (
            "x",
            "config field 'parallelism' = 'x' is invalid: an integer in 1..8 (the pipeline's max_parallelism)",
        ),
        (
            "2.5",
            "config field 'parallelism' = '2.5' is invalid: an integer in 1..8 (the pipeline's max_parallelism)",
        ),
    ],
)
def test_a_bad_parallelism_fails_cleanly_and_changes_nothing(
    env: Env, operator, parallelism: str, message: str
) -> None:
    spec = env.spec(max_parallelism=8)
    two_epochs(env, spec)
    before = env.contents()
    with pytest.raises(AirflowFailException) as caught:
        operator(spec, parallelism=parallelism).execute(CONTEXT)
    assert str(caught.value) == message
    assert isinstance(caught.value.__cause__, ConfigError)
    assert env.contents() == before


@pytest.mark.parametrize("operator", [validate_op, restore_op])
def test_an_unknown_claim_mode_fails_cleanly(env: Env, operator) -> None:
    spec = env.spec()
    two_epochs(env, spec)
    before = env.contents()
    with pytest.raises(AirflowFailException) as caught:
        operator(spec, claim_mode="MAYBE").execute(CONTEXT)
    assert str(caught.value) == (
        "config field 'claim_mode' = 'MAYBE' is invalid: NO_CLAIM or CLAIM"
    )
    assert env.contents() == before


def test_validate_a_point_that_is_not_there(env: Env) -> None:
    spec = env.spec()
    with pytest.raises(AirflowFailException) as caught:
        validate_op(spec).execute(CONTEXT)
    assert str(caught.value) == (
        "pipeline 'pipe' has no completed checkpoint to restore; give a savepoint URL"
    )


@pytest.fixture
def stale_savepoint(env: Env) -> str:
    """A savepoint of ``pipe`` holding state of operator ``gone`` as well."""
    spec = env.spec()
    env.epoch(env.coordinator(spec), {TP0: 10}, tasks=[*TASKS, GONE])
    return create_savepoint(env.store, "pipe")


@pytest.mark.parametrize("operator", [validate_op, restore_op])
def test_state_of_a_removed_operator_is_refused(env: Env, stale_savepoint: str, operator) -> None:
    spec = env.spec()
    before = env.contents()
    with pytest.raises(AirflowFailException) as caught:
        operator(spec, point=stale_savepoint).execute(CONTEXT)
    assert str(caught.value) == (
        f"{stale_savepoint} holds state of operator(s) gone that pipeline 'pipe' no longer has "
        "(its uids: counts, src); restore with allow_non_restored_state to drop that state, "
        "or restore the operators"
    )
    assert isinstance(caught.value.__cause__, IncompatibleCheckpoint)
    assert env.contents() == before


def test_state_of_a_removed_operator_is_dropped_when_allowed(env: Env, stale_savepoint) -> None:
    spec = env.spec()
    before = env.contents()
    op = validate_op(spec, point=stale_savepoint, allow_non_restored_state="True")
    result = op.execute(CONTEXT)
    assert (result["location"], result["kind"], result["checkpoint"]) == (
        stale_savepoint,
        "savepoint",
        1,
    )
    assert result["dropped_state"] == ["gone"]
    assert env.contents() == before

    op = restore_op(spec, point=stale_savepoint, allow_non_restored_state="True")
    assert op.execute(CONTEXT)["source"] == stale_savepoint
    assert read_json(env.store, LAYOUT.restore)["kind"] == "savepoint"  # type: ignore[index]


def test_restore_rebases_resets_failures_and_resumes(env: Env) -> None:
    spec = env.spec(tolerable_failures=1)
    coord = env.coordinator(spec)
    env.epoch(coord, {TP0: 10, TP1: 5})
    for _ in range(2):
        coord.abort_declined(env.trigger(coord, {TP0: 20, TP1: 7}), "a task failed")
    coord.suspend("savepoint taken")
    assert coord.consecutive_failures() == 2
    assert recovery.parallelism(coord.view(), spec.parallelism) == 2

    result = restore_op(spec, parallelism="3").execute(CONTEXT)

    assert result == {
        "source": f"{env.url}/pipe/chk-0000000001",
        "offsets": {"events:0": 10, "events:1": 5},
        "parallelism": 3,
    }
    marker = read_json(env.store, LAYOUT.restore)
    assert marker is not None
    assert {k: marker[k] for k in ("parallelism", "after_id", "pipeline_checkpoint")} == {
        "parallelism": 3,
        "after_id": 3,
        "pipeline_checkpoint": 1,
    }
    assert (marker["claim_mode"], marker["first_snapshot_full"]) == ("NO_CLAIM", True)
    assert coord.consecutive_failures() == 0
    assert coord.suspended() is None
    assert not env.store.exists(LAYOUT.stopped)
    assert coord.trigger_decision().verdict is Verdict.TRIGGER
    assert recovery.parallelism(coord.view(), spec.parallelism) == 3
    # The next epoch starts from the restored offsets.
    start = coord.start_point(coord.view())
    assert (start.offsets, start.base) == ({TP0: 10, TP1: 5}, None)


def test_a_refused_restore_keeps_the_failures_and_the_stop(env: Env) -> None:
    spec = env.spec(tolerable_failures=0)
    coord = env.coordinator(spec)
    env.epoch(coord, {TP0: 10})
    coord.abort_declined(env.trigger(coord, {TP0: 20}), "a task failed")
    coord.suspend("savepoint taken")
    before = env.contents()
    with pytest.raises(AirflowFailException):
        restore_op(spec, point="chk-2").execute(CONTEXT)
    assert env.contents() == before
    assert coord.consecutive_failures() == 1
    assert coord.suspended() is not None


# ---- SetPausedOperator ---------------------------------------------------------------------


def test_set_paused_when_false_touches_no_connection(env: Env, monkeypatch) -> None:
    def no_hook(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("AirflowApiHook was opened")

    monkeypatch.setattr(operators, "AirflowApiHook", no_hook)
    op = SetPausedOperator(task_id="unpause", spec=env.spec(), paused=False, when="False")
    assert op.execute(CONTEXT) is None


def test_set_paused_calls_the_api_for_the_pipeline_dag(env: Env, monkeypatch) -> None:
    calls: list[tuple[str, Any]] = []

    class FakeHook:
        def __init__(self, conn_id: str) -> None:
            calls.append(("conn", conn_id))

        def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
            calls.append(("set_paused", (dag_id, paused)))
            return {"dag_id": dag_id, "is_paused": paused}

    monkeypatch.setattr(operators, "AirflowApiHook", FakeHook)
    op = SetPausedOperator(task_id="pause", spec=env.spec(), paused=True, when="True")
    assert op.execute(CONTEXT) is True
    assert calls == [
        ("conn", "microcheckpoint_airflow_api"),
        ("set_paused", ("pipe_pipeline", True)),
    ]


def test_set_paused_without_an_api_connection_fails_naming_it(env: Env, monkeypatch) -> None:
    monkeypatch.delenv(API_ENV, raising=False)
    op = SetPausedOperator(task_id="pause", spec=env.spec(), paused=True, when="True")
    with pytest.raises(AirflowFailException) as caught:
        op.execute(CONTEXT)
    assert str(caught.value) == (
        "config field 'api_conn_id' = 'microcheckpoint_airflow_api' is invalid: a "
        "connection to Airflow's API server (host, port, login, password) so the savepoint "
        "and restore DAGs can pause and unpause the pipeline DAG"
    )
    assert isinstance(caught.value.__cause__, ConfigError)


# ---- the new-user defects: validate first, resume on failure, unknown form fields ---------


def form_context(conf: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    dag = SimpleNamespace(dag_id="pipe_savepoint", params=params)
    return {**CONTEXT, "dag": dag, "dag_run": SimpleNamespace(conf=conf)}


@pytest.mark.parametrize("target", [None, "None", ""])
def test_an_empty_target_means_the_default_folder(env: Env, target) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    form = {"target": target, "stop": True}
    checked = ValidateSavepointOperator(task_id="v", spec=spec, target=target)
    assert checked.execute(form_context(form, form))["latest_completed"] == 2
    url = SavepointOperator(task_id="s", spec=spec, target=target).execute(CONTEXT)
    assert url.startswith(f"{env.url}/pipe/savepoints/savepoint-0000000002-")


def test_a_bad_savepoint_target_fails_before_anything_stops(env: Env) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    before = env.contents()
    target = f"{(env.tmp_path / 'elsewhere').as_uri()}/sp"
    form = {"target": target, "stop": True}
    with pytest.raises(AirflowFailException, match="a location under one of the configured"):
        ValidateSavepointOperator(task_id="v", spec=spec, target=target).execute(
            form_context(form, form)
        )
    assert env.contents() == before  # not stopped: no stop marker was written
    assert env.coordinator(spec).suspended() is None


def test_a_savepoint_without_any_checkpoint_fails_validation(env: Env) -> None:
    spec = env.spec()
    form = {"target": None, "stop": False}
    with pytest.raises(AirflowFailException, match="has no completed checkpoint"):
        ValidateSavepointOperator(task_id="v", spec=spec).execute(form_context(form, form))


def test_a_failed_stop_with_savepoint_leaves_the_pipeline_running(env: Env) -> None:
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    SuspendPipelineOperator(task_id="stop", spec=spec, reason="stop with savepoint").execute(
        CONTEXT
    )
    assert env.coordinator(spec).suspended() is not None
    # Not a stop (params.stop false): nothing to undo.
    assert ResumeTriggeringOperator(task_id="r", spec=spec, when="False").execute(CONTEXT) is False
    assert env.coordinator(spec).suspended() is not None
    assert ResumeTriggeringOperator(task_id="r", spec=spec, when="True").execute(CONTEXT) is True
    assert env.coordinator(spec).suspended() is None


def test_a_restore_that_falls_back_says_so_on_the_run_and_the_page(env: Env, monkeypatch) -> None:
    notes: list[tuple[str, str, str]] = []

    class NoteHook:
        def __init__(self, conn_id: str) -> None:
            pass

        def set_note(self, dag_id: str, run_id: str, note: str) -> dict[str, Any]:
            notes.append((dag_id, run_id, note))
            return {}

    monkeypatch.setattr(operators, "AirflowApiHook", NoteHook)
    spec = env.spec(retained=2)
    two_epochs(env, spec)
    lost = next(k for k in env.store.list(LAYOUT.chk(C2)) if k.endswith("state.bin"))
    env.store.delete(lost)  # the latest checkpoint is no longer usable
    context = {**CONTEXT, "dag": SimpleNamespace(dag_id="pipe_restore")}
    result = restore_op(spec).execute(context)
    assert result["source"] == f"{env.url}/pipe/chk-0000000001"
    fell_back = (
        f"FELL BACK to checkpoint 1 because checkpoint 2: state file {env.url}/{lost} is missing"
    )
    assert notes == [
        ("pipe_restore", "manual__x", f"Restored from {env.url}/pipe/chk-0000000001. {fell_back}")
    ]
    assert checkpoint_history(env.store, "pipe")["restore_note"] == fell_back
    # A restore of the latest usable checkpoint itself leaves no note anywhere.
    notes.clear()
    restore_op(spec, point="chk-1").execute(context)
    assert notes == [] and checkpoint_history(env.store, "pipe")["restore_note"] is None


# ---- LocalEpochOperator: the session around the epoch ----------------------------------------


class _TaskInstance:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, **_: Any) -> None:
        return None


@pytest.mark.parametrize("stop_fails", [False, True], ids=["stop-ok", "stop-fails"])
def test_an_epoch_failure_after_the_barrier_fails_the_task_even_if_stop_fails(
    env: Env, monkeypatch: pytest.MonkeyPatch, stop_fails: bool
) -> None:
    from microcheckpoint_airflow.operators import LocalEpochOperator

    order: list[str] = []

    class Session:
        def stop(self) -> None:
            order.append("stop")
            if stop_fails:
                raise RuntimeError("the JVM is gone")

    class Hook:
        def __init__(self, conn_id: str) -> None:
            pass

        def bootstrap_servers(self) -> str:
            order.append("bootstrap")
            return "127.0.0.1:1"

        @contextmanager
        def get_offsets(self) -> Iterator[str]:
            order.append("kafka")
            try:
                yield "the task's Kafka client"
            finally:
                order.append("kafka closed")

    def session() -> Session:
        order.append("session")
        return Session()

    def trigger(*_: Any, kafka: Any, **__: Any) -> CheckpointId:
        order.append(f"trigger with {kafka}")
        return CheckpointId(7)

    def process(*args: Any) -> None:
        order.append(f"process with {args[-1]}")
        raise ValueError("bad row 3")

    task = LocalEpochOperator(task_id="process_epoch", spec=env.spec(), trigger=True)
    monkeypatch.setattr(operators, "KafkaHook", Hook)
    monkeypatch.setattr(operators, "trigger_checkpoint", trigger)
    monkeypatch.setattr(task, "session", session)
    monkeypatch.setattr(task, "process", process)
    ti = _TaskInstance()
    with pytest.raises(AirflowFailException, match=r"^checkpoint 7: ValueError: bad row 3$"):
        task.run({**CONTEXT, "ti": ti})
    # The session before the barrier, stopped last; one Kafka client for the trigger and
    # the epoch, closed before the session stops; the id went to XCom at once.
    assert order == [
        "bootstrap",
        "session",
        "kafka",
        "trigger with the task's Kafka client",
        "process with the task's Kafka client",
        "kafka closed",
        "stop",
    ]
    assert ti.pushed == {"checkpoint_id": 7}


@pytest.mark.parametrize("followers", [(), ("done", "abort_on_failure")], ids=["none", "two"])
def test_a_succeeded_epoch_task_pushes_its_xcom_then_skips_its_followers(
    env: Env, monkeypatch: pytest.MonkeyPatch, followers: tuple[str, ...]
) -> None:
    """With ``skip_on_success`` the task pushes its XCom itself and raises Airflow's
    ``DownstreamTasksSkipped`` naming those tasks (its task runner skips them, then marks
    the task success); without, it returns its XCom as any task does."""
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from microcheckpoint_airflow.operators import LocalEpochOperator

    task = LocalEpochOperator(task_id="process_epoch", spec=env.spec(), skip_on_success=followers)
    completed = {"checkpoint": 3, "attempt": 1, "records": 10}
    monkeypatch.setattr(task, "run", lambda *_: completed)
    ti = _TaskInstance()
    if not followers:
        assert task.execute({**CONTEXT, "ti": ti}) == completed
        assert ti.pushed == {}
        return
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        task.execute({**CONTEXT, "ti": ti})
    assert skipped.value.tasks == ["done", "abort_on_failure"]
    assert ti.pushed == {"return_value": completed}


@pytest.mark.parametrize("dies_after_deadline", [True, False], ids=["after", "before"])
def test_a_job_that_fails_after_its_checkpoint_expired_fails_the_task_naming_the_expiry(
    env: Env, monkeypatch: pytest.MonkeyPatch, dies_after_deadline: bool
) -> None:
    """The task's own deadline watch aborts the checkpoint at its deadline while the job
    runs; a job failing after that names the expiry, one failing before names its cause."""
    from microcheckpoint.engine import cycle
    from microcheckpoint_airflow.operators import LocalEpochOperator

    # Before: a timeout no busy machine reaches while the job fails at once.
    spec = env.spec(timeout="0.3s" if dies_after_deadline else "60s")
    coord = env.coordinator(spec)
    cid = env.trigger(coord, {TP0: 10})

    def job(*_: Any, **__: Any) -> None:
        if dies_after_deadline:
            time.sleep(1.0)
        raise RuntimeError("the executors were lost")

    monkeypatch.setattr(cycle, "run_epoch", job)
    task = LocalEpochOperator(task_id="process_epoch", spec=spec)
    started = time.time()
    if dies_after_deadline:
        with pytest.raises(AirflowFailException, match=r"^checkpoint 1 of 'pipe' expired: "):
            task.process(cid, coord, task.load_pipeline(), None, "127.0.0.1:1")
        # Aborted at its deadline, while the job still ran.
        aborted = outcome(env, cid)
        assert (aborted["outcome"], aborted["reason"]) == ("ABORTED", "EXPIRED")  # type: ignore[index]
        trigger_ms = coord.view().pending_record(cid).trigger_time_ms
        assert trigger_ms + 300 < aborted["at_ms"] < started * 1000 + 1000  # type: ignore[index]
    else:
        with pytest.raises(RuntimeError, match="the executors were lost"):
            task.process(cid, coord, task.load_pipeline(), None, "127.0.0.1:1")
        assert outcome(env, cid) is None  # left to abort_on_failure
    assert time.time() - started < 5  # the watch stopped with the task's step


# ---- LocalEpochOperator: the gate (min pause and max concurrent) -----------------------------


def _gated(env: Env, monkeypatch: pytest.MonkeyPatch, **checkpointing: Any) -> Any:
    """A gated epoch task whose epoch only records when it started."""
    from microcheckpoint_airflow.operators import LocalEpochOperator

    op = LocalEpochOperator(
        task_id="process_epoch", spec=env.spec(**checkpointing), trigger=True, gate=True
    )
    op.started: list[float] = []  # type: ignore[misc]
    monkeypatch.setattr(op, "run", lambda *_: op.started.append(time.time()) or {"ran": True})
    return op


def test_a_short_min_pause_is_waited_out_in_the_task(env: Env, monkeypatch) -> None:
    op = _gated(env, monkeypatch, min_pause="2s")
    coord = env.coordinator(op.spec)
    env.epoch(coord, {TP0: 10})
    completed_s = coord.view().metadata(C1).completed_time_ms / 1000
    assert op.execute(CONTEXT) == {"ran": True}  # no TaskDeferred: the task waited
    assert op.started[0] - completed_s >= 2.0


def test_a_long_min_pause_or_a_checkpoint_in_flight_defers(env: Env, monkeypatch) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    op = _gated(env, monkeypatch, min_pause=f"{checks.IN_TASK_WAIT_S + 5:.0f}s")
    env.epoch(env.coordinator(op.spec), {TP0: 10})
    began = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(CONTEXT)
    assert time.monotonic() - began < checks.IN_TASK_WAIT_S  # deferred without waiting
    assert deferred.value.method_name == "execute_after_gate"
    # One checkpoint in flight with max_concurrent 1: how long is unknown, so it defers.
    op = _gated(env, monkeypatch, min_pause="0s", max_concurrent=1)
    env.trigger(env.coordinator(op.spec), {TP0: 20})
    with pytest.raises(TaskDeferred):
        op.execute(CONTEXT)
    assert op.started == []


def test_the_min_pause_sensor_waits_a_short_pause_and_defers_a_long_one(env: Env) -> None:
    """The spark-submit DAG's ``wait_min_pause``: the same rule as the gate's."""
    from airflow.sdk.exceptions import TaskDeferred

    from microcheckpoint_airflow.sensors import MinPauseSensor

    short = env.spec(min_pause="2s")
    coord = env.coordinator(short)
    env.epoch(coord, {TP0: 10})
    completed_s = coord.view().metadata(C1).completed_time_ms / 1000
    assert MinPauseSensor(task_id="wait_min_pause", spec=short).execute(CONTEXT) is None
    assert time.time() - completed_s >= 2.0
    # The same checkpoint 1, about 2 s ago, under a pause of IN_TASK_WAIT_S + 5 s.
    long = env.spec(min_pause=f"{checks.IN_TASK_WAIT_S + 5:.0f}s")
    with pytest.raises(TaskDeferred):
        MinPauseSensor(task_id="wait_min_pause", spec=long).execute(CONTEXT)


def test_an_abort_after_a_failed_run_names_its_failed_tasks() -> None:
    """The words only; the e2e story marks a running epoch task failed through the REST API
    and reads them in the stored abort."""
    assert failed_run_detail("r1", []) == "a task of Airflow run r1 failed"
    assert (
        failed_run_detail("r1", ["process_epoch"]) == "task process_epoch of Airflow run r1 failed"
    )
    assert failed_run_detail("r1", ["a", "b"]) == "tasks a, b of Airflow run r1 failed"
