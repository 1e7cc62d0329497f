"""``file://`` checkpoint storage: the embedded default.

Atomic visibility by writing a temporary file in the same folder and renaming it;
put-if-absent by hard-linking the temporary file to the key (the link fails if the key
exists, so it cannot be won twice, also across processes); compare-and-swap under an
advisory lock on one lock file per store. Names starting with ``.`` are internal and
never listed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from microcheckpoint.errors import StorageError
from microcheckpoint.storage.port import ObjectStore, StoredObject, WriteOutcome

__all__ = ["FileStore"]

_LOCK_NAME = ".mcp-cas.lock"


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class FileStore(ObjectStore):
    """Object store on a local (or shared POSIX) file system."""

    remote = False

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "file" or not parsed.path.startswith("/"):
            raise StorageError(f"{url!r} is not a file:///absolute/path URL")
        self.root = Path(unquote(parsed.path))
        self.url = "file://" + str(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create checkpoint storage folder {self.root}: {exc.strerror}; "
                "check the path and its permissions"
            ) from exc

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise StorageError(f"invalid object key {key!r}: use relative '/'-separated names")
        return self.root / key

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex}"
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    def get(self, key: str) -> StoredObject | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return None
        return StoredObject(key, data, _etag(data))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        temp = self._write_temp(path, data)
        os.replace(temp, path)

    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        path = self._path(key)
        temp = self._write_temp(path, data)
        try:
            os.link(temp, path)
            return WriteOutcome.OK
        except FileExistsError:
            return WriteOutcome.CONFLICT
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.ETIMEDOUT, errno.ESTALE):
                return WriteOutcome.UNKNOWN
            raise StorageError(f"cannot write {path}: {exc.strerror}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    def put_if_match(self, key: str, data: bytes, etag: str) -> WriteOutcome:
        path = self._path(key)
        with open(self.root / _LOCK_NAME, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current = self.get(key)
                if current is None or current.etag != etag:
                    return WriteOutcome.CONFLICT
                os.replace(self._write_temp(path, data), path)
                return WriteOutcome.OK
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Prune folders left empty, up to the root.
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str = "") -> Iterator[str]:
        # Walk only below the deepest folder the prefix names.
        folder = prefix.rpartition("/")[0]
        start = self.root / folder if folder else self.root
        if not start.is_dir():
            return iter(())
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith("."):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))
