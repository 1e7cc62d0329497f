"""The store conformance probe: does checkpoint storage honour put-if-absent?

Every decision of the protocol that must be made once (a checkpoint id, an ack, an
outcome, the commit point) is a put-if-absent write. Some S3-compatible stores accept
``If-None-Match: *`` and ignore it (MinIO without read quorum, older gateways): the second
writer then overwrites the first and both believe they won. ``ensure_put_if_absent`` checks
a storage root once, before the first checkpoint, and refuses a store that does not honour
the condition.

Its files live under ``_probe/`` at the storage root, beside the pipelines' folders:
``_probe/if-none-match.ok`` records a passed probe (so it runs once per root), and the
probe's own objects are ``_probe/if-none-match/<token>`` (one per run, removed after it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid

from microcheckpoint.errors import StoreNotConformant
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = ["MARKER_KEY", "PROBE_PREFIX", "ensure_put_if_absent", "forget_probes"]

PROBE_PREFIX = "_probe/"
MARKER_KEY = PROBE_PREFIX + "if-none-match.ok"

_checked: set[str] = set()  # identities of stores that passed, in this process
_lock = threading.Lock()


def forget_probes() -> None:
    """Forget which stores passed in this process (for tests)."""
    with _lock:
        _checked.clear()


def ensure_put_if_absent(store: ObjectStore) -> bool:
    """Check once per storage root that ``store`` honours put-if-absent.

    Steps: 1. a store that passed in this process is not checked again; 2. a stored
    marker (``_probe/if-none-match.ok``) means a run passed before: one GET; 3. otherwise
    probe: put-if-absent bytes A under a new key, then put-if-absent bytes B under the same
    key: the second must be a CONFLICT and the key must still hold A (the probe object is
    removed either way); 4. write the marker.

    A probe run by two processes at once is harmless: each uses its own key.

    Returns:
        True when this call ran the probe, False when the store had passed before.

    Raises:
        StoreNotConformant: the store overwrote or lost the first write; nothing is marked,
            so the next call probes again.
        StorageError: the store could not be reached.
    """
    identity = store.identity
    # Step 1: this process knows.
    if identity in _checked:
        return False
    # Step 2: an earlier run passed.
    if store.get(MARKER_KEY) is not None:
        with _lock:
            _checked.add(identity)
        return False
    # Step 3: A, then B, under one new key.
    token = uuid.uuid4().hex
    key = f"{PROBE_PREFIX}if-none-match/{token}"
    first, second = f"probe {token} A".encode(), f"probe {token} B".encode()
    created = write_once(store, key, first)
    refused = write_once(store, key, second)
    stored = store.get(key)
    if created is not WriteOutcome.OK:
        store.delete(key)
        raise _refusal(store, key, "the first one, of a new key, answered CONFLICT")
    if refused is not WriteOutcome.CONFLICT:
        store.delete(key)
        raise _refusal(store, key, f"the second write answered {refused.value.upper()}")
    if stored is None or stored.data != first:
        store.delete(key)
        found = "nothing" if stored is None else "other bytes"
        raise _refusal(store, key, f"the second write answered CONFLICT but {found} is stored")
    # Step 4: clean up and remember.
    store.delete(key)
    marker = {"version": 1, "checked_at_ms": int(time.time() * 1000), "store": store.url}
    store.put(MARKER_KEY, json.dumps(marker, sort_keys=True).encode())
    with _lock:
        _checked.add(identity)
    return True


def _refusal(store: ObjectStore, key: str, what: str) -> StoreNotConformant:
    return StoreNotConformant(
        f"checkpoint storage {store.identity} does not honour put-if-absent "
        f"(If-None-Match: *): a second put-if-absent of {key} must be refused, but {what}. "
        "With such a store two writers can both win a checkpoint id, an ack or an outcome: "
        "checkpoints would hold duplicated or lost data, so no checkpoint is taken. Use a "
        "store that supports conditional writes (AWS S3, or MinIO with its read quorum "
        "available), or a file:// store"
    )
