"""The restore DAG refuses a savepoint whose state descriptors the deployed pipeline cannot
read, through Airflow's own run path (``dag.test()`` with a run conf, as ``airflow dags
test`` runs it), against SeaweedFS.

A savepoint of ``evolution_pipeline``'s v1 (local Spark in the test, a versioned bucket) is
restored by ``evolving_restore`` into versions deployed one after the other: a changed
state type (refused even with ``allow_non_restored_state``), a dropped state (refused
without it), then the dropped state allowed (validated, named as left unread, restored). A
refusal fails ``validate_point`` with the one-line message naming the operator, the state
and the fix; no later task runs (the pipeline DAG is not unpaused) and no stored object
gains a version or changes a byte.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from microcheckpoint.adapters.s3 import S3Store, ensure_bucket
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.savepoints import create_savepoint
from tests.integration import evolution_pipeline as evo
from tests.integration.airflow_support import dag_test, migrate
from tests.integration.test_state_evolution import T0, write_files
from tests.stored import object_versions, read_json

pytestmark = pytest.mark.integration

NAME = "evolving"
PREFIX = "chk"
DAG_FILE = Path(__file__).with_name("evolution_dag.py")
# The restore DAG of a FileSource pipeline opens no broker: its Kafka connection is unused.
NO_BROKER = "127.0.0.1:9"
# The line Airflow logs for a task's failure (the last of its traceback).
TASK_FAILURE = re.compile(r"^airflow\.sdk\.exceptions\.AirflowFailException: (.*)$")
REFUSED_TASKS = {
    "validate_point": "failed",
    "stop_triggering": "upstream_failed",
    "await_in_flight": "upstream_failed",
    "restore": "upstream_failed",
    "resume_pipeline": "upstream_failed",
}


def stored(s3_client: Any, bucket: str) -> dict[str, bytes]:
    """Every object's bytes under the bucket."""
    found = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", ()):
            found[item["Key"]] = s3_client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


@pytest.fixture
def savepoint(spark, s3_endpoint, s3_client, tmp_path: Path) -> tuple[str, str]:
    """Epochs 0 and 1 of v1 on a versioned bucket and a savepoint of checkpoint 2: the
    bucket and the savepoint's URL."""
    bucket = f"mcp-evolve-{uuid.uuid4().hex[:10]}"
    ensure_bucket(s3_client, bucket)
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    write_files(tmp_path / "in")
    store = S3Store(s3_client, bucket, PREFIX)
    config = CheckpointConfig.from_mapping({"pipeline": NAME, "storage": store.url})
    options = {
        "endpoint_url": s3_endpoint.url,
        "region": s3_endpoint.region,
        "access_key": s3_endpoint.access_key,
        "secret_key": s3_endpoint.secret_key,
    }
    v1 = evo.pipeline("v1", NAME, str(tmp_path / "in"))
    for e in (0, 1):
        run_cycle(
            spark, v1, config, store, bootstrap="", parallelism=2, store_options=options,
            clock=lambda e=e: T0 + 60 * e,
        )  # fmt: skip
    return bucket, create_savepoint(store, NAME, CheckpointId(2)).rstrip("/")


class Restores:
    """Runs of ``evolving_restore``, each in an Airflow process of its own, into a version
    of the function deployed just before.

    One process per run, as the scheduler gives a run a freshly parsed DAG: ``dag.test()``
    renders a task's template fields into the DAG's own task object, so a second run of
    the same DAG in one process would reuse the first run's rendered conf."""

    def __init__(self, tmp_path: Path, bucket: str, s3_endpoint: Any) -> None:
        self.home = tmp_path / "airflow"
        self.home.mkdir()
        migrate(self.home, NO_BROKER, s3_endpoint)
        dags = tmp_path / "dags"  # dag.test() runs DAGs of the configured folder only
        dags.mkdir()
        self.dag_file = dags / DAG_FILE.name
        self.dag_file.write_text(DAG_FILE.read_text())
        self.deployed = tmp_path / "deployed"
        self.s3_endpoint = s3_endpoint
        self.env = {
            "MICROCHECKPOINT_STORAGE": f"s3://{bucket}/{PREFIX}",
            "EVOLUTION_INPUT": str(tmp_path / "in"),
            "EVOLUTION_DEPLOYED": str(self.deployed),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        }

    def run(self, version: str, conf: dict[str, Any]) -> tuple[dict[str, Any], list[str], str]:
        """The run's result, the messages its tasks failed with, and its log."""
        output: list[str] = []
        (run,) = dag_test(
            self.home,
            NO_BROKER,
            self.s3_endpoint,
            str(self.dag_file),
            [{"dag_id": f"{NAME}_restore", "conf": conf, "touch": {str(self.deployed): version}}],
            self.env,
            timeout=300,
            output=output,
        )
        failures = [m[1] for m in map(TASK_FAILURE.match, output[0].splitlines()) if m]
        return run, failures, output[0]


def test_the_restore_dag_refuses_incompatible_state_and_allows_a_dropped_one(
    savepoint, s3_endpoint, s3_client, tmp_path: Path
) -> None:
    bucket, url = savepoint
    restores = Restores(tmp_path, bucket, s3_endpoint)
    before, versions = stored(s3_client, bucket), object_versions(s3_client, bucket, "")

    # 1. A changed type: refused, even with allow_non_restored_state.
    run, failures, _ = restores.run("retyped", {"point": url, "allow_non_restored_state": True})
    assert (run["state"], run["tasks"], run["xcom"]) == ("failed", REFUSED_TASKS, {})
    assert failures == [
        f"state 'count' of operator 'tally' is a value state of long in {url} and the pipeline "
        "declares a value state of string; keep its type, or declare the new one under another "
        "name (restore with allow_non_restored_state to drop the old one)"
    ]
    assert stored(s3_client, bucket) == before
    assert object_versions(s3_client, bucket, "") == versions

    # 2. A dropped state without allow_non_restored_state: refused; resume (default true)
    # never runs, so the pipeline DAG is not unpaused.
    run, failures, _ = restores.run("dropped", {"point": url})
    assert (run["state"], run["tasks"], run["xcom"]) == ("failed", REFUSED_TASKS, {})
    assert failures == [
        f"{url} holds state 'recent' of operator 'tally' that the pipeline no longer declares; "
        "restore with allow_non_restored_state to leave it unread, or declare it again"
    ]
    assert stored(s3_client, bucket) == before
    assert object_versions(s3_client, bucket, "") == versions

    # 3. The same, allowed: validated (the state named as left unread) and restored.
    conf = {"point": url, "allow_non_restored_state": True, "resume": False}
    run, failures, log = restores.run("dropped", conf)
    assert (run["state"], failures) == ("success", [])
    assert set(run["tasks"].values()) == {"success"}
    assert run["xcom"]["validate_point"] == {
        "location": url,
        "checkpoint": 2,
        "kind": "savepoint",
        "claim_mode": "NO_CLAIM",
        "parallelism": 2,
        "dropped_state": [],
        "offsets": {"files.files:0": 2},
        "dropped_states": ["tally/recent"],
    }
    unread = [x for x in log.splitlines() if "will be left unread" in x]
    assert len(unread) == 1 and "states ['tally/recent'] will be left unread" in unread[0]
    # The restore wrote its marker and the failure reset once, stopped triggering and
    # cleared the stop (one version, deleted); every other object is as it was.
    after = stored(s3_client, bucket)
    layout = f"{PREFIX}/{NAME}"
    assert {k: v for k, v in after.items() if k in before} == before
    # ... and one row of the restores history (protocol.restores).
    added = sorted(set(after) - set(before))
    (event,) = [k for k in added if k.startswith(f"{layout}/_events/restores/")]
    assert added == [event, f"{layout}/_failures_reset", f"{layout}/_restore"]
    assert object_versions(s3_client, bucket, "") - versions == {
        event: 1,
        f"{layout}/_failures_reset": 1,
        f"{layout}/_restore": 1,
        f"{layout}/_stopped": 1,
    }
    marker = read_json(S3Store(s3_client, bucket, PREFIX), Layout(NAME).restore)
    assert (marker["source"], marker["checkpoint_id"], marker["labels"]) == (
        url,
        2,
        {"dag_id": f"{NAME}_restore", "run_id": run["run_id"]},
    )
