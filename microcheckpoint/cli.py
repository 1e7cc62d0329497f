"""``microcheckpoint``: checkpoints and savepoints from the command line, as Flink's CLI.

    microcheckpoint --storage s3://bucket/checkpoints --pipeline wordcount list
    microcheckpoint ... show 7
    microcheckpoint ... savepoint [--target URL] [--stop]
    microcheckpoint ... restore POINT [--claim] [--parallelism N]
    microcheckpoint ... verify POINT [--bootstrap host:port]
    microcheckpoint ... state export --uid word-counts [--checkpoint 7] --to counts.parquet
    microcheckpoint ... state import --uid word-counts --from counts.parquet [--offsets startup]
    microcheckpoint ... run --module examples.wordcount:pipeline --bootstrap host:port

``--storage``, ``--pipeline``, ``--s3-endpoint`` and ``--bootstrap`` may come from the
environment (``MICROCHECKPOINT_STORAGE``, ``MICROCHECKPOINT_PIPELINE``,
``MICROCHECKPOINT_S3_ENDPOINT``, ``MICROCHECKPOINT_KAFKA_BOOTSTRAP``). Listings take
``--json``. Bad input is one line on stderr and exit code 2; a failed verification or
another error, exit code 1. An edge of the project: it opens the adapters and calls the
core.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from microcheckpoint.config import CheckpointConfig
from microcheckpoint.errors import (
    CheckpointNotFound,
    ConfigError,
    IncompatibleCheckpoint,
    InvalidValue,
    MicrocheckpointError,
    RestoreError,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.history import checkpoint_history, run_attempt
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.replay import ReplayPoint, Severity
from microcheckpoint.protocol.savepoints import (
    ClaimMode,
    RestorePoint,
    create_savepoint,
    resolve_point,
    restore,
)
from microcheckpoint.protocol.view import scan
from microcheckpoint.storage import ObjectStore, open_store

__all__ = ["app", "main"]

app = typer.Typer(
    help="Checkpoints and savepoints of microcheckpoint pipelines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
state_app = typer.Typer(help="A pipeline's keyed state as a table.", no_args_is_help=True)
app.add_typer(state_app, name="state")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
BAD_INPUT = (ConfigError, CheckpointNotFound, IncompatibleCheckpoint, InvalidValue, RestoreError)


@dataclass
class Target:
    """The pipeline the command works on, from the global options."""

    storage: str
    pipeline: str
    s3_endpoint: str | None
    bootstrap: str | None

    def store(self, url: str | None = None) -> ObjectStore:
        url = url or self.storage
        options = {"endpoint_url": self.s3_endpoint} if url.startswith("s3://") else {}
        return open_store(url, **options)

    def coordinator(self) -> CheckpointCoordinator:
        config = CheckpointConfig.from_mapping({"pipeline": self.pipeline, "storage": self.storage})
        return CheckpointCoordinator(self.store(), config)


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"microcheckpoint: {message}", markup=False)
    return typer.Exit(code)


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line per error: exit 2 for bad input, 1 for anything else the core raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BAD_INPUT as exc:
            raise _fail(str(exc), 2) from None
        except MicrocheckpointError as exc:
            raise _fail(str(exc), 1) from None

    return wrapper


@app.callback()
def options(
    ctx: typer.Context,
    storage: str = typer.Option(
        ..., envvar="MICROCHECKPOINT_STORAGE", help="checkpoint storage root URL"
    ),
    pipeline: str = typer.Option(
        ..., "--pipeline", "-p", envvar="MICROCHECKPOINT_PIPELINE", help="pipeline name"
    ),
    s3_endpoint: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_S3_ENDPOINT", help="S3 endpoint URL (a local server)"
    ),
    bootstrap: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"
    ),
) -> None:
    ctx.obj = Target(storage.rstrip("/"), pipeline, s3_endpoint, bootstrap)


def _json(value: Any) -> None:
    out.print(json.dumps(value, indent=1, sort_keys=True, default=str), markup=False)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command("list")
@handles_errors
def list_points(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print JSON")
) -> None:
    """Checkpoints (newest first) and savepoints of the pipeline."""
    target: Target = ctx.obj
    history = checkpoint_history(target.store(), target.pipeline)
    if as_json:
        _json(history)
        return
    table = Table(title=f"checkpoints of {target.pipeline} ({history['storage']})")
    for column in ("id", "status", "attempt", "trigger time (UTC)", "duration", "records"):
        table.add_column(column, justify="right" if column != "status" else "left")
    table.add_column("checkpointed", justify="right")
    table.add_column("full size", justify="right")
    for row in history["checkpoints"]:
        stats = row.get("statistics") or {}
        duration = row.get("duration_ms")
        status = row["status"] + (f" ({row['reason']})" if row.get("reason") else "")
        table.add_row(
            str(row["id"]),
            status,
            str(row["attempt"]),
            _time(row.get("trigger_time_ms")),
            "-" if duration is None else f"{duration / 1000:.2f} s",
            str(row.get("records", "-")),
            _size(stats.get("checkpointed_size")),
            _size(stats.get("full_size", row.get("state_bytes"))),
        )
    out.print(table)
    out.print(f"savepoints: {len(history['savepoints'])}", markup=False)
    for url in history["savepoints"]:
        out.print(f"  {url}", markup=False)
    if history["restored_from"]:
        out.print(f"restored from: {history['restored_from']}", markup=False)
    if history.get("restore_note"):
        out.print(f"restore note: {history['restore_note']}", markup=False)
    if history["stopped"]:
        out.print(f"triggering stopped: {history['stopped'].get('reason', '')}", markup=False)


@app.command()
@handles_errors
def show(
    ctx: typer.Context,
    checkpoint: int = typer.Argument(..., help="checkpoint id"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """One checkpoint: its offsets, state files and statistics."""
    target: Target = ctx.obj
    view = scan(target.store(), Layout(target.pipeline))
    cid = CheckpointId(checkpoint)
    if cid not in view.records:
        raise CheckpointNotFound(
            f"pipeline {target.pipeline!r} has no checkpoint {checkpoint} in {target.storage} "
            f"(known: {[c.value for c in sorted(view.records)]}); see `microcheckpoint list`"
        )
    record = view.records[cid]
    pending = view.pending_record(cid)
    detail: dict[str, Any] = {
        "id": checkpoint,
        "status": record.status.value,
        "ranges": {str(tp): [r.start, r.end] for tp, r in sorted(pending.barrier.ranges.items())},
        "labels": dict(pending.labels),
    }
    if cid in view.completed:
        meta = view.metadata(cid)
        detail.update(
            offsets={str(tp): o for tp, o in sorted(meta.offsets.items())},
            state_files=[
                {
                    "task": str(task),
                    "key": h.key,
                    "size": h.size,
                    "key_groups": f"{min(h.key_groups)}-{max(h.key_groups)}"
                    if h.key_groups
                    else "",
                }
                for task, ack in sorted(meta.acks.items(), key=lambda item: str(item[0]))
                for h in ack.handles
            ],
            statistics=dict(meta.statistics),
            config=dict(meta.config),
        )
    if as_json:
        _json(detail)
        return
    out.print(f"checkpoint {checkpoint} of {target.pipeline}: {detail['status']}", markup=False)
    offsets = Table(title="offsets (next to read) per partition")
    for column in ("partition", "from", "to"):
        offsets.add_column(column, justify="right")
    for tp, (start, end) in detail["ranges"].items():
        offsets.add_row(tp, str(start), str(end))
    out.print(offsets)
    if "state_files" in detail:
        files = Table(title="state files")
        for column in ("task", "key groups", "size", "key"):
            files.add_column(column)
        for f in detail["state_files"]:
            files.add_row(f["task"], f["key_groups"], _size(f["size"]), f["key"])
        out.print(files)
        stats = detail["statistics"]
        out.print(
            f"duration {stats.get('end_to_end_duration_ms', '-')} ms · checkpointed "
            f"{_size(stats.get('checkpointed_size'))} · full {_size(stats.get('full_size'))}",
            markup=False,
        )


@app.command()
@handles_errors
def savepoint(
    ctx: typer.Context,
    target_url: str | None = typer.Option(
        None, "--target", help="folder URL (default: <storage>/<pipeline>/savepoints/)"
    ),
    stop: bool = typer.Option(
        False, "--stop", help="stop triggering first, wait for checkpoints in flight"
    ),
    timeout: float = typer.Option(600, help="seconds to wait for checkpoints in flight"),
) -> None:
    """Take a savepoint of the latest completed checkpoint (stop with savepoint: --stop)."""
    target: Target = ctx.obj
    coord = target.coordinator()
    store, prefix = None, None
    if target_url:
        root, _, prefix = _split(target_url)
        store = target.store(root)
    if stop:
        coord.suspend("stop with savepoint (microcheckpoint CLI)")
        try:
            _await_quiet(coord, timeout)
            url = create_savepoint(coord.store, target.pipeline, target=store, target_prefix=prefix)
        except BaseException:
            coord.resume()  # a failed stop-with-savepoint leaves the pipeline running
            raise
    else:
        url = create_savepoint(coord.store, target.pipeline, target=store, target_prefix=prefix)
    out.print(url, markup=False)


def _split(url: str) -> tuple[str, str, str]:
    """``(root URL, "", key prefix)`` of a folder URL: the bucket and the path in it, or the
    parent folder and the folder's name."""
    match = re.fullmatch(r"(s3://[^/]+)/(.+)|file://(/.*)/([^/]+)", url.rstrip("/"))
    if not match:
        raise ConfigError("target", url, "a folder URL s3://bucket/path or file:///path")
    if match.group(1):
        return match.group(1), "", match.group(2)
    return "file://" + (match.group(3) or "/"), "", match.group(4)


def _await_quiet(coord: CheckpointCoordinator, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with err.status("waiting for the checkpoints in flight") as status:
        while busy := coord.view().in_flight:
            if time.monotonic() > deadline:
                raise RestoreError(
                    f"checkpoints {[c.value for c in busy]} of {coord.config.pipeline!r} are "
                    f"still in flight after {timeout:g} s; try again, or raise --timeout"
                )
            status.update(f"waiting for checkpoints {[c.value for c in busy]} in flight")
            time.sleep(1)


def _point(target: Target, point: str) -> RestorePoint:
    """``latest``, a checkpoint id (``7``, ``chk-7``) or any savepoint/checkpoint folder URL."""

    def locate(url: str) -> tuple[ObjectStore, str]:
        root, _, prefix = _split(url)
        return target.store(root), prefix

    return resolve_point(point, target.pipeline, target.store(), locate)


@app.command("restore")
@handles_errors
def restore_point(
    ctx: typer.Context,
    point: str = typer.Argument(..., help="latest, a checkpoint id, or a savepoint URL"),
    claim: bool = typer.Option(False, "--claim", help="CLAIM mode (default NO_CLAIM)"),
    parallelism: int | None = typer.Option(None, help="subtasks from now on (rescale)"),
) -> None:
    """Re-base the pipeline on a checkpoint or savepoint; its next run starts there."""
    target: Target = ctx.obj
    if parallelism is not None and parallelism < 1:
        raise ConfigError("parallelism", parallelism, "an integer >= 1")
    found = _point(target, point)
    coord = target.coordinator()
    mode = ClaimMode.CLAIM if claim else ClaimMode.NO_CLAIM
    marker = restore(coord.store, target.pipeline, found, mode, parallelism)
    coord.reset_failures()
    coord.resume()
    out.print(f"restored {target.pipeline} from {marker.source}", markup=False)
    if marker.note:
        err.print(f"note: {marker.note}", markup=False)


@app.command()
@handles_errors
def verify(
    ctx: typer.Context,
    point: str = typer.Argument(..., help="latest, a checkpoint id, or a savepoint URL"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """A dry-run restore: read every file the point references, check their format, and
    check that its offsets are still in Kafka (not deleted by retention; a WARNING when
    retention deletes them within 24 hours). Changes nothing."""
    from microcheckpoint.state.files import read_rows

    target: Target = ctx.obj
    found = _point(target, point)
    checks: list[dict[str, Any]] = [
        {"check": "_metadata", "ok": True, "detail": f"{found.location} (format ok)"}
    ]
    meta = found.metadata
    handles = [(h, key) for h, key in zip(meta.handles, found.handle_keys(), strict=True)]
    for handle, key in handles:
        try:
            rows = read_rows(found.store, type(handle)(key, handle.size, handle.key_groups))
            checks.append(
                {"check": found.store.child_url(key), "ok": True, "detail": f"{rows.num_rows} rows"}
            )
        except (MicrocheckpointError, OSError, ValueError) as exc:
            checks.append({"check": found.store.child_url(key), "ok": False, "detail": str(exc)})
    checks += _offset_checks(target, found)
    ok = all(c["ok"] for c in checks)
    if as_json:
        _json({"point": found.location, "ok": ok, "checks": checks})
    else:
        table = Table(title=f"verify {found.location}")
        for column in ("check", "result", "detail"):
            table.add_column(column)
        for c in checks:
            result = "FAILED" if not c["ok"] else "WARNING" if c.get("warning") else "ok"
            table.add_row(c["check"], result, c["detail"])
        out.print(table)
        out.print("VERIFIED" if ok else "NOT RESTORABLE", markup=False)
    if not ok:
        raise typer.Exit(1)


def _offset_checks(target: Target, found: RestorePoint) -> list[dict[str, Any]]:
    """Each Kafka partition's offset against its log start and end (needs ``--bootstrap``),
    and a WARNING row (still ok) where Kafka's retention deletes the record at the offset
    within ``protocol.replay.DEFAULT_HORIZON_MS``."""
    meta = found.metadata
    ident = meta.checkpoint_id.value if meta.kind == "checkpoint" else found.location
    point = ReplayPoint(meta.kind, ident, meta.offsets)
    kafka_offsets = point.kafka_offsets()
    if not kafka_offsets:
        return []
    if not target.bootstrap:
        return [
            {
                "check": "offsets",
                "ok": True,
                "detail": "not checked: give --bootstrap to check them against Kafka",
            }
        ]
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.adapters.kafka_replay import assess

    checks = []
    with KafkaOffsets(target.bootstrap) as kafka:
        start = kafka.beginning_offsets(kafka_offsets)
        end = kafka.end_offsets(kafka_offsets)
        soon = [w for w in assess(kafka, [point]) if w.severity is Severity.SOON]
    for tp, offset in sorted(kafka_offsets.items()):
        if offset < start[tp]:
            detail = (
                f"offset {offset} is below the log start {start[tp]}: records "
                f"{offset}..{start[tp] - 1} were deleted by Kafka's retention and cannot be "
                "replayed"
            )
            checks.append({"check": str(tp), "ok": False, "detail": detail})
        elif offset > end[tp]:
            detail = f"offset {offset} is past the log end {end[tp]}: another topic of that name?"
            checks.append({"check": str(tp), "ok": False, "detail": detail})
        else:
            detail = f"offset {offset} in [{start[tp]}, {end[tp]}]"
            checks.append({"check": str(tp), "ok": True, "detail": detail})
    for w in soon:
        row = {"check": f"{w.partition} retention", "ok": True, "warning": True}
        checks.append({**row, "detail": w.message})
    return checks


@state_app.command("export")
@handles_errors
def state_export(
    ctx: typer.Context,
    uid: str = typer.Option(..., help="operator uid"),
    to: str = typer.Option(..., "--to", help="Parquet file to write"),
    checkpoint: int | None = typer.Option(None, help="checkpoint id (default: latest)"),
) -> None:
    """Write an operator's keyed state (``key``, ``state`` as JSON) to a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from microcheckpoint.state.reader import read_keyed_state

    target: Target = ctx.obj
    cid = None if checkpoint is None else CheckpointId(checkpoint)
    state = read_keyed_state(target.store(), target.pipeline, uid, cid)
    if not state:
        view = scan(target.store(), Layout(target.pipeline))
        meta = view.metadata(cid or view.latest_completed)  # type: ignore[arg-type]
        uids = sorted({str(t.uid) for t in meta.acks})
        if uid not in uids:
            raise ConfigError("uid", uid, f"an operator uid of {target.pipeline!r}: {uids}")
    keys = sorted(state, key=lambda k: json.dumps(k, sort_keys=True, default=str))
    table = pa.table(
        {
            "key": [json.dumps(k, sort_keys=True, default=str) for k in keys],
            "state": [json.dumps(state[k], sort_keys=True, default=str) for k in keys],
        }
    )
    pq.write_table(table, to)
    out.print(f"wrote {len(keys)} keys of {uid} to {to}", markup=False)


@state_app.command("import")
@handles_errors
def state_import(
    ctx: typer.Context,
    uid: str = typer.Option(..., help="operator uid"),
    source: str = typer.Option(
        ..., "--from", help="Parquet file of key and state (JSON), as state export writes"
    ),
    target_url: str | None = typer.Option(
        None, "--target", help="folder URL (default: <storage>/<pipeline>/savepoints/)"
    ),
    parallelism: int | None = typer.Option(
        None, help="subtasks to split the state into (default: the latest checkpoint's, else 2)"
    ),
    max_parallelism: int | None = typer.Option(
        None, help="key groups (default: the latest checkpoint's, else 128)"
    ),
    offsets: str | None = typer.Option(
        None,
        help="where the restored source starts: checkpoint (default when the pipeline has "
        "one), startup (default otherwise: startup_mode decides), or "
        "topic:partition=offset,...",
    ),
) -> None:
    """Write a new savepoint whose operator UID holds the table's keyed state, like Flink's
    State Processor API; other operators' state comes from the latest checkpoint."""
    from microcheckpoint.state.bootstrap import bootstrap_savepoint, read_state_table

    target: Target = ctx.obj
    store, prefix = None, None
    if target_url:
        root, _, prefix = _split(target_url)
        store = target.store(root)
    states = read_state_table(source)
    done = bootstrap_savepoint(
        target.store(),
        target.pipeline,
        uid,
        states,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        offsets=offsets,
        target=store,
        target_prefix=prefix,
    )
    out.print(done.url, markup=False)
    others = (
        f"; {', '.join(done.carried_uids)} from checkpoint {done.carried_from}"
        if done.carried_uids
        else ""
    )
    err.print(
        f"imported {done.keys} keys of {uid} into {done.parallelism} subtasks "
        f"({done.max_parallelism} key groups){others}; offsets: {done.offsets}. "
        f"Next: microcheckpoint restore {done.url}",
        markup=False,
    )


@app.command()
@handles_errors
def run(
    ctx: typer.Context,
    module: str = typer.Option(..., help="module:attribute of the Pipeline"),
    parallelism: int = typer.Option(2, help="subtasks (unless a restore chose another)"),
    remote: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_SPARK_CONNECT", help="sc://host:port of Spark Connect"
    ),
    config: str = typer.Option("{}", help="JSON of checkpoint settings"),
) -> None:
    """One cycle: recover, trigger, process the epoch with Spark, complete and notify."""
    import importlib

    target: Target = ctx.obj
    if not target.bootstrap:
        raise ConfigError(
            "bootstrap", None, "--bootstrap host:port (or MICROCHECKPOINT_KAFKA_BOOTSTRAP)"
        )
    name, _, attr = module.partition(":")
    try:
        pipeline = getattr(importlib.import_module(name), attr or "pipeline")
    except (ModuleNotFoundError, AttributeError) as exc:
        raise ConfigError(
            "module", module, "module:attribute of a Pipeline on the Python path"
        ) from exc
    try:
        settings = json.loads(config)
    except ValueError as exc:
        raise ConfigError("config", config, 'a JSON object, e.g. {"timeout": "10min"}') from exc
    if pipeline.name != target.pipeline:
        raise ConfigError(
            "pipeline", target.pipeline, f"the pipeline's own name ({pipeline.name!r})"
        )
    checkpoint_config = CheckpointConfig.from_mapping(
        {"pipeline": pipeline.name, "storage": target.storage, **settings}
    )
    from microcheckpoint.engine.cycle import run_cycle
    from microcheckpoint.engine.spark import connect_spark, local_spark

    options = {"endpoint_url": target.s3_endpoint} if target.storage.startswith("s3://") else {}
    with err.status(f"running one cycle of {pipeline.name}"):
        spark = connect_spark(remote) if remote else local_spark("local[2]")
        try:
            result = run_cycle(
                spark,
                pipeline,
                checkpoint_config,
                target.store(),
                bootstrap=target.bootstrap,
                parallelism=parallelism,
                store_options=options,
            )
        finally:
            if not remote:
                spark.stop()
    out.print(
        f"checkpoint {result.checkpoint_id} completed: {result.records} records "
        f"(attempt {run_attempt(result.attempt)})",
        markup=False,
    )


def main() -> None:
    """The console script."""
    app()


if __name__ == "__main__":
    main()
