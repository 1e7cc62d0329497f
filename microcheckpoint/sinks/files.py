"""File sink: JSON-lines or Parquet files on S3 or local storage under per-epoch manifests.

Layout under the target root: ``<pipeline>/<uid>/epoch-<n>/part-<i>.<ext>`` data files and
``<pipeline>/<uid>/_manifests/epoch-<n>.json``, written last with put-if-absent. An epoch is
visible iff its manifest exists, and ``read_committed`` reads only files that a manifest
lists; so a crash halfway through publishing leaves nothing visible, and publishing again
rewrites the same file names and finds or writes the one manifest: nothing is visible twice.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from microcheckpoint.adapters.stores import open_store
from microcheckpoint.errors import ConfigError, StorageError
from microcheckpoint.sinks.base import EpochInfo, Row, Sink
from microcheckpoint.storage import ObjectStore, WriteOutcome, each, write_once
from microcheckpoint.storage.port import ahead, started

__all__ = ["FileSink", "read_committed"]

FORMATS = {"jsonl": "jsonl", "parquet": "parquet"}


def _encode(rows: Sequence[Row], fmt: str) -> bytes:
    if fmt == "jsonl":
        return b"".join(json.dumps(r, sort_keys=True, default=str).encode() + b"\n" for r in rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(list(rows)), sink)
    return sink.getvalue()


def _decode(data: bytes, fmt: str) -> list[Row]:
    if fmt == "jsonl":
        return [json.loads(line) for line in data.splitlines() if line]
    from microcheckpoint.state.files import read_parquet

    return read_parquet(data).to_pylist()


class FileSink(Sink):
    """Exactly-once files under ``target`` (``file:///path`` or ``s3://bucket/prefix``)."""

    waits_for_restorable = True  # its data files are invisible until the manifest

    def __init__(
        self,
        uid: str,
        target: str,
        format: str = "jsonl",
        store_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(uid)
        if format not in FORMATS:
            raise ConfigError("format", format, f"one of {', '.join(FORMATS)}")
        self.target = target
        self.format = format
        self.store_options = dict(store_options or {})
        self._store: ObjectStore | None = None
        # Looks for a manifest that ``prepare`` began, by manifest key.
        self._looked: dict[str, Future[bool]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_looked": {}}

    def use_storage(self, s3_options: dict[str, Any]) -> None:
        """An ``s3://`` target built without options of its own takes the run's."""
        if self.target.startswith("s3://") and not self.store_options and s3_options:
            self.store_options = dict(s3_options)
            self._store = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.target, **self.store_options)
        return self._store

    def _base(self, epoch: EpochInfo) -> str:
        return f"{epoch.pipeline}/{self.uid}/"

    def _manifest(self, epoch: EpochInfo) -> str:
        return f"{self._base(epoch)}_manifests/epoch-{epoch.checkpoint_id:010d}.json"

    def prepare(self, epoch: EpochInfo) -> None:
        """Look for the epoch's manifest now (``commit``'s step 1), beside the completion."""
        manifest = self._manifest(epoch)
        # One epoch is prepared at a time: a look not taken (its epoch aborted) goes.
        self._looked = {manifest: started(partial(self.store.exists, manifest))}

    def commit(self, epoch: EpochInfo, parts: Sequence[Sequence[Row]]) -> None:
        """Publish epoch ``n``: part files first, the manifest last (put-if-absent).

        Steps: 1. an existing manifest means the epoch is published: stop (the look
        ``prepare`` began, else one now; one that failed is sent again); 2. write every
        part file under its deterministic name; 3. once the checkpoint is restorable
        (``epoch.wait_restorable``), write the manifest once.
        """
        base = self._base(epoch)
        manifest = self._manifest(epoch)
        # Step 1: already published (a retried or zombie notify).
        if ahead(self._looked.pop(manifest, None), partial(self.store.exists, manifest)):
            return
        # Step 2: the data files (invisible until the manifest lists them).
        files = [
            {
                "key": f"{base}epoch-{epoch.checkpoint_id:010d}/part-{i:05d}.{self.format}",
                "rows": len(rows),
            }
            for i, rows in enumerate(parts)
        ]
        each(
            lambda fr: self.store.put(fr[0]["key"], _encode(fr[1], self.format)),
            zip(files, parts, strict=True),
        )  # the parts do not depend on each other: sent at once
        # Step 3: the commit point of the epoch's output, once the checkpoint's.
        epoch.wait_restorable()
        body = {
            "pipeline": epoch.pipeline,
            "uid": self.uid,
            "epoch": epoch.checkpoint_id,
            "format": self.format,
            "files": files,
        }
        outcome = write_once(self.store, manifest, json.dumps(body, sort_keys=True).encode())
        if outcome is WriteOutcome.CONFLICT:
            return  # a concurrent notifier published the same epoch first

    def write_at_least_once(self, epoch: EpochInfo, part: int, rows: Sequence[Row]) -> None:
        """Publish one part now under a unique name: a replay publishes it again (duplicates)."""
        base = self._base(epoch)
        tag = uuid.uuid4().hex[:8]
        key = f"{base}epoch-{epoch.checkpoint_id:010d}/alo-part-{part:05d}-{tag}.{self.format}"
        self.store.put(key, _encode(rows, self.format))
        manifest = f"{base}_manifests/epoch-{epoch.checkpoint_id:010d}-part-{part:05d}-{tag}.json"
        body = {
            "pipeline": epoch.pipeline,
            "uid": self.uid,
            "epoch": epoch.checkpoint_id,
            "format": self.format,
            "files": [{"key": key, "rows": len(rows)}],
        }
        self.store.put(manifest, json.dumps(body, sort_keys=True).encode())


def read_committed(
    target: str, pipeline: str, uid: str, store_options: dict[str, Any] | None = None
) -> list[Row]:
    """Every row of every published epoch, in epoch order (only files a manifest lists)."""
    store = open_store(target, **(store_options or {}))
    rows: list[Row] = []
    for key in store.list(f"{pipeline}/{uid}/_manifests/"):
        obj = store.get(key)
        if obj is None:
            continue
        body = json.loads(obj.data)
        for entry in body["files"]:
            data = store.get(entry["key"])
            if data is None:
                raise StorageError(f"{store.child_url(entry['key'])} listed by {key} is missing")
            rows.extend(_decode(data.data, body["format"]))
    return rows
