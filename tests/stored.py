"""Raw reads of stored protocol records, for tests that check the stored format itself."""

from __future__ import annotations

import json
from typing import Any

from microcheckpoint.storage.port import ObjectStore


def read_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The JSON object stored under ``key``, or None when there is none."""
    obj = store.get(key)
    return None if obj is None else json.loads(obj.data)
