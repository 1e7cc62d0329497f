"""``microcheckpoint``: checkpoints and savepoints from the command line, as Flink's CLI.

    microcheckpoint --storage s3://bucket/checkpoints pipelines
    microcheckpoint --storage s3://bucket/checkpoints --pipeline wordcount list
    microcheckpoint ... show 7
    microcheckpoint ... checkpoint --module examples.wordcount:pipeline [--full]
    microcheckpoint ... savepoint [--target URL] [--stop]
    microcheckpoint ... savepoint --dispose URL
    microcheckpoint ... cancel [--cleanup DELETE_ON_CANCELLATION]
    microcheckpoint ... restore POINT [--claim] [--parallelism N] [--allow-non-restored-state]
    microcheckpoint ... restores
    microcheckpoint ... verify POINT [--bootstrap host:port] [--module M:A]
    microcheckpoint ... state export --uid word-counts [--checkpoint 7] --to counts.parquet
    microcheckpoint ... state import --uid word-counts --from counts.parquet [--offsets startup]
    microcheckpoint ... run --module examples.wordcount:pipeline
    microcheckpoint ... audit 7 --module examples.wordcount:pipeline [--json]
    microcheckpoint-warm sc://host:port [--parallelism 2] [--every 45]

The global options (``--storage``, ``--pipeline``, ``--s3-endpoint``, ``--bootstrap``,
``--savepoint-root``, ``--airflow``) come before the command, or from the environment
(``MICROCHECKPOINT_STORAGE``, ``MICROCHECKPOINT_PIPELINE``, ``MICROCHECKPOINT_S3_ENDPOINT``,
``MICROCHECKPOINT_KAFKA_BOOTSTRAP``, ``MICROCHECKPOINT_SAVEPOINT_ROOTS``,
``MICROCHECKPOINT_AIRFLOW_URL``); ``--bootstrap`` is also an option of the commands that
use it. Listings take ``--json``. Bad input is one line on stderr and exit code 2; a failed
verification or another error, exit code 1. An edge of the project: it parses, calls one
``microcheckpoint.ops`` function per command, and prints.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from microcheckpoint import formatting
from microcheckpoint.errors import (
    CheckpointNotFound,
    ConfigError,
    IncompatibleCheckpoint,
    InvalidValue,
    MicrocheckpointError,
    RestoreError,
)
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops import (
    Locations,
    PipelineTarget,
    StorageSettings,
    cancel_pipeline,
    dispose_savepoint,
    list_pipelines,
    load_pipeline,
    parse_parallelism,
    plan_restore,
    restore_pipeline,
    stop_with_savepoint,
    take_savepoint,
)
from microcheckpoint.protocol.coordinator import CheckpointCoordinator
from microcheckpoint.protocol.history import checkpoint_detail, checkpoint_history, run_attempt
from microcheckpoint.protocol.layout import Layout
from microcheckpoint.protocol.replay import ReplayPoint, Severity
from microcheckpoint.protocol.restores import CLI_LABEL
from microcheckpoint.protocol.savepoints import RestorePoint, resolve_point
from microcheckpoint.protocol.view import scan
from microcheckpoint.state.verify import Check, dry_run_restore
from microcheckpoint.storage import ObjectStore

__all__ = ["app", "main", "warm_app", "warm_main"]

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
BOOTSTRAP_HELP = "Kafka bootstrap servers (host:port); overrides the global --bootstrap"
# The extra (pyproject.toml) that installs each optional package a command may import:
# `pip install microcheckpoint[cli]` alone has none of them.
EXTRA_OF = {
    "boto3": "s3",
    "botocore": "s3",
    "kafka": "kafka",
    "confluent_kafka": "kafka",
    "pyspark": "spark",
    "py4j": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "pyiceberg": "iceberg",
}


@dataclass
class Target:
    """What the global options name: the storage root, the pipeline and how to reach things."""

    storage: str
    pipeline: str | None
    s3_endpoint: str | None
    bootstrap: str | None
    savepoint_roots: tuple[str, ...] = ()
    airflow: str | None = None

    @functools.cached_property
    def settings(self) -> StorageSettings:
        return StorageSettings.from_env(self.s3_endpoint)

    @functools.cached_property
    def locations(self) -> Locations:
        return Locations(self.storage, self.settings, self.savepoint_roots)

    def store(self, url: str | None = None) -> ObjectStore:
        return self.locations.store(url)

    @functools.cached_property
    def pipe(self) -> PipelineTarget:
        """The pipeline the command works on (``--pipeline`` is required for it)."""
        if not self.pipeline:
            raise ConfigError(
                "pipeline",
                None,
                "--pipeline NAME (or MICROCHECKPOINT_PIPELINE); "
                "`microcheckpoint pipelines` lists them",
            )
        target = PipelineTarget.of(self.pipeline, self.storage, settings=self.settings)
        target.locations = self.locations
        return target

    def coordinator(self) -> CheckpointCoordinator:
        return self.pipe.coordinator()

    def known(self) -> PipelineTarget:
        """The pipeline, refused when nothing is stored for it (a misspelt name)."""
        self.pipe.require_known()
        return self.pipe

    def pause(self, paused: bool = True) -> Callable[[], None] | None:
        """Pausing (or unpausing) the pipeline DAG through Airflow's REST API; None without
        ``--airflow``."""
        if not self.airflow:
            return None
        from microcheckpoint.adapters.airflow_api import AirflowApi

        api = AirflowApi(
            self.airflow,
            os.environ.get("MICROCHECKPOINT_AIRFLOW_USER") or None,
            os.environ.get("MICROCHECKPOINT_AIRFLOW_PASSWORD") or None,
            "--airflow and MICROCHECKPOINT_AIRFLOW_USER/_PASSWORD",
        )
        dag_id = f"{self.pipe.name}_pipeline"
        return lambda: api.set_paused(dag_id, paused) and None


def _cli_labels() -> dict[str, str]:
    """Who a restore or cancel came from, for its row in the restores history: this
    command line and the user it runs as (``USER``, ``LOGNAME``; none when unknown)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        return {"by": CLI_LABEL}
    return {"by": CLI_LABEL, "user": user}


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"microcheckpoint: {message}", markup=False)
    return typer.Exit(code)


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line per error: exit 2 for bad input, 1 for anything else the core raises, and
    1 for an optional package that is not installed (the line names the extra to install)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BAD_INPUT as exc:
            raise _fail(str(exc), 2) from None
        except MicrocheckpointError as exc:
            raise _fail(str(exc), 1) from None
        except ModuleNotFoundError as exc:
            extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
            if extra is None:
                raise
            message = (
                f"this command needs the package {exc.name!r}, which is not installed; "
                f"install it with: pip install 'microcheckpoint[{extra}]'"
            )
            raise _fail(message, 1) from None

    return wrapper


@app.callback()
def options(
    ctx: typer.Context,
    storage: str = typer.Option(
        ..., envvar="MICROCHECKPOINT_STORAGE", help="checkpoint storage root URL"
    ),
    pipeline: str | None = typer.Option(
        None, "--pipeline", "-p", envvar="MICROCHECKPOINT_PIPELINE", help="pipeline name"
    ),
    s3_endpoint: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_S3_ENDPOINT", help="S3 endpoint URL (a local server)"
    ),
    bootstrap: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"
    ),
    savepoint_root: list[str] | None = typer.Option(  # noqa: B008 - typer reads it
        None,
        "--savepoint-root",
        help="another root where savepoints may be written and restored from (repeatable; "
        "env MICROCHECKPOINT_SAVEPOINT_ROOTS, comma-separated)",
    ),
    airflow: str | None = typer.Option(
        None,
        envvar="MICROCHECKPOINT_AIRFLOW_URL",
        help="Airflow API server URL: stop and cancel pause the pipeline DAG there (user and "
        "password from MICROCHECKPOINT_AIRFLOW_USER / _PASSWORD)",
    ),
) -> None:
    roots = list(savepoint_root or []) or [
        r for r in os.environ.get("MICROCHECKPOINT_SAVEPOINT_ROOTS", "").split(",") if r.strip()
    ]
    ctx.obj = Target(storage.rstrip("/"), pipeline, s3_endpoint, bootstrap, tuple(roots), airflow)


def _json(value: Any) -> None:
    out.print(json.dumps(value, indent=1, sort_keys=True, default=str), markup=False)


@app.command("pipelines")
@handles_errors
def pipelines(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print JSON")
) -> None:
    """The pipelines with checkpoints or savepoints in the storage root."""
    target: Target = ctx.obj
    names = list_pipelines(target.store())
    if as_json:
        _json(names)
        return
    table = Table(title=f"pipelines in {target.storage}")
    for column in ("pipeline", "completed", "latest", "savepoints", "state"):
        table.add_column(column)
    for name in names:
        history = checkpoint_history(target.store(), name)
        counts = history.get("counts", {})
        latest = (history.get("latest") or {}).get("completed") or {}
        state = "stopped" if history.get("stopped") else "running"
        table.add_row(
            name,
            str(counts.get("completed", "-")),
            str(latest.get("id", "-")),
            str(len(history.get("savepoints", []))),
            state,
        )
    out.print(table)


@app.command("list")
@handles_errors
def list_points(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print JSON")
) -> None:
    """Checkpoints (newest first) and savepoints of the pipeline."""
    target: Target = ctx.obj
    pipe = target.known()
    history = checkpoint_history(pipe.store, pipe.name)
    if as_json:
        _json(history)
        return
    table = Table(title=f"checkpoints of {pipe.name} ({history['storage']})")
    for column in ("id", "status", "attempt", "trigger time (UTC)", "duration", "records"):
        table.add_column(column, justify="right" if column != "status" else "left")
    table.add_column("checkpointed", justify="right")
    table.add_column("full size", justify="right")
    unreadable = []
    for row in history["checkpoints"]:
        stats = row.get("statistics") or {}
        duration = row.get("duration_ms")
        if "error" in row:
            status = "UNREADABLE"
            unreadable.append(f"checkpoint {row['id']}: {row['error']}")
        else:
            status = row["status"] + (f" ({row['reason']})" if row.get("reason") else "")
        table.add_row(
            str(row["id"]),
            status,
            str(row["attempt"]),
            formatting.timestamp(row.get("trigger_time_ms")),
            formatting.duration(duration),
            str(row.get("records", "-")),
            formatting.size(stats.get("checkpointed_size")),
            formatting.size(stats.get("full_size", row.get("state_bytes"))),
        )
    out.print(table)
    for line in unreadable:
        out.print(f"UNREADABLE {line}", markup=False)
    for row in history["checkpoints"]:
        if row.get("failed_task"):
            out.print(
                f"checkpoint {row['id']} failed: task {row['failed_task']}: {row['cause']}",
                markup=False,
            )
    out.print(f"savepoints: {len(history['savepoints'])}", markup=False)
    for entry in history["savepoints"]:
        url = entry.get("url", entry) if isinstance(entry, dict) else entry
        error = entry.get("error") if isinstance(entry, dict) else None
        out.print(f"  {url}" + (f"  UNREADABLE: {error}" if error else ""), markup=False)
    if history["restored_from"]:
        out.print(f"restored from: {history['restored_from']}", markup=False)
    if history.get("restore_note"):
        out.print(f"restore note: {history['restore_note']}", markup=False)
    if history["stopped"]:
        out.print(f"triggering stopped: {history['stopped'].get('reason', '')}", markup=False)


def _ranges(groups: list[int]) -> str:
    """``0-63`` or ``0-3, 8-11``: sorted key groups as contiguous ranges."""
    spans: list[list[int]] = []
    for g in sorted(groups):
        if spans and g == spans[-1][1] + 1:
            spans[-1][1] = g
        else:
            spans.append([g, g])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


@app.command()
@handles_errors
def show(
    ctx: typer.Context,
    checkpoint: str = typer.Argument(..., help="checkpoint id (7 or chk-7)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """One checkpoint: its offsets, state files and statistics."""
    import re

    from microcheckpoint.state.keygroups import owned_key_groups, scheme_of

    target: Target = ctx.obj
    pipe = target.known()
    view = scan(pipe.store, Layout(pipe.name))
    number = re.fullmatch(r"(?:chk-)?0*([1-9]\d*)", checkpoint.strip())
    if number is None:
        raise ConfigError("checkpoint", checkpoint, "a checkpoint id (7 or chk-7)")
    cid = CheckpointId(int(number.group(1)))
    if cid not in view.records:
        raise CheckpointNotFound(
            f"pipeline {pipe.name!r} has no checkpoint {cid.value} in {target.storage} "
            f"(known: {[c.value for c in sorted(view.records)]}); see `microcheckpoint list`"
        )
    record = view.records[cid]
    pending = view.pending_record(cid)
    detail: dict[str, Any] = {
        "id": cid.value,
        "status": record.status.value,
        "ranges": {str(tp): [r.start, r.end] for tp, r in sorted(pending.barrier.ranges.items())},
        "labels": pending.labels_json(),
    }
    # The history's row of it: abort reason and detail, the task that failed it, slowest.
    row = checkpoint_detail(pipe.store, pipe.name, cid.value)
    for name in ("reason", "detail", "failed_task", "cause"):
        if row.get(name) is not None:
            detail[name] = row[name]
    if cid in view.completed:
        meta = view.metadata(cid)
        max_p = int(meta.config.get("max_parallelism") or 128)
        subtasks: dict[str, int] = {}
        states: dict[str, list[Any]] = {}
        for task, ack in meta.acks.items():
            subtasks[str(task.uid)] = subtasks.get(str(task.uid), 0) + 1
            states.setdefault(str(task.uid), []).append(ack.operator_state)
        schemes = {uid: scheme_of(found) for uid, found in states.items()}
        files = []
        for task, ack in sorted(meta.acks.items(), key=lambda item: str(item[0])):
            for h in ack.handles:
                owned = ""
                if h.key_groups:
                    uid = str(task.uid)
                    share = owned_key_groups(max_p, subtasks[uid], task.subtask, schemes[uid])
                    owned = f"{share.start}-{share[-1]}" if share else ""
                    if share.step > 1:
                        owned += f" step {share.step}"
                files.append(
                    {
                        "task": str(task),
                        "key": h.key,
                        "size": h.size,
                        "key_groups": owned,
                        "key_groups_with_state": _ranges(list(h.key_groups)),
                    }
                )
        detail.update(
            offsets={str(tp): o for tp, o in sorted(meta.offsets.items())},
            state_files=files,
            statistics={} if meta.statistics is None else meta.statistics.to_json(),
            config=dict(meta.config),
            slowest=row.get("slowest"),
        )
    if as_json:
        _json(detail)
        return
    out.print(f"checkpoint {cid.value} of {pipe.name}: {detail['status']}", markup=False)
    if detail.get("failed_task"):
        out.print(f"failed: task {detail['failed_task']}: {detail['cause']}", markup=False)
    elif detail.get("reason"):
        out.print(f"aborted: {detail['reason']} {detail.get('detail', '')}".rstrip(), markup=False)
    offsets = Table(title="offsets (next to read) per partition")
    for column in ("partition", "from", "to"):
        offsets.add_column(column, justify="right")
    for tp, (start, end) in detail["ranges"].items():
        offsets.add_row(tp, str(start), str(end))
    out.print(offsets)
    if "state_files" in detail:
        files_table = Table(title="state files")
        for column in ("task", "key groups", "size", "key"):
            files_table.add_column(column)
        for f in detail["state_files"]:
            files_table.add_row(f["task"], f["key_groups"], formatting.size(f["size"]), f["key"])
        out.print(files_table)
        stats = detail["statistics"]
        out.print(
            f"duration {formatting.duration(stats.get('end_to_end_duration_ms'))} · checkpointed "
            f"{formatting.size(stats.get('checkpointed_size'))} · full "
            f"{formatting.size(stats.get('full_size'))}",
            markup=False,
        )
        out.print(f"slowest: {formatting.slowest(detail['slowest'])}", markup=False)
        out.print(f"  {formatting.phases((detail['slowest'] or {}).get('phases'))}", markup=False)


@app.command()
@handles_errors
def savepoint(
    ctx: typer.Context,
    target_url: str | None = typer.Option(
        None,
        "--target",
        help="folder URL under the storage root or a --savepoint-root "
        "(default: <storage>/<pipeline>/savepoints/)",
    ),
    stop: bool = typer.Option(
        False,
        "--stop",
        help="stop triggering first, wait for checkpoints in flight, then pause the pipeline "
        "DAG (with --airflow)",
    ),
    dispose: str | None = typer.Option(
        None, "--dispose", help="delete the savepoint at this folder URL instead"
    ),
    timeout: float = typer.Option(600, help="seconds to wait for checkpoints in flight"),
) -> None:
    """Take a savepoint of the latest completed checkpoint (stop with savepoint: --stop;
    delete one: --dispose URL)."""
    target: Target = ctx.obj
    if dispose is not None:
        if target_url or stop:
            raise ConfigError("--dispose", dispose, "alone, without --target or --stop")
        deleted = dispose_savepoint(target.known(), dispose)
        out.print(f"disposed {dispose} ({deleted} objects deleted)", markup=False)
        return
    labels = {"by": "microcheckpoint CLI"}
    if not stop:
        out.print(take_savepoint(target.known(), target_url, labels=labels), markup=False)
        return
    pause = target.pause()
    with err.status("waiting for the checkpoints in flight") as status:
        url = stop_with_savepoint(
            target.known(),
            target_url,
            timeout_s=timeout,
            labels=labels,
            pause=pause,
            on_wait=lambda busy: status.update(
                f"waiting for checkpoints {[c.value for c in busy]} in flight"
            ),
        )
    out.print(url, markup=False)
    if pause is None:
        err.print(
            f"note: triggering of {target.pipe.name} is stopped; its Airflow DAG "
            f"{target.pipe.name}_pipeline was not paused (give --airflow URL to pause it); "
            "runs skip until a restore",
            markup=False,
        )
    else:
        err.print(f"paused {target.pipe.name}_pipeline", markup=False)


@app.command()
@handles_errors
def cancel(
    ctx: typer.Context,
    cleanup: str | None = typer.Option(
        None,
        help="RETAIN_ON_CANCELLATION or DELETE_ON_CANCELLATION (default: the pipeline's "
        "externalized_cleanup)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Cancel the pipeline: stop triggering, abort checkpoints in flight, and keep or delete
    its checkpoints (never its savepoints). `restore` starts it again."""
    target: Target = ctx.obj
    record = cancel_pipeline(
        target.known(), cleanup=cleanup, labels=_cli_labels(), pause=target.pause()
    )
    if as_json:
        _json(record.to_json())
        return
    kept = ", ".join(map(str, record.retained)) or "none"
    out.print(
        f"cancelled {target.pipe.name} ({record.cleanup}): aborted {list(record.aborted)}, "
        f"kept checkpoints: {kept}, deleted {record.deleted} objects",
        markup=False,
    )


@app.command("restores")
@handles_errors
def restores(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print JSON")
) -> None:
    """Every restore, rescale, fallback and cancel of the pipeline, newest first (Flink's
    Rescales tab): when, from which point, parallelism per operator before and after, claim
    mode, who, records to replay, and the time to the first checkpoint after it."""
    target: Target = ctx.obj
    pipe = target.known()
    history = checkpoint_history(pipe.store, pipe.name)
    rows, summary = history["restores"], history["restores_summary"]
    if as_json:
        _json({"pipeline": pipe.name, "restores": rows, "summary": summary})
        return
    table = Table(title=f"restores of {pipe.name} ({history['storage']})")
    for column in ("time (UTC)", "kind", "from", "claim", "parallelism", "who"):
        table.add_column(column)
    for column in ("replay", "first chk", "to first chk"):
        table.add_column(column, justify="right")
    unreadable = []
    for row in rows:
        if "error" in row:
            unreadable.append(f"UNREADABLE {row['id']}: {row['error']}")
            continue
        first = row.get("first_checkpoint")
        table.add_row(
            formatting.timestamp(row.get("at_ms")),
            row["kind"],
            formatting.point_name(row.get("from")),
            row.get("claim_mode") or formatting.NONE,
            formatting.parallelism_change(
                row.get("parallelism_before"), row.get("parallelism_after"), row.get("parallelism")
            ),
            row.get("who") or formatting.NONE,
            formatting.NONE
            if row.get("records_to_replay") is None
            else str(row["records_to_replay"]),
            formatting.NONE if first is None else str(first),
            formatting.duration(row.get("time_to_first_checkpoint_ms")),
        )
    out.print(table)
    for line in unreadable:
        out.print(line, markup=False)
    out.print(_restores_summary(summary), markup=False)


def _restores_summary(summary: dict[str, Any]) -> str:
    """``restores: 4 (restore 1, rescale 1, fallback 1, cancel 1); time to the first
    checkpoint: p50 …, p90 …, max … over 2``."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in summary["by_kind"].items() if n)
    line = f"restores: {summary['count']}" + (f" ({kinds})" if kinds else "")
    times = summary.get("time_to_first_checkpoint_ms")
    if times:
        shown = ", ".join(f"{q} {formatting.duration(times[q])}" for q in ("p50", "p90", "max"))
        line += f"; time to the first checkpoint: {shown} over {times['count']}"
    return line


def _point(target: Target, point: str) -> RestorePoint:
    """``latest``, a checkpoint id (``7``, ``chk-7``) or a folder URL under the roots."""
    pipe = target.pipe
    if point.strip() in ("", "latest") or "://" not in point:
        pipe.require_known()
    return resolve_point(point, pipe.name, pipe.store, pipe.locations.locate)


def _verify_chain(target: Target, first: int, last: int, as_json: bool) -> None:
    """``verify --from --to``: the lineage's rows (``state.verify.verify_chain``)."""
    from microcheckpoint.state.verify import verify_chain

    pipe = target.pipe
    pipe.require_known()
    chain, checks = verify_chain(pipe.store, pipe.name, first, last)
    ok = all(c.ok for c in checks)
    ids = [c.value for c in chain]
    if as_json:
        rows = [c.to_json() for c in checks]
        _json({"from": first, "to": last, "chain": ids, "ok": ok, "checks": rows})
    else:
        _print_checks(f"verify --from {first} --to {last}: checkpoints {ids}", checks)
        out.print("CHAIN VERIFIED" if ok else "CHAIN BROKEN", markup=False)
    if not ok:
        raise typer.Exit(1)


@app.command("restore")
@handles_errors
def restore_point(
    ctx: typer.Context,
    point: str = typer.Argument(..., help="latest, a checkpoint id, or a savepoint URL"),
    claim: bool = typer.Option(False, "--claim", help="CLAIM mode (default NO_CLAIM)"),
    parallelism: str | None = typer.Option(  # text: the core checks it (1..max_parallelism)
        None, help="subtasks from now on (rescale), 1..max_parallelism"
    ),
    allow_non_restored_state: bool = typer.Option(
        False,
        "--allow-non-restored-state",
        help="drop state of operators the pipeline no longer has",
    ),
    module: str | None = typer.Option(
        None, help="module:attribute of the Pipeline, to check its operator uids and states"
    ),
    timeout: float = typer.Option(600, help="seconds to wait for checkpoints in flight"),
) -> None:
    """Re-base the pipeline on a checkpoint or savepoint; its next run starts there."""
    from microcheckpoint.state.evolution import pipeline_descriptors

    target: Target = ctx.obj
    pipe = target.known()
    uids = descriptors = None
    if module:
        pipeline = load_pipeline(module, name=pipe.name)
        uids, descriptors = pipeline.uids, pipeline_descriptors(pipeline)
    request = plan_restore(
        pipe,
        point,
        claim_mode=claim,
        parallelism=parallelism,
        allow_non_restored_state=allow_non_restored_state,
        uids=uids,
        descriptors=descriptors,
    )
    if request.dropped_states:
        err.print(f"states left unread: {', '.join(request.dropped_states)}", markup=False)
    marker = restore_pipeline(pipe, request, labels=_cli_labels(), timeout_s=timeout)
    out.print(f"restored {pipe.name} from {marker.source}", markup=False)
    if marker.note:
        err.print(f"note: {marker.note}", markup=False)
    resume = target.pause(paused=False)
    if resume is not None:
        resume()  # as the restore DAG does: the pipeline DAG runs again
        err.print(f"unpaused {pipe.name}_pipeline", markup=False)


@app.command()
@handles_errors
def verify(
    ctx: typer.Context,
    point: str | None = typer.Argument(
        None, help="latest, a checkpoint id, or a savepoint URL (or --from and --to)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    bootstrap: str | None = typer.Option(None, help=BOOTSTRAP_HELP),
    module: str | None = typer.Option(
        None, help="module:attribute of the Pipeline, to check its states against the point's"
    ),
    first: int | None = typer.Option(
        None, "--from", help="prove the lineage from this checkpoint id (with --to)"
    ),
    last: int | None = typer.Option(None, "--to", help="... to this checkpoint id"),
) -> None:
    """A dry-run restore: read the point's _metadata and every state file it references (each
    must have the size and SHA-256 recorded with it, and decode), list its state descriptors
    (against the pipeline's with --module), check that its staged sink parts are there with
    their size and SHA-256 (sink output is not parsed), and check that its offsets are still
    in Kafka (not deleted by retention; a WARNING when retention deletes them within 24
    hours). With --from A --to B instead of POINT: prove the lineage from checkpoint A to B
    (one writer each, each _metadata the one the next continued from, offsets with no gap
    or overlap, every file with its hash). Changes nothing."""
    target: Target = ctx.obj
    target.bootstrap = bootstrap or target.bootstrap
    if first is not None or last is not None:
        if point is not None or first is None or last is None:
            raise _fail("give either POINT, or --from and --to (a range of checkpoint ids)", 2)
        _verify_chain(target, first, last, as_json)
        return
    if point is None:
        raise _fail("give a POINT (latest, a checkpoint id, a savepoint URL) or --from/--to", 2)
    declared = None
    if module:
        from microcheckpoint.state.evolution import pipeline_descriptors

        declared = pipeline_descriptors(load_pipeline(module, name=target.pipe.name))
    done = dry_run_restore(
        lambda: _point(target, point), lambda p: _offset_checks(target, p), declared
    )
    where = done.point.location if done.point else point
    if as_json:
        checks = [c.to_json() for c in done.checks]
        _json({"point": where, "ok": done.ok, "checks": checks})
    else:
        _print_checks(f"verify {where}", done.checks)
        out.print("VERIFIED" if done.ok else "NOT RESTORABLE", markup=False)
    if not done.ok:
        raise typer.Exit(1)


def _print_checks(title: str, checks: Iterable[Check]) -> None:
    """A verification's rows as a table: check, result (ok, WARNING, FAILED), detail."""
    table = Table(title=title)
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for c in checks:
        table.add_row(c.check, "FAILED" if not c.ok else "WARNING" if c.warning else "ok", c.detail)
    out.print(table)


def _offset_checks(target: Target, found: RestorePoint) -> list[Check]:
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
        detail = "not checked: give --bootstrap to check them against Kafka"
        return [Check("offsets", True, detail)]
    from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
    from microcheckpoint.adapters.kafka_replay import assess

    checks: list[Check] = []
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
            checks.append(Check(str(tp), False, detail))
        elif offset > end[tp]:
            detail = f"offset {offset} is past the log end {end[tp]}: another topic of that name?"
            checks.append(Check(str(tp), False, detail))
        else:
            detail = f"offset {offset} in [{start[tp]}, {end[tp]}]"
            checks.append(Check(str(tp), True, detail))
    for w in soon:
        checks.append(Check(f"{w.partition} retention", True, w.message, warning=True))
    return checks


@state_app.command("export")
@handles_errors
def state_export(
    ctx: typer.Context,
    uid: str = typer.Option(..., help="operator uid"),
    to: str = typer.Option(..., "--to", help="Parquet file to write"),
    checkpoint: int | None = typer.Option(None, help="checkpoint id (default: latest)"),
) -> None:
    """Write an operator's keyed state (``key``, ``state`` as JSON; a process function's
    states decoded per kind and its ``timers``) to a Parquet file."""
    import pyarrow.parquet as pq

    from microcheckpoint.state.offline import table_of
    from microcheckpoint.state.reader import read_keyed_table

    target: Target = ctx.obj
    pipe = target.known()
    cid = None if checkpoint is None else CheckpointId(checkpoint)
    state = read_keyed_table(pipe.store, pipe.name, uid, cid)
    if not (state.keys or state.timers or state.groups):
        view = scan(pipe.store, Layout(pipe.name))
        which = cid or view.latest_completed
        if which is None:
            raise CheckpointNotFound(f"pipeline {pipe.name!r} has no completed checkpoint")
        uids = sorted({str(t.uid) for t in view.metadata(which).acks})
        if uid not in uids:
            raise ConfigError("uid", uid, f"an operator uid of {pipe.name!r}: {uids}")
    table = table_of(state)
    pq.write_table(table, to)
    timers = sum(len(t) for t in state.timers.values())
    more = f" ({timers} timers)" if state.descriptors is not None else ""
    out.print(f"wrote {table.num_rows} keys of {uid}{more} to {to}", markup=False)


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
    from microcheckpoint.ops.savepoints import savepoint_target
    from microcheckpoint.state.bootstrap import bootstrap_savepoint, read_state_table
    from microcheckpoint.state.offline import read_table_extras

    target: Target = ctx.obj
    pipe = target.pipe
    where = savepoint_target(pipe, target_url)
    table, descriptors = read_table_extras(source, read_state_table(source))
    done = bootstrap_savepoint(
        pipe.store,
        pipe.name,
        uid,
        table.keys,
        timers=table.timers,
        groups=table.groups,
        descriptors=descriptors,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        offsets=offsets,
        target=where.store,
        target_prefix=where.prefix,
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


def _with_spark(remote: str | None, status: str, what: str, work: Callable[[Any], Any]) -> Any:
    """``work(spark)`` on Spark Connect at ``remote``, or on a local Spark stopped after; a
    Spark job's failure is one line naming its cause (``<what> failed: ...``), exit 1."""
    from microcheckpoint.engine.errors import failure_cause
    from microcheckpoint.engine.spark import connect_spark, local_spark

    with err.status(status):
        spark = connect_spark(remote) if remote else local_spark("local[2]")
        try:
            return work(spark)
        except MicrocheckpointError:
            raise
        except Exception as exc:  # a Spark job's failure: name the cause, not the wrapper
            raise _fail(f"{what} failed: {failure_cause(exc)}", 1) from None
        finally:
            if not remote:
                spark.stop()


def _bootstrap(target: Target, bootstrap: str | None) -> str:
    found = bootstrap or target.bootstrap
    if not found:
        raise ConfigError(
            "bootstrap", None, "--bootstrap host:port (or MICROCHECKPOINT_KAFKA_BOOTSTRAP)"
        )
    return found


def _cycle(
    target: Target,
    module: str,
    bootstrap: str | None,
    parallelism: int,
    remote: str | None,
    config: str,
    full: bool,
) -> None:
    """One cycle now: recover, trigger, process the epoch with Spark, complete, notify."""
    bootstrap = _bootstrap(target, bootstrap)
    try:
        settings = json.loads(config)
    except ValueError as exc:
        raise ConfigError("config", config, 'a JSON object, e.g. {"timeout": "10min"}') from exc
    if not isinstance(settings, dict):
        raise ConfigError("config", config, 'a JSON object, e.g. {"timeout": "10min"}')
    if full:
        settings["incremental"] = False  # this checkpoint references nothing older
    pipe = PipelineTarget.of(
        target.pipe.name, target.storage, settings=target.settings, checkpointing=settings
    )
    parse_parallelism(parallelism, pipe.config.max_parallelism)  # before Spark starts
    s3 = target.settings.options(target.storage)
    pipeline = load_pipeline(module, name=pipe.name, s3_options=target.settings.s3_options())
    from microcheckpoint.engine.cycle import run_cycle

    def cycle(spark: Any) -> Any:
        return run_cycle(
            spark,
            pipeline,
            pipe.config,
            target.store(),
            bootstrap=bootstrap,
            parallelism=parallelism,
            store_options=s3,
        )

    result = _with_spark(remote, f"running one cycle of {pipeline.name}", "checkpoint", cycle)
    out.print(
        f"checkpoint {result.checkpoint_id} completed{' (full)' if full else ''}: "
        f"{result.records} records "
        f"(attempt {run_attempt(result.attempt)})",
        markup=False,
    )


@app.command()
@handles_errors
def checkpoint(
    ctx: typer.Context,
    module: str = typer.Option(..., help="module:attribute of the Pipeline"),
    full: bool = typer.Option(False, "--full", help="a full snapshot (no incremental references)"),
    bootstrap: str | None = typer.Option(None, help=BOOTSTRAP_HELP),
    parallelism: int = typer.Option(2, help="subtasks (unless a restore chose another)"),
    remote: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_SPARK_CONNECT", help="sc://host:port of Spark Connect"
    ),
    config: str = typer.Option("{}", help="JSON of checkpoint settings"),
) -> None:
    """Trigger a checkpoint now and run its epoch (Flink's `checkpoint [--full]`)."""
    _cycle(ctx.obj, module, bootstrap, parallelism, remote, config, full)


# `run` is the older name of `checkpoint` (one cycle now); both take the same options.
app.command("run", help="One cycle now: recover, trigger, process, complete, notify.")(checkpoint)


@app.command()
@handles_errors
def audit(
    ctx: typer.Context,
    checkpoint: int = typer.Argument(..., help="the epoch (a completed checkpoint id) to replay"),
    module: str = typer.Option(..., help="module:attribute of the Pipeline"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    bootstrap: str | None = typer.Option(None, help=BOOTSTRAP_HELP),
    remote: str | None = typer.Option(
        None, envvar="MICROCHECKPOINT_SPARK_CONNECT", help="sc://host:port of Spark Connect"
    ),
) -> None:
    """Replay epoch CHECKPOINT from its base checkpoint in a sandbox (nothing published,
    committed or kept) and compare its state per key group and its staged sink parts with
    what was committed; a difference names the operator, key group and key (or part and
    row). Exit code 1 when they differ: a function that is not deterministic, or input that
    changed. Also a restore rehearsal: it reads the base's files and the epoch's records."""
    from microcheckpoint.ops.audit import audit_epoch, plan_audit

    target: Target = ctx.obj
    found = _bootstrap(target, bootstrap)
    pipeline = load_pipeline(module, name=target.pipe.name, s3_options=target.settings.s3_options())
    store = target.store()
    plan_audit(store, pipeline, checkpoint)  # bad input: one line, before Spark starts
    options = target.settings.options(target.storage)

    def replay(spark: Any) -> Any:
        return audit_epoch(
            spark, store, pipeline, checkpoint, bootstrap=found, store_options=options
        )

    done = _with_spark(remote, f"replaying epoch {checkpoint} of {pipeline.name}", "audit", replay)
    if as_json:
        _json(done.to_json())
    else:
        _print_checks(f"audit of epoch {checkpoint}", done.checks())
        out.print("DETERMINISTIC" if done.ok else "DIFFERS", markup=False)
    if not done.ok:
        raise typer.Exit(1)


warm_app = typer.Typer(
    help="Keep the Python workers of the epochs' Spark Connect session warm between epochs.",
    add_completion=False,
    pretty_exceptions_enable=False,
)


@warm_app.command()
@handles_errors
def warm(
    remote: str = typer.Argument(
        ...,
        envvar="MICROCHECKPOINT_SPARK_CONNECT",
        help="sc://host:port of the Spark Connect server the epochs run on",
    ),
    parallelism: int = typer.Option(2, help="Python workers to keep: the epochs' parallelism"),
    every: float = typer.Option(45.0, help="seconds from one round's start to the next, <= 50"),
    rounds: int | None = typer.Option(None, help="stop after this many rounds (default: never)"),
) -> None:
    """Run a task on each of PARALLELISM Python workers of the shared session every EVERY
    seconds: Spark ends a worker idle for a minute, and an epoch after that waits for new
    ones (a 100k-record epoch: 1.2 s instead of 0.5 s). A failed round is one line on
    stderr and the next round connects again. Stop it with Ctrl-C (exit code 0)."""
    from microcheckpoint.engine.warm import keep_warm

    # keep_warm checks the other settings before it connects
    if not remote.startswith("sc://"):
        raise ConfigError("remote", remote, "the Spark Connect URL, sc://host:port")
    from microcheckpoint.engine.errors import failure_cause
    from microcheckpoint.engine.spark import connect_spark

    def report(round_no: int, pids: list[int], seconds: float) -> None:
        listed = ", ".join(map(str, pids))
        short = "" if len(pids) >= parallelism else f" of {parallelism} asked (fewer task slots)"
        out.print(
            f"round {round_no}: {len(pids)} Python worker(s){short} warm (pids {listed}) "
            f"in {seconds:.2f} s",
            markup=False,
        )

    def failed(round_no: int, exc: Exception) -> None:
        if isinstance(exc, ModuleNotFoundError):
            raise exc  # a missing package: handles_errors names the extra to install
        err.print(
            f"microcheckpoint: round {round_no} at {remote} failed: {failure_cause(exc)}",
            markup=False,
        )

    try:
        seen = keep_warm(lambda: connect_spark(remote), parallelism, every, rounds, report, failed)
    except KeyboardInterrupt:
        return
    if seen and all(pids is None for pids in seen):
        raise _fail(f"no round reached the Spark Connect server at {remote}", 1)


def _main(application: typer.Typer, name: str, help_without_arguments: bool) -> None:
    """A console script. A usage error (an unknown option, a value of the wrong type, an
    unknown command) is one line, as every bad input here, with exit code 2."""
    import sys

    # typer 0.29 (pinned) carries its own click; its usage errors come from there.
    from typer._click.exceptions import ClickException, UsageError

    if help_without_arguments and len(sys.argv) < 2:
        application()  # no arguments: the help
        return
    try:
        code = application(standalone_mode=False)
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else name
        message = " ".join(exc.format_message().split()).rstrip(".")
        err.print(f"microcheckpoint: {message}; see `{where} --help`", markup=False)
        raise SystemExit(2) from None
    except ClickException as exc:
        err.print(f"microcheckpoint: {' '.join(exc.format_message().split())}", markup=False)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


def main() -> None:
    """The console script ``microcheckpoint``."""
    _main(app, "microcheckpoint", help_without_arguments=True)


def warm_main() -> None:
    """The console script ``microcheckpoint-warm``."""
    _main(warm_app, "microcheckpoint-warm", help_without_arguments=False)


if __name__ == "__main__":
    main()
