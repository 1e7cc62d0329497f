"""Opening checkpoint storage: one way for every edge, from a URL and one set of S3 settings.

Every S3 client of a run (checkpoint storage, savepoint roots, a ``FileSink`` or
``FileSource`` on S3) is opened with the same ``StorageSettings``, so an endpoint given
once (``--s3-endpoint``, an Airflow connection, ``MICROCHECKPOINT_S3_ENDPOINT``) reaches
all of them. ``Locations`` says which folder URLs an operation may read or write: those
under the pipeline's storage root and its configured savepoint roots.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.errors import ConfigError
from microcheckpoint.storage import ObjectStore

__all__ = ["ENV_ENDPOINT", "Locations", "StorageSettings"]

ENV_ENDPOINT = "MICROCHECKPOINT_S3_ENDPOINT"


@dataclass(frozen=True)
class StorageSettings:
    """How to reach S3 (nothing is needed for ``file://`` URLs).

    Args:
        endpoint_url: an S3-compatible server; None means ``MICROCHECKPOINT_S3_ENDPOINT`` if
            set, else AWS.
        region: the S3 region (None: ``AWS_DEFAULT_REGION`` or us-east-1).
        access_key: with ``secret_key``; None uses boto3's credential chain.
        secret_key: the secret of ``access_key``.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, endpoint_url: str | None = None) -> StorageSettings:
        """``endpoint_url`` if given, else ``MICROCHECKPOINT_S3_ENDPOINT``; credentials from
        boto3's chain."""
        return cls(endpoint_url or os.environ.get(ENV_ENDPOINT) or None)

    def options(self, url: str) -> dict[str, Any]:
        """Keyword arguments of ``adapters.stores.open_store`` for ``url`` (empty for ``file://``)."""
        if not url.startswith("s3://"):
            return {}
        found = {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }
        return {k: v for k, v in found.items() if v}

    def s3_options(self) -> dict[str, Any]:
        """The S3 options alone (for components that open their own S3 URLs)."""
        return self.options("s3://")

    def open(self, url: str) -> ObjectStore:
        """The store at root ``url``."""
        return open_store(url, **self.options(url))


@dataclass
class Locations:
    """The folder URLs a pipeline's operations may use: under its storage root or one of
    its savepoint roots (Airflow's ``savepoint_roots``, the CLI's ``--savepoint-root``).

    Args:
        storage: the pipeline's checkpoint storage root (the first root).
        settings: how to open S3 roots.
        savepoint_roots: further roots where savepoints may be written and restored from.
    """

    storage: str
    settings: StorageSettings = field(default_factory=StorageSettings)
    savepoint_roots: tuple[str, ...] = ()
    _open: dict[str, ObjectStore] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.storage = self.storage.rstrip("/")
        roots = []
        for root in (self.storage, *self.savepoint_roots):
            if not (root.startswith("s3://") or root.startswith("file:///")):
                raise ConfigError(
                    "savepoint root", root, "a URL s3://bucket[/prefix] or file:///path"
                )
            roots.append(root.rstrip("/"))
        self.savepoint_roots = tuple(roots[1:])

    @property
    def roots(self) -> list[str]:
        """The storage root first, then the savepoint roots."""
        return [self.storage, *self.savepoint_roots]

    def store(self, root: str | None = None) -> ObjectStore:
        """The store of ``root`` (default: the storage root), opened once."""
        root = (root or self.storage).rstrip("/")
        if root not in self._open:
            self._open[root] = self.settings.open(root)
        return self._open[root]

    def split(self, url: str, what: str) -> tuple[str, str]:
        """``(root, key prefix inside it)`` of folder ``url``, under the deepest matching root.

        Raises:
            ConfigError: ``url`` lies outside every root, or has empty, ``.`` or ``..`` segments.
        """
        url = url.strip().rstrip("/")
        for root in sorted(self.roots, key=len, reverse=True):
            if url == root or url.startswith(root + "/"):
                inside = url[len(root) + 1 :]
                if inside and any(part in ("", ".", "..") for part in inside.split("/")):
                    raise ConfigError(what, url, "a path without empty, '.' or '..' segments")
                return root, inside
        raise ConfigError(
            what,
            url,
            f"a location under one of the configured roots ({', '.join(self.roots)}); add its "
            "root to savepoint_roots (Airflow) or --savepoint-root (CLI) to allow it",
        )

    def locate(self, url: str, what: str = "point") -> tuple[ObjectStore, str]:
        """The store and key prefix of folder ``url`` (see ``split``)."""
        root, prefix = self.split(url, what)
        return self.store(root), prefix

    def with_roots(self, roots: Iterable[str]) -> Locations:
        """The same settings with more savepoint roots."""
        return Locations(self.storage, self.settings, (*self.savepoint_roots, *roots))
