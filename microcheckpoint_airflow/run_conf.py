"""Refuse a run whose conf has a key its DAG does not declare, in the run's first task.

Every DAG the factory makes calls ``refuse_unknown_conf`` first in its first task, before
anything is written: the pipeline DAG's ``process_epoch`` (or its ``wait_min_pause`` sensor
when the gates are sensors), the savepoint DAG's
``validate_target``, the restore DAG's ``validate_point``, and the global savepoint and
global restore DAGs' first tasks. A new DAG's first operator does the same in its
``execute``::

    def execute(self, context):
        refuse_unknown_conf(context)
        ...
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from microcheckpoint.run_conf import unknown_conf_key

__all__ = ["declared_params", "refuse_unknown_conf"]


def declared_params(context: Any) -> set[str]:
    """The param names the run's DAG file declares: the DAG's and the task's own.

    ``context["params"]`` cannot tell: Airflow's task runner has already merged the run's
    conf into it (``process_params``), so every key of the conf is in it. The DAG and the
    task in the context are the ones parsed from the DAG file, whose params are as written.
    """
    return set(context["dag"].params) | set(context["task"].params)


def refuse_unknown_conf(context: Any) -> None:
    """Fail this task, without retries, when the run's conf has a key the DAG does not declare.

    Steps: 1. the declared names (``declared_params``); 2. the core's comparison with the
    run's conf (``microcheckpoint.run_conf.unknown_conf_key``); 3. fail with its one-line
    message, e.g. ``config field 'paralelism' = 3 is invalid: not a field of
    wordcount_restore's form; did you mean 'parallelism'? known: ...``.

    Raises:
        AirflowFailException: a key is unknown (a failure that is not retried: the same conf
            would be refused again).

    Edge cases: a run without a conf (scheduled runs, asset-triggered runs, backfills) and
    the tag keys of ``microcheckpoint.run_conf.RUN_TAGS`` pass.
    """
    # Step 1
    declared = declared_params(context)
    # Step 2
    error = unknown_conf_key(context["dag_run"].conf, declared, context["dag"].dag_id)
    # Step 3
    if error is not None:
        raise AirflowFailException(str(error)) from error
