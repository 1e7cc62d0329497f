"""The object-store port: what checkpoint storage promises, whatever the backend.

Guarantees every implementation gives (checked by ``tests/contract``):

1. **Atomic visibility.** A reader sees an object whole or not at all, never part of it.
2. **Put-if-absent.** ``put_if_absent`` creates an object only if no object has the key;
   of any number of concurrent callers for one key, at most one gets ``OK``.
3. **Compare-and-swap.** ``put_if_match`` replaces an object only if its current ETag is
   the one given; of concurrent callers with the same ETag, at most one gets ``OK``.
4. **Three outcomes.** A conditional write ends in exactly one of ``OK`` (it is written),
   ``CONFLICT`` (it is not, another writer's object is there) or ``UNKNOWN`` (the request
   may or may not have taken effect). ``UNKNOWN`` is resolved by reading back
   (``write_once`` / ``swap``), never by a blind retry, which could report the caller's
   own earlier success as a conflict.
5. **Consistent listing.** After a write or delete returns, ``list`` reflects it; keys come
   back sorted, and pagination is the implementation's concern.

Keys are ``/``-separated paths relative to the store's root URL.
"""

from __future__ import annotations

import abc
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from microcheckpoint.errors import CommitOutcomeUnknown

__all__ = [
    "CONCURRENCY",
    "ObjectStore",
    "StoredObject",
    "WriteOutcome",
    "ahead",
    "beside",
    "each",
    "started",
    "swap",
    "write_once",
]

T = TypeVar("T")
R = TypeVar("R")

# Requests a step sends at once when none depends on another (an S3 client pools 10
# connections by default).
CONCURRENCY = 8

# Pools per process, made on first use: starting threads costs about 2 ms each on a busy
# 2-core machine, more than a request to a local S3 server. A process forked after one was
# made (a Spark Python worker) makes its own: its parent's threads do not exist there.
# ``each`` and ``started`` send requests on the first; ``beside`` runs whole steps, which
# may use ``each`` themselves, on the second.
_POOLS: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_POOL_LOCK = threading.Lock()
_SIZES = {"storage": CONCURRENCY, "storage-step": 4}


def _pool(name: str = "storage") -> ThreadPoolExecutor:
    with _POOL_LOCK:
        made = _POOLS.get(name)
        if made is None or made[0] != os.getpid():
            made = (os.getpid(), ThreadPoolExecutor(_SIZES[name], thread_name_prefix=name))
            _POOLS[name] = made
        return made[1]


def each(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` of every item, up to ``CONCURRENCY`` at a time; results in the items' order.

    For requests that do not depend on each other (the acks a completion reads, the files
    retention deletes): on S3 each is a round trip of several milliseconds, so n of them
    cost about one instead of n. Every call finishes before the first error is raised.
    Stores must allow calls from several threads (the file store and boto3's client do).
    Not for calls that use ``each`` themselves (they would wait for the pool they hold).
    """
    work = list(items)
    if len(work) <= 1:
        return [fn(item) for item in work]
    futures = [_pool().submit(fn, item) for item in work]
    wait(futures)
    return [future.result() for future in futures]


def started(fn: Callable[[], R]) -> Future[R]:
    """``fn()`` begun now on the pool ``each`` uses, for a request that overlaps the
    caller's own (a listing sent while a sink publishes); ``.result()`` waits for it.
    Not for calls that use ``each`` themselves (see ``each``)."""
    return _pool().submit(fn)


def ahead(sent: Future[R] | None, again: Callable[[], R]) -> R:
    """The result of a read sent ahead of its need (``sent``), or ``again()``'s when none
    was sent or it failed: a read ahead fails nothing, the read made when the result is
    needed reports its own error."""
    if sent is not None:
        with contextlib.suppress(Exception):
            return sent.result()
    return again()


def beside(fn: Callable[[], R]) -> Future[R]:
    """``fn()`` begun now on a pool of its own, for a whole step that runs beside the
    caller's (retention's deletes while a sink publishes): unlike ``started``, ``fn`` may
    send its requests with ``each``. Not for calls that use ``beside`` themselves."""
    return _pool("storage-step").submit(fn)


class WriteOutcome(Enum):
    OK = "ok"
    CONFLICT = "conflict"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StoredObject:
    key: str
    data: bytes
    etag: str


class ObjectStore(abc.ABC):
    """Checkpoint storage: a flat key space of immutable-by-convention objects."""

    url: str
    # Whether a request is a network round trip (S3), worth sending before it is needed;
    # a local file system's reads are not.
    remote: bool = True

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject | None:
        """The object under ``key`` with its ETag, or None if there is none."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create or replace ``key`` atomically (unconditional)."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> WriteOutcome:
        """Create ``key`` only if absent. Never raises for a conflict; see the module doc."""

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str) -> WriteOutcome:
        """Replace ``key`` only if its ETag is ``etag`` (absent counts as a conflict)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    def delete_all(self, keys: Iterable[str]) -> None:
        """Remove every key of ``keys`` (missing ones are not an error), in no set order.

        By default one ``delete`` each, sent at once (``each``); a store that can remove
        many keys in one request (S3's DeleteObjects) does so. Every key is tried before
        the first error is raised.
        """
        each(self.delete, keys)

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key that starts with ``prefix`` (a plain string prefix), sorted."""

    def exists(self, key: str) -> bool:
        return self.get(key) is not None

    @property
    def identity(self) -> str:
        """What names this store in caches and messages: its URL, and where a client reaches
        it when that is not the URL alone (an S3 endpoint)."""
        return self.url

    def child_url(self, key: str) -> str:
        """The URL of ``key`` for messages and for other tools."""
        return f"{self.url.rstrip('/')}/{key}"


_RESOLVE_ATTEMPTS = 5


def write_once(store: ObjectStore, key: str, data: bytes) -> WriteOutcome:
    """Put-if-absent with ``UNKNOWN`` resolved by reading back.

    Steps: 1. try the conditional write; 2. on an unknown outcome, read the key:
    our exact bytes there means we won, other bytes mean we lost, nothing there means
    the write did not land and it is safe to try again (bounded).

    Callers make ``data`` unique per writer (an attempt token inside), so reading back
    our own bytes proves the win was ours.

    Raises:
        CommitOutcomeUnknown: the outcome stayed unknown after every attempt.
    """
    for attempt in range(_RESOLVE_ATTEMPTS):
        # Step 1: the conditional write.
        outcome = store.put_if_absent(key, data)
        if outcome is not WriteOutcome.UNKNOWN:
            return outcome
        # Step 2: resolve by reading, never by a blind retry.
        current = store.get(key)
        if current is not None:
            return WriteOutcome.OK if current.data == data else WriteOutcome.CONFLICT
        time.sleep(min(0.05 * 2**attempt, 1.0))
    raise CommitOutcomeUnknown(
        f"put-if-absent of {store.child_url(key)} stayed unknown after {_RESOLVE_ATTEMPTS} "
        "attempts; check that the store is reachable and run the step again"
    )


def swap(store: ObjectStore, key: str, data: bytes, etag: str) -> WriteOutcome:
    """Compare-and-swap with ``UNKNOWN`` resolved by reading back (see ``write_once``)."""
    for attempt in range(_RESOLVE_ATTEMPTS):
        outcome = store.put_if_match(key, data, etag)
        if outcome is not WriteOutcome.UNKNOWN:
            return outcome
        current = store.get(key)
        if current is not None and current.data == data:
            return WriteOutcome.OK
        if current is None or current.etag != etag:
            return WriteOutcome.CONFLICT
        time.sleep(min(0.05 * 2**attempt, 1.0))
    raise CommitOutcomeUnknown(
        f"compare-and-swap of {store.child_url(key)} stayed unknown after {_RESOLVE_ATTEMPTS} "
        "attempts; check that the store is reachable and run the step again"
    )
