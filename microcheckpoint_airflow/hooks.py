"""Hooks: Airflow connections in, the core's adapters out, and nothing else.

- ``CheckpointStorageHook`` (type ``microcheckpoint_storage``: login = access key,
  password = secret key, extra ``endpoint_url`` and ``region_name``) opens checkpoint
  storage by root URL.
- ``KafkaHook`` (type ``microcheckpoint_kafka``: extra ``bootstrap.servers`` or
  ``bootstrap_servers``, or host and port) gives the bootstrap servers and a
  ``KafkaOffsets`` client.
- ``AirflowApiHook`` (type ``microcheckpoint_api``: host, port, schema, login, password of
  Airflow's API server) pauses and unpauses DAGs through the REST API v2; tasks in Airflow 3
  have no database access of their own.

Each hook's ``conn_type`` is its own (``provider.py`` registers them with Airflow, so they
clash with no other provider's), but a hook reads a connection of any type by its id:
connections made before these types existed (``aws``, ``generic``, ``http``) keep working.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseHook

from microcheckpoint.adapters.airflow_api import AirflowApi
from microcheckpoint.errors import ConfigError
from microcheckpoint.ops.stores import StorageSettings
from microcheckpoint.storage import ObjectStore
from microcheckpoint_airflow.provider import API_CONN_TYPE, KAFKA_CONN_TYPE, STORAGE_CONN_TYPE

__all__ = [
    "DEFAULT_API_CONN_ID",
    "DEFAULT_KAFKA_CONN_ID",
    "DEFAULT_STORAGE_CONN_ID",
    "AirflowApiHook",
    "CheckpointStorageHook",
    "KafkaHook",
]

DEFAULT_STORAGE_CONN_ID = "microcheckpoint_storage"
DEFAULT_KAFKA_CONN_ID = "microcheckpoint_kafka"
DEFAULT_API_CONN_ID = "microcheckpoint_airflow_api"


def _connection(conn_id: str) -> Any | None:
    """The connection, or None when it is not defined anywhere (env, secrets, database).

    Raises:
        ConfigError: ``AIRFLOW_CONN_<ID>`` is set but Airflow cannot read it (bad JSON or
            URI); silently falling back would send checkpoints somewhere else.
    """
    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException moved between Airflow versions
        if "isn't defined" not in str(exc) and "not found" not in str(exc).lower():
            raise
        variable = f"AIRFLOW_CONN_{conn_id.upper()}"
        if os.environ.get(variable):
            raise ConfigError(
                variable,
                os.environ[variable][:80],
                "a connection Airflow can parse: JSON with conn_type, host, login, password, "
                "extra (or a connection URI)",
            ) from exc
        return None


class CheckpointStorageHook(BaseHook):
    """Checkpoint storage from an S3 connection (optional for ``file://`` roots).

    The connection's type may be ``microcheckpoint_storage`` or any other (``aws``): only
    login, password and the extras ``endpoint_url`` and ``region_name`` are read.

    Without the connection, S3 uses boto3's default credential chain and
    ``MICROCHECKPOINT_S3_ENDPOINT`` (the way to use IAM roles).
    """

    conn_name_attr = "storage_conn_id"
    default_conn_name = DEFAULT_STORAGE_CONN_ID
    conn_type = STORAGE_CONN_TYPE
    hook_name = "microcheckpoint checkpoint storage"

    def __init__(self, storage_conn_id: str = DEFAULT_STORAGE_CONN_ID) -> None:
        super().__init__()
        self.storage_conn_id = storage_conn_id

    def settings(self) -> StorageSettings:
        """The S3 settings of the connection (without it: ``MICROCHECKPOINT_S3_ENDPOINT`` and
        boto3's default credential chain)."""
        conn = _connection(self.storage_conn_id)
        if conn is None:
            self.log.info(
                "connection %s is not defined: S3 uses the default credential chain",
                self.storage_conn_id,
            )
            return StorageSettings.from_env()
        extra = conn.extra_dejson
        return StorageSettings(
            endpoint_url=extra.get("endpoint_url") or extra.get("host") or None,
            region=extra.get("region_name") or None,
            access_key=conn.login or None,
            secret_key=conn.password or None,
        )

    def store_options(self, url: str) -> dict[str, Any]:
        """Keyword arguments of ``open_store`` for ``url`` (empty for ``file://``)."""
        if not url.startswith("s3://"):
            return {}
        return self.settings().options(url)

    def get_store(self, url: str) -> ObjectStore:
        return self.settings().open(url)


class KafkaHook(BaseHook):
    """Kafka bootstrap servers from a connection (or ``MICROCHECKPOINT_KAFKA_BOOTSTRAP``).

    The connection's type may be ``microcheckpoint_kafka`` or any other (``generic``).
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = DEFAULT_KAFKA_CONN_ID
    conn_type = KAFKA_CONN_TYPE
    hook_name = "microcheckpoint Kafka"

    def __init__(self, kafka_conn_id: str = DEFAULT_KAFKA_CONN_ID) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id
        self._servers: str | None = None

    def bootstrap_servers(self) -> str:
        """The connection's bootstrap servers, looked up once per hook (``get_offsets``
        after it asks no second time)."""
        if self._servers is None:
            self._servers = self._lookup_servers()
        return self._servers

    def _lookup_servers(self) -> str:
        conn = _connection(self.kafka_conn_id)
        if conn is not None:
            servers = conn.extra_dejson.get("bootstrap.servers") or conn.extra_dejson.get(
                "bootstrap_servers"
            )
            if servers:
                return str(servers)
            if conn.host:
                return f"{conn.host}:{conn.port or 9092}"
        servers = os.environ.get("MICROCHECKPOINT_KAFKA_BOOTSTRAP")
        if servers:
            return servers
        raise ConfigError(
            "kafka_conn_id",
            self.kafka_conn_id,
            "a defined connection with extra {'bootstrap.servers': 'host:port'} (or set "
            "MICROCHECKPOINT_KAFKA_BOOTSTRAP)",
        )

    def get_offsets(self) -> Any:
        from microcheckpoint.adapters.kafka_offsets import KafkaOffsets

        return KafkaOffsets(self.bootstrap_servers())


class AirflowApiHook(BaseHook):
    """Airflow's REST API v2 through a connection (host, port, schema, login, password).

    The connection's type may be ``microcheckpoint_api`` or any other (``http``).
    """

    conn_name_attr = "api_conn_id"
    default_conn_name = DEFAULT_API_CONN_ID
    conn_type = API_CONN_TYPE
    hook_name = "microcheckpoint Airflow API"

    def __init__(self, api_conn_id: str = DEFAULT_API_CONN_ID) -> None:
        super().__init__()
        self.api_conn_id = api_conn_id

    def api(self) -> AirflowApi:
        """The REST client for this connection."""
        conn = _connection(self.api_conn_id)
        if conn is None or not conn.host:
            raise ConfigError(
                "api_conn_id",
                self.api_conn_id,
                "a connection to Airflow's API server (host, port, login, password) "
                "so the savepoint and restore DAGs can pause and unpause the pipeline DAG",
            )
        host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
        base = (f"{host}:{conn.port}" if conn.port else host).rstrip("/")
        return AirflowApi(
            base, conn.login or None, conn.password or None, f"connection {self.api_conn_id!r}"
        )

    def token(self) -> str:
        return self.api().token()

    def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        """Pause or unpause ``dag_id``; returns the DAG as the API reports it."""
        return self.api().set_paused(dag_id, paused)

    def set_note(self, dag_id: str, run_id: str, note: str) -> dict[str, Any]:
        """Set the note of run ``run_id`` of ``dag_id`` (shown on the run in the UI; at most
        1000 characters)."""
        return self.api().set_note(dag_id, run_id, note)
