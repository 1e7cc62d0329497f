"""docs/deploy.md says what the code does: the connections, the Spark settings the job sets
itself, and the store probe's refusal word for word."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from microcheckpoint.engine.spark import EPOCH_SETTINGS
from microcheckpoint.errors import StoreNotConformant
from microcheckpoint.storage import ObjectStore, StoredObject, WriteOutcome
from microcheckpoint.storage.probe import ensure_put_if_absent, forget_probes
from microcheckpoint_airflow import SparkConnect, SparkSubmit
from microcheckpoint_airflow.hooks import (
    DEFAULT_API_CONN_ID,
    DEFAULT_KAFKA_CONN_ID,
    DEFAULT_STORAGE_CONN_ID,
)
from microcheckpoint_airflow.provider import API_CONN_TYPE, KAFKA_CONN_TYPE, STORAGE_CONN_TYPE

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def section(text: str, heading: str) -> str:
    """The body of the section ``heading`` (up to the next heading of any level)."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = text.find("\n#", start)
    return text[start : end if end != -1 else len(text)]


class IgnoringStore(ObjectStore):
    """An in-memory S3 root that takes ``If-None-Match: *`` and ignores it."""

    url = "s3://my-bucket/checkpoints"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    @property
    def identity(self) -> str:
        return f"{self.url} at https://s3.example.com"

    def get(self, key: str) -> StoredObject | None:
        data = self.objects.get(key)
        return None if data is None else StoredObject(key, data, str(hash(data)))

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        self.objects[key] = data  # the condition is ignored
        return WriteOutcome.OK

    def put_if_match(self, key: str, data: bytes, etag: str) -> WriteOutcome:
        self.objects[key] = data
        return WriteOutcome.OK

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter(sorted(k for k in self.objects if k.startswith(prefix)))


@pytest.fixture(autouse=True)
def _fresh_probe_cache() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def test_the_connection_table_names_each_id_with_its_type() -> None:
    rows = re.findall(
        r"^\| `([^`]+)` \| `([^`]+)` \|", section(DOC.read_text(), "### Connections"), re.M
    )

    assert set(rows) == {
        (DEFAULT_STORAGE_CONN_ID, STORAGE_CONN_TYPE),
        (DEFAULT_KAFKA_CONN_ID, KAFKA_CONN_TYPE),
        (DEFAULT_API_CONN_ID, API_CONN_TYPE),
        (SparkSubmit().conn_id, "spark"),
        (SparkConnect().conn_id, "spark_connect"),
    }
    assert len(rows) == 5


def test_the_epoch_settings_listed_are_the_engines() -> None:
    spark = section(DOC.read_text(), "## Spark")
    listed = spark[spark.index("`EPOCH_SETTINGS` (") : spark.index("), `spark.sql.shuffle")]

    assert dict(re.findall(r"`([\w.]+)=(\w+)`", listed)) == EPOCH_SETTINGS


def test_the_quoted_refusal_is_the_probes_message() -> None:
    store = IgnoringStore()
    probe = section(DOC.read_text(), "### What the store must do, and the probe")
    quoted = re.search(r"```\n(checkpoint storage .*?)\n```", probe, re.S)
    assert quoted is not None, "deploy.md quotes no refusal in its probe section"

    with pytest.raises(StoreNotConformant) as exc:
        ensure_put_if_absent(store)

    message = re.sub(r"(_probe/if-none-match/)[0-9a-f]{32}", r"\1<token>", str(exc.value))
    assert message == quoted.group(1)
    assert store.objects == {}  # refused: no marker, the probe object removed
