"""Bootstrap an operator's keyed state from a table into a new savepoint (``state import``).

Flink's State Processor API writes a savepoint from a data set; this is its counterpart for
one keyed operator. The table is what ``state export`` writes: columns ``key`` and ``state``,
both JSON text, one row per key. The savepoint is a self-contained folder like
``protocol.savepoints.create_savepoint``'s: a ``_metadata`` of kind ``savepoint`` with
handles relative to it, written last, and beside it the operator's state as the engine
writes a compacted snapshot: per subtask one ``base.parquet`` of state rows (key group,
canonical key, state JSON, update time), sorted by key group and key, over the key groups
the subtask owns. The files do not depend on the parallelism the pipeline restores with:
state is found by key group.

What else the savepoint holds:

- **Other operators' state.** When the pipeline has a completed checkpoint, its latest one
  gives every other operator's state, unchanged (its files are copied), so an import
  replaces one operator's state. Without a checkpoint, the savepoint holds only the
  imported operator.
- **Source offsets** (``offsets``): ``checkpoint``, the latest checkpoint's offsets (the
  default when there is one: the pipeline resumes where it was); ``startup``, none (the
  default otherwise, as a Flink bootstrap savepoint has no source state): on restore every
  partition starts where the pipeline's ``startup_mode`` says (its consumer group's
  committed offsets by default, else the log start); or explicit
  ``topic:partition=offset`` pairs, comma separated (an offset is the next one to read;
  partitions not named start at their startup offsets).

Pure: pyarrow and the object-store port, no Spark or Kafka client.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import ConfigError, InvalidValue, RestoreError
from microcheckpoint.ids import CheckpointId, OperatorUid, TaskId, TopicPartition
from microcheckpoint.protocol.barrier import Barrier, OffsetRange
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.records import Ack, CheckpointMetadata, encode_metadata
from microcheckpoint.protocol.savepoints import savepoint_folder
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.backends import canonical_key
from microcheckpoint.state.evolution import DESCRIPTORS_FIELD, recorded_descriptors
from microcheckpoint.state.files import BASE_NAME, encode_rows, read_parquet, rows_from_groups
from microcheckpoint.state.handles import StateHandle
from microcheckpoint.state.keygroups import (
    SCHEME_FIELD,
    key_group_for,
    key_group_range,
    subtask_for_key_group,
)
from microcheckpoint.state.kinds import TIMERS_KEY
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, write_once

__all__ = ["Bootstrapped", "bootstrap_savepoint", "read_state_table"]

DEFAULT_PARALLELISM = 2  # the parallelism ``microcheckpoint run`` defaults to
_PAIR = re.compile(r"(.+):(\d+)=(\d+)")
_OFFSETS_HELP = (
    "checkpoint (the latest checkpoint's), startup (the pipeline's startup_mode decides), or "
    "TOPIC:PARTITION=OFFSET pairs separated by commas, e.g. lines:0=42,lines:1=40"
)


@dataclass(frozen=True)
class Bootstrapped:
    """What ``bootstrap_savepoint`` wrote: the savepoint's URL and, for people, its contents."""

    url: str
    uid: str
    keys: int
    parallelism: int
    max_parallelism: int
    offsets: str  # how the source offsets were chosen
    carried_from: CheckpointId | None  # the checkpoint other operators' state came from
    carried_uids: tuple[str, ...] = ()


def read_state_table(path: str) -> dict[str, Any]:
    """``{canonical key: state}`` from a Parquet table of ``key`` and ``state`` JSON text.

    Other columns are ignored. Keys are compared by their canonical JSON (the engine's key
    identity), so JSON spacing and key order in objects do not matter.

    Raises:
        ConfigError: not a readable Parquet file, or no string columns ``key`` and ``state``.
        InvalidValue: a row whose key or state is not JSON, a null state, a repeated key.
    """
    fix = (
        "a Parquet file with the string columns key and state (JSON text), as `state export` writes"
    )
    try:
        table = read_parquet(path)
    except FileNotFoundError:
        raise ConfigError("from", path, f"{fix}; there is no such file") from None
    except (OSError, pa.ArrowException) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError("from", path, f"{fix}; it is not Parquet ({detail})") from None
    columns = {f.name: f.type for f in table.schema}
    if not all(_is_text(columns.get(c)) for c in ("key", "state")):
        found = ", ".join(f"{name} {kind}" for name, kind in columns.items())
        raise ConfigError("from", path, f"{fix}; its columns are {found or 'none'}")
    states: dict[str, Any] = {}
    row_of: dict[str, int] = {}
    keys, texts = table.column("key").to_pylist(), table.column("state").to_pylist()
    for row, (key_text, text) in enumerate(zip(keys, texts, strict=True), start=1):
        where = f"row {row} of {path}"
        if key_text is None:
            raise InvalidValue(f"{where}: the key is a null cell; write every key as JSON text")
        key = _json(key_text, f"{where}: key {key_text!r}", 'write keys as JSON: "to" with quotes')
        state = _json(text, f"{where}: state {text!r} of key {key_text}", "write states as JSON")
        if state is None:
            raise InvalidValue(f"{where}: key {key_text} has no state (null); drop the row")
        ck = canonical_key(key)
        if ck in states:
            raise InvalidValue(
                f"rows {row_of[ck]} and {row} of {path} hold the same key {ck}; keep one row per key"
            )
        states[ck], row_of[ck] = state, row
    return states


def _is_text(kind: pa.DataType | None) -> bool:
    return kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _json(text: str | None, what: str, fix: str) -> Any:
    """The value of a JSON cell; a null cell is null."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidValue(f"{what} is not JSON ({exc}); {fix}, as `state export` does") from None


def bootstrap_savepoint(
    store: ObjectStore,
    pipeline: str,
    uid: str,
    states: Mapping[str, Any],
    *,
    parallelism: int | None = None,
    max_parallelism: int | None = None,
    offsets: str | None = None,
    target: ObjectStore | None = None,
    target_prefix: str | None = None,
    now_ms: int | None = None,
    timers: Mapping[str, list[list[Any]]] | None = None,
    groups: Mapping[int, Mapping[str, Any]] | None = None,
    descriptors: list[dict[str, Any]] | None = None,
) -> Bootstrapped:
    """Write a new savepoint of ``pipeline`` whose operator ``uid`` holds ``states``.

    Steps: 1. read the pipeline's latest completed checkpoint, if any, and check ``uid``,
    the parallelism and the key groups against it; 2. choose the source offsets; 3. split
    the state into key groups and subtasks; 4. read the other operators' state files;
    5. write each subtask's base file and copy the other files; 6. write the ``_metadata``
    last, put-if-absent, so the savepoint is whole or absent. Nothing is written before
    every check passed and every file was read.

    Args:
        store: the pipeline's checkpoint storage.
        states: ``{canonical key: state}`` (``read_state_table``).
        parallelism: subtasks to split the state into (default: the operator's in the latest
            checkpoint, else 2); a restore may choose any other.
        max_parallelism: key groups (default: the latest checkpoint's, else 128); must be the
            pipeline's ``max_parallelism``.
        offsets: ``checkpoint``, ``startup`` or ``topic:partition=offset,…`` (module doc).
        target, target_prefix: where the savepoint folder is made (default: the pipeline's
            ``savepoints/`` in ``store``).
        now_ms: the state's update time, from which a TTL counts (default: now).
        timers, groups, descriptors: a keyed process function's pending timers per
            canonical key, key-group entries (``{kg: {pseudo key: value}}``) and state
            descriptors (``state.offline``); subtask 0's ack records the descriptors. None
            for a plain function's values.

    Raises:
        ConfigError: a uid the pipeline's checkpoints do not have as a keyed operator (or
            have as a process function when the table is a plain function's, or the other
            way round), a
            parallelism or max_parallelism out of range or unlike the checkpoints', an
            offsets value that is malformed or names partitions the pipeline does not read.
        InvalidValue: a malformed uid.
        RestoreError: a state file of the latest checkpoint is missing, or the folder exists.
    """
    # Step 1: the latest checkpoint and the checks against it.
    OperatorUid(uid)
    layout = Layout(pipeline)
    view = scan(store, layout)
    cid = view.latest_completed
    meta = view.metadata(cid) if cid is not None else None
    max_parallelism = _max_parallelism(meta, max_parallelism)
    if meta is not None:
        _check_uid(meta, pipeline, uid)
        _check_layout(meta, uid, descriptors)
    if parallelism is None:
        own = [t for t in meta.acks if t.uid.value == uid] if meta is not None else []
        parallelism = len(own) or DEFAULT_PARALLELISM
    key_group_range(max_parallelism, parallelism, 0)  # refuses a parallelism out of range
    # Step 2: the source offsets.
    barrier, how = _choose_offsets(meta, cid, offsets, f"{pipeline!r} in {store.url}")
    # Step 3: key groups and subtasks.
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    owned_by: list[dict[int, dict[str, tuple[Any, int]]]] = [{} for _ in range(parallelism)]

    def place(kg: int, key: str, value: Any) -> None:
        subtask = subtask_for_key_group(max_parallelism, parallelism, kg)
        owned_by[subtask].setdefault(kg, {})[key] = (value, now_ms)

    for ck, state in states.items():
        place(key_group_for(ck.encode(), max_parallelism), ck, state)
    by_group: dict[int, dict[str, Any]] = {}
    for ck, entries in sorted((timers or {}).items()):
        by_group.setdefault(key_group_for(ck.encode(), max_parallelism), {})[ck] = entries
    for kg, group_timers in by_group.items():
        place(kg, TIMERS_KEY, group_timers)
    for kg, pseudo in (groups or {}).items():
        for key, value in pseudo.items():
            place(kg, key, value)
    # Step 4: read every other operator's files first, so a missing one writes nothing.
    # A sink's staged parts are output the checkpoint already published, not state: they
    # are left behind (the sink's ack stays, without files).
    kept = {
        task: replace(ack, handles=tuple(h for h in ack.handles if not _sink_part(task, h)))
        for task, ack in (meta.acks.items() if meta else ())
        if task.uid.value != uid
    }
    carried = {
        task: (ack, [_read(store, meta, h) for h in ack.handles])  # type: ignore[arg-type]
        for task, ack in kept.items()
    }
    # Step 5: the files. The imported operator: one base file per subtask holding keys, as
    # a compacting subtask writes it. The others: their files, unchanged.
    target = target or store
    name = f"bootstrap-{uid}-{uuid.uuid4().hex[:6]}"
    prefix = savepoint_folder(layout, target_prefix, name)
    acks: dict[TaskId, Ack] = {}
    for subtask, owned in enumerate(owned_by):
        task = TaskId.of(uid, subtask)
        handles: tuple[StateHandle, ...] = ()
        if owned:
            key = f"files/bootstrap/state/{uid}/{subtask:05d}/{BASE_NAME}"
            data = encode_rows(rows_from_groups(owned))
            target.put(prefix + key, data)
            handles = (StateHandle.of(key, data, sorted(owned)),)
        info = {DESCRIPTORS_FIELD: descriptors} if descriptors is not None and not subtask else {}
        acks[task] = Ack(task, meta.attempt if meta else 1, handles, info)
    for task, (ack, files) in carried.items():
        acks[task] = _carry(target, prefix, ack, files, meta, barrier)  # type: ignore[arg-type]
    # Step 6: the savepoint's commit point.
    saved = CheckpointMetadata(
        pipeline=pipeline,
        # A savepoint names the checkpoint it was taken from; a first bootstrap, checkpoint 1.
        checkpoint_id=cid or CheckpointId(1),
        attempt=meta.attempt if meta else 1,
        barrier=barrier,
        acks=acks,
        trigger_time_ms=now_ms,
        completed_time_ms=now_ms,
        config=dict(meta.config) if meta else _config(store, pipeline, max_parallelism),
        kind="savepoint",
        relative=True,
        writer=f"state import {uid}",
    )
    if write_once(target, prefix + "_metadata", encode_metadata(saved)) is not WriteOutcome.OK:
        raise RestoreError(f"savepoint {target.child_url(prefix)} already exists")
    return Bootstrapped(
        url=target.child_url(prefix + "_metadata").rsplit("/", 1)[0],
        uid=uid,
        keys=len({*states, *(timers or {})}),
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        offsets=how,
        carried_from=cid,
        carried_uids=tuple(sorted({t.uid.value for t in carried})),
    )


def _sink_part(task: TaskId, handle: StateHandle) -> bool:
    """A staged sink part (``Layout.sink_part``), in a checkpoint or a savepoint's copy."""
    return f"sink/{task.uid}/part-" in handle.key


def _max_parallelism(meta: CheckpointMetadata | None, given: int | None) -> int:
    stored = None if meta is None else meta.config.get("max_parallelism", 128)
    if given is not None and not 1 <= given <= 32768:
        raise ConfigError("max_parallelism", given, "an integer from 1 to 32768")
    if given is not None and stored is not None and given != stored:
        raise ConfigError(
            "max_parallelism",
            given,
            f"the pipeline's max_parallelism {stored} (checkpoint {meta.checkpoint_id}): "  # type: ignore[union-attr]
            "it fixes which key group every key is in; leave it out",
        )
    return int(given or stored or 128)


def _check_uid(meta: CheckpointMetadata, pipeline: str, uid: str) -> None:
    """``uid`` must be a keyed operator of the checkpoint: not a source (whose acks carry
    offsets) nor a sink (whose files hold no key groups)."""
    keyed = sorted(
        {
            t.uid.value
            for t, ack in meta.acks.items()
            if not set(ack.operator_state) - {DESCRIPTORS_FIELD, SCHEME_FIELD}
            and all(h.key_groups for h in ack.handles)
        }
    )
    if uid not in keyed:
        raise ConfigError(
            "uid",
            uid,
            f"a keyed operator uid of {pipeline!r} (checkpoint {meta.checkpoint_id}): {keyed}",
        )


def _check_layout(
    meta: CheckpointMetadata, uid: str, descriptors: list[dict[str, Any]] | None
) -> None:
    """A table of named states goes into a keyed process function, a table of plain values
    into a plain ``KeyedOperator(fn)``, as the latest checkpoint has the operator."""
    recorded = recorded_descriptors(meta).get(uid)
    if (recorded is None) != (descriptors is None):
        has = "a keyed process function" if recorded is not None else "a plain KeyedOperator(fn)"
        wants = "with key, state and timers columns and descriptors" if recorded else "of values"
        raise ConfigError(
            "from",
            "a table of " + ("named states" if descriptors is not None else "plain values"),
            f"a table {wants}, as `state export` writes for {uid!r} ({has} in checkpoint "
            f"{meta.checkpoint_id})",
        )


def _choose_offsets(
    meta: CheckpointMetadata | None, cid: CheckpointId | None, text: str | None, pipeline: str
) -> tuple[Barrier, str]:
    """The savepoint's barrier (its ends are the offsets a restore starts at) and a phrase."""
    choice = (text or ("checkpoint" if meta is not None else "startup")).strip()
    if choice == "checkpoint":
        if meta is None:
            raise ConfigError(
                "offsets",
                choice,
                f"startup or explicit offsets: pipeline {pipeline} has no completed checkpoint",
            )
        return meta.barrier, f"those of checkpoint {cid}"
    if choice == "startup":
        return Barrier({}), "none (the source starts at its startup offsets)"
    given: dict[TopicPartition, int] = {}
    for pair in choice.split(","):
        match = _PAIR.fullmatch(pair.strip())
        if not match:
            raise ConfigError("offsets", choice, _OFFSETS_HELP)
        try:
            tp = TopicPartition(match.group(1), int(match.group(2)))
        except InvalidValue as exc:
            raise ConfigError("offsets", choice, f"{_OFFSETS_HELP} ({exc})") from None
        given[tp] = int(match.group(3))
    if meta is not None:
        topics = sorted({tp.topic for tp in meta.offsets})
        unknown = sorted(str(tp) for tp in given if tp.topic not in topics)
        if unknown:
            raise ConfigError(
                "offsets", choice, f"partitions of the pipeline's topics {topics}, not {unknown}"
            )
    ranges = {tp: OffsetRange(o, o) for tp, o in sorted(given.items())}
    return Barrier(ranges), "as given (other partitions: startup offsets)"


def _read(store: ObjectStore, meta: CheckpointMetadata, handle: StateHandle) -> bytes:
    obj = store.get(handle.key)
    if obj is None:
        raise RestoreError(
            f"checkpoint {meta.checkpoint_id}: {store.child_url(handle.key)} is missing; "
            "restore an older checkpoint first, or import with no checkpoint to carry"
        )
    return handle.check(obj.data, store.child_url(handle.key))


def _carry(
    target: ObjectStore,
    prefix: str,
    ack: Ack,
    files: list[bytes],
    meta: CheckpointMetadata,
    barrier: Barrier,
) -> Ack:
    """``ack`` of the latest checkpoint with its files written under the savepoint folder
    (handles relative to it, as ``create_savepoint`` makes them). The source's ack keeps
    the offsets as its state, so it follows the chosen offsets."""
    handles = []
    for handle, data in zip(ack.handles, files, strict=True):
        relative = "files/" + handle.key.split("/", 1)[1]
        target.put(prefix + relative, data)
        handles.append(replace(handle, key=relative))
    state = dict(ack.operator_state)
    if state and state == {str(tp): o for tp, o in meta.offsets.items()}:
        state = {str(tp): o for tp, o in barrier.ends.items()}
    return replace(ack, handles=tuple(handles), operator_state=state)


def _config(store: ObjectStore, pipeline: str, max_parallelism: int) -> dict[str, Any]:
    """A first bootstrap's configuration: the defaults, with its key groups."""
    values = {"pipeline": pipeline, "storage": store.url, "max_parallelism": max_parallelism}
    return CheckpointConfig.from_mapping(values).to_mapping()
