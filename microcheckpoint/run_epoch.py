"""spark-submit entry point: run one epoch (or one whole local cycle) of a pipeline.

    spark-submit "$(python -c 'import microcheckpoint.run_epoch as m; print(m.__file__)')" \
        --pipeline examples.wordcount:pipeline \
        --storage s3://bucket/checkpoints --checkpoint 7 --bootstrap kafka:9092

Without ``--checkpoint`` it runs a whole local cycle (recover, trigger, process, complete,
notify), which is what ``make demo`` and the crash tests use; ``--cycles N`` runs N of them
in one Spark session. It prints one JSON line per epoch. Thin: it parses arguments, builds
the adapters and calls ``microcheckpoint.engine.runner``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

# It ships in the package, so a wheel install has it; spark-submit runs it as a file
# (``__main__``), with ``microcheckpoint`` imported from the driver's environment.
# ``spark_jobs/run_epoch.py`` in the repository runs the same ``main``.
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine.cycle import run_cycle
from microcheckpoint.engine.runner import run_epoch
from microcheckpoint.errors import MicrocheckpointError
from microcheckpoint.ids import CheckpointId
from microcheckpoint.ops import StorageSettings, load_pipeline, parse_parallelism
from microcheckpoint.protocol.coordinator import CheckpointCoordinator


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit code 2) like every bad input here."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"run_epoch.py: {message}; see --help\n")


class BadInput(Exception):
    """An argument is wrong: one line naming it, its value and the fix; exit code 2."""


def json_object(flag: str, text: str) -> dict:
    """The JSON object given to ``flag``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadInput(
            f"{flag} {text!r} is not JSON ({exc}); give a JSON object, e.g. "
            '\'{"timeout": "10min"}\''
        ) from exc
    if not isinstance(value, dict):
        raise BadInput(f"{flag} {text!r} is not a JSON object; give one, e.g. '{{}}'")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", required=True, help="module:attribute of a Pipeline")
    parser.add_argument(
        "--pipeline-kwargs", default="{}", help="JSON of arguments when --pipeline is a function"
    )
    parser.add_argument("--storage", required=True, help="checkpoint storage root URL")
    parser.add_argument("--checkpoint", type=int, help="run this triggered epoch only")
    parser.add_argument(
        "--cycles", type=int, default=1, help="whole cycles to run in one session (default 1)"
    )
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument(
        "--parallelism", default="2", help="subtasks, 1..max_parallelism (default 2)"
    )
    parser.add_argument("--config", default="{}", help="JSON of extra checkpoint settings")
    parser.add_argument("--s3-endpoint", default=os.environ.get("MICROCHECKPOINT_S3_ENDPOINT"))
    parser.add_argument(
        "--master", default=None, help="Spark master (default: local[2] or spark-submit's)"
    )
    parser.add_argument(
        "--remote",
        default=os.environ.get("MICROCHECKPOINT_SPARK_CONNECT"),
        help="sc://host:port of a Spark Connect server: run as its client, with no JVM here",
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or (args.checkpoint is not None and args.cycles != 1):
        parser.error(f"--cycles {args.cycles}: an integer >= 1, and 1 with --checkpoint")
    try:
        pipeline, config, store, options = _setup(args)
    except (BadInput, MicrocheckpointError) as exc:
        # Bad input: one line (no traceback), and nothing was written.
        print(f"run_epoch.py: {exc}", file=sys.stderr, flush=True)
        return 2
    from microcheckpoint.engine.spark import connect_spark, local_spark

    spark = connect_spark(args.remote) if args.remote else local_spark(args.master)
    master = f"connect {args.remote}" if args.remote else spark.sparkContext.master
    try:
        for _ in range(args.cycles):
            if args.checkpoint is None:
                result = run_cycle(
                    spark,
                    pipeline,
                    config,
                    store,
                    bootstrap=args.bootstrap,
                    parallelism=args.parallelism,
                    store_options=options,
                )
            else:
                plan = CheckpointCoordinator(store, config).plan(CheckpointId(args.checkpoint))
                result = run_epoch(
                    spark, pipeline, plan, store, bootstrap=args.bootstrap, store_options=options
                )
            report = {
                "checkpoint": result.checkpoint_id.value,
                "attempt": result.attempt,
                "records": result.records,
                "master": master,
            }
            print(json.dumps(report), flush=True)
    finally:
        spark.stop()
    return 0


def _setup(args: argparse.Namespace) -> tuple:
    """The pipeline, its config, the store and the store options, all checked before Spark
    starts."""
    settings = StorageSettings.from_env(args.s3_endpoint)
    pipeline = load_pipeline(
        args.pipeline,
        json_object("--pipeline-kwargs", args.pipeline_kwargs),
        s3_options=settings.s3_options(),  # one endpoint for every S3 client of the run
    )
    options = settings.options(args.storage)
    store = settings.open(args.storage)
    config = CheckpointConfig.from_mapping(
        {
            "pipeline": pipeline.name,
            "storage": args.storage,
            **json_object("--config", args.config),
        }
    )
    args.parallelism = parse_parallelism(args.parallelism, config.max_parallelism) or 2
    if args.checkpoint is not None:
        view = CheckpointCoordinator(store, config).view()
        if CheckpointId(args.checkpoint) not in view.pending:
            raise BadInput(
                f"--checkpoint {args.checkpoint}: pipeline {pipeline.name!r} has no pending "
                f"checkpoint {args.checkpoint} in {args.storage} (pending: "
                f"{[c.value for c in view.pending]}); trigger it first, or leave out "
                "--checkpoint to run a whole cycle"
            )
    return pipeline, config, store, options


if __name__ == "__main__":
    sys.exit(main())
