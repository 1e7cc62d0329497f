"""Session fixtures: real services on loopback ports, stopped by process id.

Set MICROCHECKPOINT_KAFKA_BOOTSTRAP / MICROCHECKPOINT_S3_ENDPOINT to run the same suite
against an external Kafka and S3 (for example the docker compose stack). A service that
fails to start fails the tests that need it; nothing is skipped.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import services

# Airflow reads its home when first imported (the plugin's unit tests import it): keep it
# out of ~/airflow. The dag.test() and end-to-end tests give their processes their own.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="mcp-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Every Spark JVM of the suite (the session's, spark-submit jobs, the Connect server, Airflow's
# tasks) without the C2 compiler: about a third less CPU on two cores (docs/testing.md).
services.quick_jvms()


@pytest.fixture(scope="session")
def service_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def s3_endpoint(service_log_dir: Path) -> Iterator[services.S3Endpoint]:
    external = os.environ.get(services.ENV_S3)
    if external:
        yield services.S3Endpoint(
            external,
            os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
            os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
            os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        )
        return
    service, endpoint = services.start_seaweedfs(service_log_dir)
    try:
        yield endpoint
    finally:
        service.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(service_log_dir: Path) -> Iterator[str]:
    external = os.environ.get(services.ENV_KAFKA)
    if external:
        yield external
        return
    service = services.start_tansu(service_log_dir)
    try:
        yield service.address
    finally:
        service.stop()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: services.S3Endpoint):
    from microcheckpoint.adapters.s3 import make_client

    return make_client(
        s3_endpoint.url, s3_endpoint.region, s3_endpoint.access_key, s3_endpoint.secret_key
    )


@pytest.fixture
def s3_bucket(s3_client) -> str:
    """A new, empty bucket for one test."""
    from microcheckpoint.adapters.s3 import ensure_bucket

    name = f"mcp-{uuid.uuid4().hex[:12]}"
    ensure_bucket(s3_client, name)
    return name


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the session (Java 17+; executors run this venv's Python)."""
    from microcheckpoint.engine.spark import local_spark

    session = local_spark("local[2]")
    try:
        yield session
    finally:
        session.stop()


# The test files of 20 s or more (`make test`'s --durations, the mean of two runs of
# 2026-11-29), longest first. With `--dist loadfile --no-loadscope-reorder` each file goes
# to one worker in collection order, so starting these first keeps the workers busy to the
# end instead of leaving one long file for last. (Without that flag xdist orders files by
# their number of tests: the longest files, one test each, went last.)
LONGEST_FIRST = (
    "tests/e2e/test_airflow_scheduler.py",
    "tests/integration/test_airflow_dags.py",
    "tests/integration/test_stage_crash.py",
    "tests/integration/test_spark_modes.py",
    "tests/integration/test_spark_cluster.py",
    "tests/integration/test_stage_crash_unaligned.py",
    "tests/integration/test_engine.py",
    "tests/integration/test_verify.py",
    "tests/integration/test_airflow_zombie.py",
    "tests/integration/test_cli_edges.py",
    "tests/integration/test_nexmark_queries.py",
    "tests/integration/test_broker_faults.py",
    "tests/integration/test_file_source.py",
    "tests/integration/test_audit.py",
    "tests/integration/test_nexmark_crash.py",
    "tests/integration/test_airflow_state_evolution.py",
    "tests/integration/test_wheel_install.py",
    "tests/integration/test_s3_faults.py",
    "tests/integration/test_crash_recovery.py",
    "tests/integration/test_edge_contract.py",
    "tests/integration/test_demo_engine.py",
    "tests/integration/test_sinks_engine.py",
    "tests/integration/test_key_group_schemes.py",
    "tests/integration/test_cli_state_import.py",
    "tests/integration/test_stages.py",
    "tests/integration/test_stage_watermarks.py",
    "tests/property/test_coordinator_state_machine.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_service_reaping.py",
    "tests/integration/test_epoch_failure_cause.py",
    "tests/integration/test_cli_restores.py",
    "tests/integration/test_global_savepoint.py",
    "tests/integration/test_process_engine.py",
    "tests/integration/test_windows_engine.py",
    "tests/integration/test_examples.py",
    "tests/integration/test_state_evolution.py",
    "tests/integration/test_seaweedfs_replication.py",
    "tests/integration/test_replayability.py",
    "tests/integration/test_file_sink.py",
    "tests/integration/test_operator_state_engine.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the longest files first (stable otherwise): a shorter suite on several workers."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(LONGEST_FIRST))

    items.sort(key=key)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Quiet kafka-python and py4j before the interpreter shuts down.

    A kafka-python client left in a daemon IO thread keeps logging refused reconnects (as
    one whose constructor failed did, before ``kafka_offsets.kafka_python_client`` closed
    it; a client a test does not close still does). Frozen at shutdown
    while it holds a logging handler's lock, it would deadlock py4j's ``__del__``, which
    logs as it closes its gateway connections: the suite would hang after its summary.
    """
    import logging

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("kafka", "py4j"):
            logging.getLogger(name).disabled = True
    for name in ("kafka", "py4j"):
        logging.getLogger(name).disabled = True
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


@pytest.fixture(scope="session")
def spark_connect_url(service_log_dir: Path) -> Iterator[str]:
    """A Spark Connect server for the session (``sc://…``), or the one in the environment."""
    external = os.environ.get(services.ENV_CONNECT)
    if external:
        yield external
        return
    service = services.start_spark_connect(service_log_dir)
    try:
        yield service.address
    finally:
        service.stop()


@pytest.fixture(scope="session")
def spark_cluster(service_log_dir: Path):
    """A Spark standalone master and two workers (1 core, 1g each) on loopback ports."""
    from harness.spark_cluster import start_spark_cluster

    cluster = start_spark_cluster(service_log_dir / "spark-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()
