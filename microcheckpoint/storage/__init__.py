"""Checkpoint storage: the port, the file store, and opening a store by URL."""

from __future__ import annotations

from microcheckpoint.errors import StorageError
from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import ObjectStore, StoredObject, WriteOutcome, swap, write_once

__all__ = [
    "FileStore",
    "ObjectStore",
    "StoredObject",
    "WriteOutcome",
    "open_store",
    "swap",
    "write_once",
]


def open_store(url: str, **s3_options: object) -> ObjectStore:
    """Open checkpoint storage by root URL: ``file:///path`` or ``s3://bucket/prefix``.

    ``s3_options`` (endpoint_url, region, credentials) go to the S3 adapter, which is
    imported only here, so the core stays free of boto3.
    """
    if url.startswith("file://"):
        return FileStore(url)
    if url.startswith("s3://"):
        from microcheckpoint.adapters.s3 import S3Store

        return S3Store.from_url(url, **s3_options)  # type: ignore[arg-type]
    raise StorageError(
        f"unsupported checkpoint storage URL {url!r}: use file:///absolute/path or s3://bucket/prefix"
    )
