"""The S3 clients of stores opened by URL: one per process and settings (``shared_client``)."""

from __future__ import annotations

import os

import pytest

from microcheckpoint.adapters.s3 import S3Store, shared_client

SETTINGS = {
    "endpoint_url": "http://127.0.0.1:9",
    "region": "eu-west-1",
    "access_key": "key",
    "secret_key": "secret",
}


def test_stores_opened_with_the_same_settings_share_one_client() -> None:
    # A Spark task opens its stores several times, and a reused Python worker runs many
    # tasks: a client made each time cost 20-50 ms of the task (docs/engine.md).
    first = S3Store.from_url("s3://bucket/a", **SETTINGS)
    second = S3Store.from_url("s3://other/b", **SETTINGS)
    assert first.client is second.client
    assert (first.bucket, first.prefix, second.bucket, second.prefix) == (
        "bucket",
        "a",
        "other",
        "b",
    )


@pytest.mark.parametrize(
    "change",
    [
        {"endpoint_url": "http://127.0.0.1:10"},
        {"region": "us-east-2"},
        {"access_key": "other"},
        {"secret_key": "other"},
    ],
)
def test_other_settings_get_a_client_of_their_own(change: dict[str, str]) -> None:
    changed = shared_client(**{**SETTINGS, **change})
    assert changed is not shared_client(**SETTINGS)
    assert changed is shared_client(**{**SETTINGS, **change})


def test_a_client_from_the_environment_follows_the_environment(monkeypatch) -> None:
    # Without an endpoint or a region given, a client takes them from the environment when
    # it is made: a client made before the environment changed must not be handed out after.
    monkeypatch.setenv("MICROCHECKPOINT_S3_ENDPOINT", "http://127.0.0.1:11")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    before = shared_client(access_key="key", secret_key="secret")
    assert shared_client(access_key="key", secret_key="secret") is before
    assert (before.meta.endpoint_url, before.meta.region_name) == (
        "http://127.0.0.1:11",
        "eu-west-3",
    )
    monkeypatch.setenv("MICROCHECKPOINT_S3_ENDPOINT", "http://127.0.0.1:12")
    moved = shared_client(access_key="key", secret_key="secret")
    assert (moved.meta.endpoint_url, moved.meta.region_name) == ("http://127.0.0.1:12", "eu-west-3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-north-1")
    after = shared_client(access_key="key", secret_key="secret")
    assert (after.meta.endpoint_url, after.meta.region_name) == (
        "http://127.0.0.1:12",
        "eu-north-1",
    )


def test_a_forked_process_makes_its_own_client() -> None:
    # A client's pooled connections are its process's: a child (an Airflow task forked from
    # its worker) must not send on its parent's sockets.
    parent = shared_client(**SETTINGS)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        child = shared_client(**SETTINGS)
        os.write(
            write, b"own" if child is not parent and child is shared_client(**SETTINGS) else b"same"
        )
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 10) == b"own"
    assert shared_client(**SETTINGS) is parent
