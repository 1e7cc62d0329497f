"""Checkpoint storage: the port and the file store.

Opening a store by URL (the file store or S3) is ``microcheckpoint.adapters.stores.open_store``:
the S3 store is an adapter, and this package imports none.
"""

from __future__ import annotations

from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import (
    ObjectStore,
    StoredObject,
    WriteOutcome,
    each,
    swap,
    write_once,
)

__all__ = [
    "FileStore",
    "ObjectStore",
    "StoredObject",
    "WriteOutcome",
    "each",
    "swap",
    "write_once",
]
