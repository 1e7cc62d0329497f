"""Provider metadata: what Airflow's ProvidersManager learns about microcheckpoint.

Airflow reads ``get_provider_info`` through the distribution's ``apache_airflow_provider``
entry point (``pyproject.toml``), the way it finds every provider package, and lists the
result in ``airflow providers list`` / ``airflow providers hooks`` and in the UI's
connection form. This module imports nothing (no Airflow): the ProvidersManager loads it
in every Airflow process, and the three hook classes are imported only when a connection
of their type is opened.

Edge cases:
    - ``package-name`` must equal the distribution's name (``microcheckpoint``): Airflow
      refuses the whole provider otherwise.
    - The plugin is not listed here: the ``airflow.plugins`` entry point registers it
      already, and a second registration is reported as an import error.
    - Each connection type is the hook's own ``conn_type`` (Airflow logs an
      "Inconsistency!" warning when they differ). The hooks still read connections of any
      type (``aws``, ``generic``, ``http`` from before), so existing ``AIRFLOW_CONN_*``
      values keep working.
    - Field labels and extras are declared here (``ui-field-behaviour``, ``conn-fields``),
      not in hook methods, which Airflow 3.2 deprecated.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = [
    "API_CONN_TYPE",
    "KAFKA_CONN_TYPE",
    "STORAGE_CONN_TYPE",
    "get_provider_info",
]

STORAGE_CONN_TYPE = "microcheckpoint_storage"
KAFKA_CONN_TYPE = "microcheckpoint_kafka"
API_CONN_TYPE = "microcheckpoint_api"

_HOOKS = "microcheckpoint_airflow.hooks"


def _text(label: str, description: str, secret: bool = False) -> dict[str, Any]:
    """One extra field of a connection form (stored under its name in ``extra``)."""
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if secret:
        schema["format"] = "password"
    return {"label": label, "description": description, "schema": schema}


def _connection_types() -> list[dict[str, Any]]:
    """The connection types of the three hooks, with their form's labels and extras."""
    return [
        {
            "connection-type": STORAGE_CONN_TYPE,
            "hook-class-name": f"{_HOOKS}.CheckpointStorageHook",
            "hook-name": "microcheckpoint checkpoint storage",
            "ui-field-behaviour": {
                "hidden-fields": ["host", "schema", "port"],
                "relabeling": {"login": "Access key ID", "password": "Secret access key"},
            },
            "conn-fields": {
                "endpoint_url": _text(
                    "Endpoint URL",
                    "An S3-compatible server (empty: AWS S3)",
                ),
                "region_name": _text("Region", "The S3 region (empty: us-east-1)"),
            },
        },
        {
            "connection-type": KAFKA_CONN_TYPE,
            "hook-class-name": f"{_HOOKS}.KafkaHook",
            "hook-name": "microcheckpoint Kafka",
            "ui-field-behaviour": {
                "hidden-fields": ["schema", "login", "password"],
                "relabeling": {"host": "Broker host", "port": "Broker port"},
            },
            "conn-fields": {
                "bootstrap_servers": _text(
                    "Bootstrap servers",
                    "host:port[,host:port...] (instead of one broker's host and port)",
                ),
            },
        },
        {
            "connection-type": API_CONN_TYPE,
            "hook-class-name": f"{_HOOKS}.AirflowApiHook",
            "hook-name": "microcheckpoint Airflow API",
            "ui-field-behaviour": {
                "hidden-fields": [],
                "relabeling": {"schema": "Scheme (http or https)"},
                "placeholders": {"host": "airflow-api-server", "port": "8080"},
            },
        },
    ]


def _version() -> str:
    """The installed distribution's version ("0+unknown" when run from a bare checkout)."""
    try:
        return version("microcheckpoint")
    except PackageNotFoundError:
        return "0+unknown"


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against its ``provider_info`` schema.

    Returns:
        package-name, name, description, versions, the integration, the modules of hooks,
        operators and sensors, and ``connection-types`` (type to hook class).
    """
    integration = "microcheckpoint"
    return {
        "package-name": "microcheckpoint",
        "name": "microcheckpoint",
        "description": (
            "Checkpointed batch pipelines on PySpark, Kafka and S3: the pipeline, savepoint "
            "and restore DAGs, their operators, sensors and hooks, and the Checkpoints page."
        ),
        "versions": [_version()],
        "integrations": [
            {"integration-name": integration, "tags": ["software"]},
        ],
        "hooks": [{"integration-name": integration, "python-modules": [_HOOKS]}],
        "operators": [
            {
                "integration-name": integration,
                "python-modules": [
                    "microcheckpoint_airflow.operators",
                    "microcheckpoint_airflow.global_points",
                ],
            }
        ],
        "sensors": [
            {"integration-name": integration, "python-modules": ["microcheckpoint_airflow.sensors"]}
        ],
        "connection-types": _connection_types(),
    }
