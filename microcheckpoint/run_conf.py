"""A run's conf against the names its DAG declares: a misspelt key is refused, not ignored.

Airflow merges a run's conf into the run's params before any task starts, and a key that
is no param goes in unchecked: ``{"paralelism": 3}`` would restore at the old parallelism.
This module holds the comparison only (conf keys against declared names); the Airflow side
(``microcheckpoint_airflow.run_conf``) feeds it the run's conf and the params its DAG file
declares, and fails the run's first task with the error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from microcheckpoint.errors import ConfigError, unknown_name

__all__ = ["RUN_TAGS", "unknown_conf_key"]

# Keys a tool may put on any run to find it again; they are labels, not settings. The
# project's backfill client tags the runs of each backfill it creates with a request id
# (harness/airflow_stack.py), so a backfill whose creation failed half way can be completed.
RUN_TAGS: frozenset[str] = frozenset({"microcheckpoint_backfill_request"})


def unknown_conf_key(conf: object, declared: Iterable[str], owner: str) -> ConfigError | None:
    """The error for a run's conf that has a key ``owner`` does not declare, else None.

    Steps: 1. nothing to check without a conf; 2. a conf that is not a mapping is refused;
    3. the keys neither declared nor in ``RUN_TAGS``, sorted; 4. one error naming the first
    of them, its value and the fix (the closest declared name, or none at all), and listing
    the others.

    Args:
        conf: the run's conf as Airflow stores it (None or empty: nothing is refused).
        declared: the names ``owner`` declares (a DAG's params); may be empty.
        owner: who declares them, named in the message (a DAG id).

    Returns:
        A ``ConfigError`` whose message is one line, or None when every key is known.

    Edge cases:
        - Several unknown keys: the message names the first (sorted) with its value and
          lists the others after ``also unknown:``, so one run shows every typo.
        - ``owner`` declares nothing (a pipeline DAG): every key is unknown and the fix is to
          trigger without a conf.
        - A key of ``RUN_TAGS`` is accepted everywhere; a key is compared exactly (case
          matters, as it does for Airflow's params).
    """
    # Step 1
    if conf is None or conf == {}:
        return None
    # Step 2
    if not isinstance(conf, Mapping):
        return ConfigError(f"conf of {owner}", conf, "a JSON object of the form's fields")
    # Step 3
    known = sorted(set(declared))
    unknown = sorted(str(k) for k in conf if k not in known and k not in RUN_TAGS)
    if not unknown:
        return None
    # Step 4
    first, others = unknown[0], unknown[1:]
    also = f"; also unknown: {', '.join(others)}" if others else ""
    if not known:
        allowed = f"{owner} declares no params; trigger it without a conf{also}"
        return ConfigError(first, conf[first], allowed)
    error = unknown_name(f"a field of {owner}'s form", first, conf[first], known)
    return ConfigError(first, conf[first], error.allowed + also) if also else error
