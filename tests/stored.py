"""Raw reads of stored protocol records, for tests that check the stored format itself, and
the versions a versioned bucket kept of them."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from microcheckpoint.storage.port import ObjectStore


def read_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The JSON object stored under ``key``, or None when there is none."""
    obj = store.get(key)
    return None if obj is None else json.loads(obj.data)


def object_versions(s3_client: Any, bucket: str, prefix: str) -> Counter[str]:
    """How many versions every key under ``prefix`` had (deleted ones included): in a
    versioned bucket, a put-if-absent record written once has exactly one."""
    counts: Counter[str] = Counter()
    paginator = s3_client.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        counts.update(v["Key"] for v in page.get("Versions", ()))
    return counts
