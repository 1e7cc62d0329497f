"""``s3://`` checkpoint storage over boto3 (AWS S3, SeaweedFS, MinIO, ...).

Conditional writes use ``If-None-Match: *`` (put-if-absent) and ``If-Match: <etag>``
(compare-and-swap). botocore's own retries are switched off: a retried conditional PUT
whose first try landed would come back as 412 and report our own win as a conflict.
Instead this adapter retries only what is known not to have taken effect (503 SlowDown,
409 ConditionalRequestConflict, a connection that never opened) with backoff, and returns
``UNKNOWN`` for the rest (5xx, read timeouts), which the port's helpers resolve by reading.
Idempotent calls (GET, unconditional PUT, DELETE, LIST) retry on 5xx and throttling.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlparse

import boto3
import boto3.session
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from microcheckpoint.errors import StorageError
from microcheckpoint.storage.port import ObjectStore, StoredObject, WriteOutcome, each

__all__ = ["S3Store", "ensure_bucket", "load_models"]

T = TypeVar("T")
_ATTEMPTS = 6
# Keys per DeleteObjects request: S3's maximum.
_DELETE_BATCH = 1000
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503"}
_NOT_APPLIED_CONNECT = (EndpointConnectionError, ConnectTimeoutError)
_MAYBE_APPLIED = (ReadTimeoutError, ConnectionClosedError)


def _code(exc: ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return str(error.get("Code", "")), status


def _backoff(attempt: int) -> None:
    time.sleep(min(0.05 * 2**attempt, 2.0))


# The adapter's boto3 session, per process, and the lock its clients are made under (a
# session is not thread-safe). Its response parser leaves timestamps as the text S3 sent:
# the adapter reads none, and botocore would parse every listed key's LastModified with
# dateutil, most of a listing's parse (300 keys on SeaweedFS: 61 ms a LIST, 27 ms without).
_SESSION: dict[int, boto3.session.Session] = {}
_SESSION_LOCK = threading.Lock()
# The data loader of every session this module makes, in this process and in the processes
# forked from it: botocore's models and endpoint rules, parsed from JSON on first use (about
# 80 ms of a process's first client), are kept in its cache, which a fork shares.
_LOADER = botocore.loaders.create_loader()


def _session() -> boto3.session.Session:
    pid = os.getpid()
    if pid not in _SESSION:
        core = botocore.session.get_session()
        core.register_component("data_loader", _LOADER)
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_as_text)
        _SESSION.clear()
        _SESSION[pid] = boto3.session.Session(botocore_session=core)
    return _SESSION[pid]


def _as_text(value: str) -> str:
    return value


def load_models() -> None:
    """Parse botocore's S3 model and endpoint rules into this module's data loader, as a
    client's creation does, without connecting: a process forked after this (an Airflow
    task from a worker that preloads, ``microcheckpoint_airflow.preload``) makes its first
    client without parsing them again."""
    make_client("http://127.0.0.1:9", "us-east-1", "preload", "preload")


def make_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Any:
    """A boto3 S3 client with path-style addressing and botocore retries off (timestamps in
    its answers are left as text)."""
    with _SESSION_LOCK:
        return _session().client(
            "s3",
            endpoint_url=_endpoint(endpoint_url),
            region_name=_region(region),
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                s3={"addressing_style": "path"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )


# This process's clients of the stores it opens by URL, by their settings. Spark reuses its
# Python workers from task to task, and a keyed or sink task opens its stores several times:
# a new client each time was 20-50 ms of the task (botocore builds its endpoint rules,
# handlers and configuration anew). boto3's clients are safe to share between threads.
_SHARED: dict[tuple[Any, ...], Any] = {}


def _endpoint(endpoint_url: str | None) -> str | None:
    return endpoint_url or os.environ.get("MICROCHECKPOINT_S3_ENDPOINT") or None


def _region(region: str | None) -> str:
    return region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def shared_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> Any:
    """``make_client``'s client for these settings, made once per process and reused (per
    process: a forked child makes its own, its parent's connections are not its). Without
    credentials, a client takes those of the process's session, as ``make_client`` does."""
    endpoint_url, region = _endpoint(endpoint_url), _region(region)
    key = (os.getpid(), endpoint_url, region, access_key, secret_key)
    client = _SHARED.get(key)
    if client is None:
        client = make_client(endpoint_url, region, access_key, secret_key)
        with _SESSION_LOCK:
            if len(_SHARED) >= 16 or any(k[0] != key[0] for k in _SHARED):
                _SHARED.clear()
            client = _SHARED.setdefault(key, client)
    return client


def ensure_bucket(client: Any, bucket: str) -> None:
    """Create ``bucket`` if it does not exist (for the local stack and the demo)."""
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)


class S3Store(ObjectStore):
    """Object store on an S3 bucket under an optional key prefix."""

    def __init__(self, client: Any, bucket: str, prefix: str = "", page_size: int = 1000) -> None:
        self.client = client
        self.page_size = page_size
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._endpoint = getattr(getattr(client, "meta", None), "endpoint_url", "") or "AWS"

    @property
    def identity(self) -> str:
        return f"{self.url} at {self._endpoint}"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise StorageError(f"{url!r} is not an s3://bucket[/prefix] URL")
        return cls(shared_client(**options), parsed.netloc, parsed.path)

    def _unkey(self, full: str) -> str:
        """The store's key of S3 key ``full`` (``_key`` undone: the prefix taken off)."""
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _key(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise StorageError(f"invalid object key {key!r}: use relative '/'-separated names")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _explain(self, exc: Exception, action: str, key: str) -> StorageError:
        if isinstance(exc, ClientError):
            code, status = _code(exc)
            if code == "NoSuchBucket":
                return StorageError(
                    f"bucket {self.bucket!r} does not exist at {self._endpoint}; create it or "
                    "fix the checkpoint storage URL"
                )
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return StorageError(
                    f"{action} {self.child_url(key)} was refused ({code}); check the S3 "
                    "credentials and the bucket policy"
                )
            return StorageError(f"{action} {self.child_url(key)} failed: {code} (HTTP {status})")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return StorageError(
                f"{action} {self.child_url(key)} needs S3 credentials and found none ({exc}); "
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, an AWS profile, or the "
                "storage connection's login and password"
            )
        if isinstance(exc, BotoCoreError) and not isinstance(
            exc, _NOT_APPLIED_CONNECT + _MAYBE_APPLIED
        ):
            return StorageError(
                f"{action} {self.child_url(key)} failed: {exc}; check the S3 settings "
                "(endpoint, region, credentials)"
            )
        return StorageError(
            f"{action} {self.child_url(key)} failed: S3 endpoint {self._endpoint} is unreachable "
            f"({exc}); check the endpoint URL and that the server runs"
        )

    def _idempotent(self, action: str, key: str, call: Callable[[], T]) -> T:
        """Run an idempotent request, retrying 5xx, throttling and connection errors."""
        for attempt in range(_ATTEMPTS):
            try:
                return call()
            except ClientError as exc:
                code, status = _code(exc)
                if (status >= 500 or code in _THROTTLED) and attempt < _ATTEMPTS - 1:
                    _backoff(attempt)
                    continue
                raise self._explain(exc, action, key) from exc
            except (*_NOT_APPLIED_CONNECT, *_MAYBE_APPLIED) as exc:
                if attempt < _ATTEMPTS - 1:
                    _backoff(attempt)
                    continue
                raise self._explain(exc, action, key) from exc
            except BotoCoreError as exc:  # no credentials, a bad setting: retrying cannot help
                raise self._explain(exc, action, key) from exc
        raise AssertionError("unreachable")

    def get(self, key: str) -> StoredObject | None:
        def call() -> StoredObject | None:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if _code(exc)[0] in ("NoSuchKey", "404"):
                    return None
                raise
            data = response["Body"].read()
            return StoredObject(key, data, response["ETag"].strip('"'))

        return self._idempotent("reading", key, call)

    def put(self, key: str, data: bytes) -> None:
        self._idempotent(
            "writing",
            key,
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data),
        )

    def _conditional(self, key: str, data: bytes, condition: dict[str, str]) -> WriteOutcome:
        for attempt in range(_ATTEMPTS):
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, **condition
                )
                return WriteOutcome.OK
            except ClientError as exc:
                code, status = _code(exc)
                if status == 412 or code == "PreconditionFailed":
                    return WriteOutcome.CONFLICT
                if status == 404 and "IfMatch" in condition:
                    return WriteOutcome.CONFLICT  # nothing to swap
                if code == "ConditionalRequestConflict" or status == 409 or code in _THROTTLED:
                    _backoff(attempt)  # known not applied: safe to send again
                    continue
                if status >= 500:
                    return WriteOutcome.UNKNOWN
                raise self._explain(exc, "conditionally writing", key) from exc
            except _NOT_APPLIED_CONNECT as exc:
                if attempt < _ATTEMPTS - 1:
                    _backoff(attempt)
                    continue
                raise self._explain(exc, "conditionally writing", key) from exc
            except _MAYBE_APPLIED:
                return WriteOutcome.UNKNOWN
            except BotoCoreError as exc:  # raised before sending: nothing was written
                raise self._explain(exc, "conditionally writing", key) from exc
        return WriteOutcome.UNKNOWN

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        return self._conditional(key, data, {"IfNoneMatch": "*"})

    def put_if_match(self, key: str, data: bytes, etag: str) -> WriteOutcome:
        return self._conditional(key, data, {"IfMatch": f'"{etag}"'})

    def delete(self, key: str) -> None:
        self._idempotent(
            "deleting",
            key,
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)),
        )

    def delete_all(self, keys: Iterable[str]) -> None:
        """DeleteObjects: up to ``_DELETE_BATCH`` keys a request, the requests sent at once.

        Quiet mode: the answer names only the keys S3 could not delete; the first of them
        is raised (a missing key is deleted, as DELETE has it). A retried request deletes
        again what it deleted before, which is no error either.
        """
        work = sorted(set(keys))
        if len(work) == 1:
            self.delete(work[0])
            return
        each(
            self._delete_batch,
            [work[i : i + _DELETE_BATCH] for i in range(0, len(work), _DELETE_BATCH)],
        )

    def _delete_batch(self, keys: list[str]) -> None:
        objects = [{"Key": self._key(k)} for k in keys]
        response = self._idempotent(
            f"deleting {len(keys)} keys, the first",
            keys[0],
            lambda: self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
            ),
        )
        failed = response.get("Errors") or []
        if failed:
            first = failed[0]
            raise StorageError(
                f"deleting {self.child_url(self._unkey(first.get('Key', '')))} failed: "
                f"{first.get('Code')} "
                f"({first.get('Message', '')}), and {len(failed) - 1} other key(s) of "
                f"{len(keys)} in one DeleteObjects request"
            )

    def list(self, prefix: str = "") -> Iterator[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")

        def pages() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(
                Bucket=self.bucket, Prefix=full, PaginationConfig={"PageSize": self.page_size}
            ):
                keys.extend(self._unkey(item["Key"]) for item in page.get("Contents", ()))
            return keys

        return iter(sorted(self._idempotent("listing", prefix or "", pages)))
