"""``failure_cause``: one line naming what a worker raised, from the text Spark carries.

Spark puts the worker's formatted traceback into its exception's text; these tests build
that text the way the worker does (``traceback.format_exception`` of a real exception).
The path through Spark and Airflow is tested in
``tests/integration/test_epoch_failure_cause.py``.
"""

from __future__ import annotations

import traceback

from microcheckpoint.engine.errors import MAX_CHARS, failure_cause
from microcheckpoint.errors import ConfigError


def _worker_text(raise_it) -> str:
    """Spark's wording around the traceback of what ``raise_it`` raises in a "worker"."""
    try:
        raise_it()
    except Exception as exc:
        formatted = "".join(traceback.format_exception(exc))
    return f"An exception was thrown from the Python worker: {formatted} SQLSTATE: 38000"


def _raise(exc: BaseException):
    def go() -> None:
        raise exc

    return go


def test_the_workers_exception_without_module_path_and_sqlstate() -> None:
    text = _worker_text(_raise(ConfigError("parallelism", 999, "an integer in 1..128")))
    assert failure_cause(RuntimeError(text)) == (
        "ConfigError: config field 'parallelism' = 999 is invalid: an integer in 1..128"
    )


def test_a_chained_worker_error_names_the_one_the_worker_raised() -> None:
    def chained() -> None:
        try:
            raise KeyError("word")
        except KeyError as exc:
            raise ValueError("bad row 3") from exc

    assert failure_cause(RuntimeError(_worker_text(chained))) == "ValueError: bad row 3"


def test_the_cause_of_a_wrapper_is_found() -> None:
    spark = RuntimeError(_worker_text(_raise(ValueError("bad row 3"))))
    try:
        try:
            raise spark
        except RuntimeError as exc:
            raise TimeoutError("epoch task") from exc
    except TimeoutError as wrapper:
        assert failure_cause(wrapper) == "ValueError: bad row 3"


def test_multi_line_messages_join_and_a_jvm_stack_is_left_out() -> None:
    text = _worker_text(_raise(ValueError("line one\nline two")))
    text += (
        "\nJVM stacktrace:\norg.apache.spark.SparkException: Job aborted\n\tat org.x.Y(Y.java:1)"
    )
    assert failure_cause(RuntimeError(text)) == "ValueError: line one line two"


def test_without_a_traceback_the_exception_itself() -> None:
    assert failure_cause(KeyError("word")) == "KeyError: 'word'"
    assert failure_cause(RuntimeError()) == "RuntimeError"
    assert failure_cause(TimeoutError("Timeout, PID: 7")) == "TimeoutError: Timeout, PID: 7"


def test_long_messages_are_cut_and_a_looping_chain_ends() -> None:
    cut = failure_cause(ValueError("x" * 2000))
    assert cut == "ValueError: " + "x" * (MAX_CHARS - 1) + "…"
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert failure_cause(first) == "ValueError: a"
