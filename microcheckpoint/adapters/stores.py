"""Opening checkpoint storage by root URL: the file store, or the S3 adapter.

The storage package holds the port and the file store only, so nothing below the adapters
imports boto3; opening a store by URL picks an implementation, which is an adapter's
choice. Every edge opens stores through ``ops.stores.StorageSettings``, which calls this.
"""

from __future__ import annotations

from microcheckpoint.errors import StorageError
from microcheckpoint.storage import FileStore, ObjectStore

__all__ = ["open_store"]


def open_store(url: str, **s3_options: object) -> ObjectStore:
    """Open checkpoint storage by root URL: ``file:///path`` or ``s3://bucket/prefix``.

    ``s3_options`` (endpoint_url, region, credentials) go to the S3 adapter, imported only
    for an ``s3://`` URL (boto3 is not loaded for a file store). They are ignored for
    ``file://``.

    Raises:
        StorageError: any other scheme (the message names the URL and the two it takes).
    """
    if url.startswith("file://"):
        return FileStore(url)
    if url.startswith("s3://"):
        from microcheckpoint.adapters.s3 import S3Store

        return S3Store.from_url(url, **s3_options)  # type: ignore[arg-type]
    raise StorageError(
        f"unsupported checkpoint storage URL {url!r}: use file:///absolute/path or s3://bucket/prefix"
    )
