"""Hooks: Airflow connections (defined as ``AIRFLOW_CONN_*`` environment variables) in, the
core's adapter options out; the REST API hook against a small real HTTP server.

Outside a task (no supervisor comms, no ``_AIRFLOW_PROCESS_CONTEXT=server``) Airflow 3's
``BaseHook.get_connection`` searches the fallback chain: environment variables, then the
configured external backends, never the metadata database. So no Airflow database is needed.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from importlib import metadata, resources
from typing import Any

import jsonschema
import pytest

from microcheckpoint.errors import ConfigError
from microcheckpoint_airflow.hooks import AirflowApiHook, CheckpointStorageHook, KafkaHook
from microcheckpoint_airflow.provider import get_provider_info
from tests.unit.jsonhttp import JsonHandler

STORAGE_ENV = "AIRFLOW_CONN_MICROCHECKPOINT_STORAGE"
KAFKA_ENV = "AIRFLOW_CONN_MICROCHECKPOINT_KAFKA"
API_ENV = "AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection or fallback from the outer environment; no proxy for 127.0.0.1."""
    for name in (
        STORAGE_ENV,
        KAFKA_ENV,
        API_ENV,
        "MICROCHECKPOINT_S3_ENDPOINT",
        "MICROCHECKPOINT_KAFKA_BOOTSTRAP",
        "http_proxy",
        "HTTP_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


def set_conn(monkeypatch: pytest.MonkeyPatch, env: str, **fields: Any) -> None:
    monkeypatch.setenv(env, json.dumps(fields))


def test_each_hook_declares_the_connection_type_the_provider_registers() -> None:
    """Airflow warns ("Inconsistency!") when a hook's conn_type differs from provider info."""
    declared = {
        item["connection-type"]: item["hook-class-name"]
        for item in get_provider_info()["connection-types"]
    }
    assert declared == {
        "microcheckpoint_storage": "microcheckpoint_airflow.hooks.CheckpointStorageHook",
        "microcheckpoint_kafka": "microcheckpoint_airflow.hooks.KafkaHook",
        "microcheckpoint_api": "microcheckpoint_airflow.hooks.AirflowApiHook",
    }
    hooks = (CheckpointStorageHook, KafkaHook, AirflowApiHook)
    assert {hook.conn_type: f"{hook.__module__}.{hook.__name__}" for hook in hooks} == declared


def test_the_provider_info_is_valid_for_airflow() -> None:
    """Validated against the schema Airflow's ProvidersManager applies at discovery."""
    schema = json.loads(
        resources.files("airflow").joinpath("provider_info.schema.json").read_text()
    )
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "microcheckpoint"
    assert info["versions"] == [metadata.version("microcheckpoint")]
    assert "plugins" not in info  # the airflow.plugins entry point registers the plugin


# ---- CheckpointStorageHook ----------------------------------------------------------------


@pytest.mark.parametrize("conn_type", ["microcheckpoint_storage", "aws"])
def test_store_options_from_a_connection_of_either_type(
    monkeypatch: pytest.MonkeyPatch, conn_type: str
) -> None:
    set_conn(
        monkeypatch,
        STORAGE_ENV,
        conn_type=conn_type,
        login="k",
        password="s",
        extra={"endpoint_url": "http://x:1", "region_name": "eu-west-1"},
    )
    monkeypatch.setenv("MICROCHECKPOINT_S3_ENDPOINT", "http://ignored:2")  # the connection wins
    assert CheckpointStorageHook().store_options("s3://bucket/checkpoints") == {
        "endpoint_url": "http://x:1",
        "region": "eu-west-1",
        "access_key": "k",
        "secret_key": "s",
    }


def test_store_options_leave_out_what_the_connection_does_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_conn(monkeypatch, "AIRFLOW_CONN_MY_S3", conn_type="aws", extra={"region_name": "us-east-2"})
    assert CheckpointStorageHook("my_s3").store_options("s3://bucket") == {"region": "us-east-2"}


def test_store_options_for_a_file_url_are_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, STORAGE_ENV, conn_type="aws", login="k", password="s")
    assert CheckpointStorageHook().store_options("file:///srv/checkpoints") == {}


def test_store_options_without_the_connection_use_the_endpoint_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert CheckpointStorageHook().store_options("s3://bucket/checkpoints") == {}
    monkeypatch.setenv("MICROCHECKPOINT_S3_ENDPOINT", "http://127.0.0.1:9000")
    assert CheckpointStorageHook().store_options("s3://bucket/checkpoints") == {
        "endpoint_url": "http://127.0.0.1:9000"
    }


def test_the_connection_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = CheckpointStorageHook()
    assert hook.store_options("s3://bucket") == {}
    set_conn(monkeypatch, STORAGE_ENV, conn_type="aws", login="k2", password="s2")
    assert hook.store_options("s3://bucket") == {"access_key": "k2", "secret_key": "s2"}


@pytest.mark.parametrize(
    "value",
    ['{"conn_type": "aws", "login": ', '{"conn_type": "aws", "logn": "k"}'],
    ids=["broken-json", "unknown-field"],
)
def test_a_malformed_storage_connection_is_an_error(monkeypatch, value: str) -> None:
    monkeypatch.setenv(STORAGE_ENV, value)
    with pytest.raises(ConfigError):
        CheckpointStorageHook().store_options("s3://bucket/checkpoints")


# ---- KafkaHook ----------------------------------------------------------------------------


@pytest.mark.parametrize("conn_type", ["microcheckpoint_kafka", "generic"])
def test_bootstrap_servers_from_the_extra(monkeypatch: pytest.MonkeyPatch, conn_type: str) -> None:
    set_conn(
        monkeypatch,
        KAFKA_ENV,
        conn_type=conn_type,
        host="ignored",
        extra={"bootstrap.servers": "b1:9092,b2:9092"},
    )
    monkeypatch.setenv("MICROCHECKPOINT_KAFKA_BOOTSTRAP", "env:1")  # the connection wins
    assert KafkaHook().bootstrap_servers() == "b1:9092,b2:9092"


@pytest.mark.parametrize(("port", "expected"), [(19092, "broker:19092"), (None, "broker:9092")])
def test_bootstrap_servers_from_host_and_port(monkeypatch, port, expected) -> None:
    fields = {"conn_type": "microcheckpoint_kafka", "host": "broker"}
    if port is not None:
        fields["port"] = port
    set_conn(monkeypatch, KAFKA_ENV, **fields)
    assert KafkaHook().bootstrap_servers() == expected


def test_bootstrap_servers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICROCHECKPOINT_KAFKA_BOOTSTRAP", "127.0.0.1:29092")
    assert KafkaHook().bootstrap_servers() == "127.0.0.1:29092"


def test_no_kafka_connection_names_the_connection_id() -> None:
    with pytest.raises(ConfigError) as caught:
        KafkaHook("my_kafka").bootstrap_servers()
    assert (caught.value.field, caught.value.value) == ("kafka_conn_id", "my_kafka")
    assert str(caught.value) == (
        "config field 'kafka_conn_id' = 'my_kafka' is invalid: a defined connection with extra "
        "{'bootstrap.servers': 'host:port'} (or set MICROCHECKPOINT_KAFKA_BOOTSTRAP)"
    )


# ---- AirflowApiHook against a small real API server ----------------------------------------


class FakeApi:
    """POST /auth/token and PATCH /api/v2/dags/<id>, as Airflow's API server answers them."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, Any] | None]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def _handler(self) -> type[JsonHandler]:
        api = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                body = self.body()
                api.requests.append(("POST", self.path, body))
                if self.path != "/auth/token":
                    return self.answer(404, {"detail": "Not Found"})
                if body != {"username": "admin", "password": "pw"}:
                    return self.answer(401, {"detail": "Invalid credentials"})
                return self.answer(201, {"access_token": "t"})

            def do_PATCH(self) -> None:
                body = self.body()
                api.requests.append(("PATCH", self.path, body))
                if self.headers.get("Authorization") != "Bearer t":
                    return self.answer(401, {"detail": "Not authenticated"})
                if not self.path.startswith("/api/v2/dags/"):
                    return self.answer(404, {"detail": "Not Found"})
                dag_id = self.path.rsplit("/", 1)[1]
                return self.answer(200, {"dag_id": dag_id, **body})

        return Handler

    def __enter__(self) -> FakeApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with FakeApi() as server:
        yield server


def api_conn(
    monkeypatch, port: int, password: str = "pw", conn_type: str = "microcheckpoint_api"
) -> None:
    set_conn(
        monkeypatch,
        API_ENV,
        conn_type=conn_type,
        host="127.0.0.1",
        port=port,
        login="admin",
        password=password,
    )


@pytest.mark.parametrize(
    ("paused", "conn_type"),
    [(True, "microcheckpoint_api"), (False, "microcheckpoint_api"), (True, "http")],
)
def test_set_paused_patches_the_dag_with_a_token(
    monkeypatch, api: FakeApi, paused: bool, conn_type: str
) -> None:
    api_conn(monkeypatch, api.port, conn_type=conn_type)
    answer = AirflowApiHook().set_paused("wc_pipeline", paused)
    assert answer == {"dag_id": "wc_pipeline", "is_paused": paused}
    assert api.requests == [
        ("POST", "/auth/token", {"username": "admin", "password": "pw"}),
        ("PATCH", "/api/v2/dags/wc_pipeline", {"is_paused": paused}),
    ]


def test_a_wrong_password_names_the_connection(monkeypatch, api: FakeApi) -> None:
    api_conn(monkeypatch, api.port, password="wrong")
    with pytest.raises(RuntimeError) as caught:
        AirflowApiHook().set_paused("wc_pipeline", True)
    assert str(caught.value) == (
        f"Airflow API POST http://127.0.0.1:{api.port}/auth/token answered 401: "
        '{"detail": "Invalid credentials"}; check connection '
        "'microcheckpoint_airflow_api' (address, login, password)"
    )
    assert [r[0] for r in api.requests] == ["POST"]  # nothing was patched


def test_a_closed_port_is_unreachable(monkeypatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api_conn(monkeypatch, port)
    with pytest.raises(RuntimeError) as caught:
        AirflowApiHook().set_paused("wc_pipeline", True)
    message = str(caught.value)
    assert message.startswith(f"Airflow API at http://127.0.0.1:{port}/auth/token is unreachable (")
    assert "Connection refused" in message
    assert message.endswith("); check connection 'microcheckpoint_airflow_api'")


def test_no_api_connection_names_the_connection_id() -> None:
    with pytest.raises(ConfigError) as caught:
        AirflowApiHook("my_api").set_paused("wc_pipeline", True)
    assert (caught.value.field, caught.value.value) == ("api_conn_id", "my_api")
