"""A failed epoch's cause in one line, from whatever Spark raised.

When a Python function fails inside a Spark task (a keyed operator raising, a subtask
declining a checkpoint with a ``ConfigError``), the driver receives Spark's wrapper: a
``PythonException`` (in-process Spark or Spark Connect) or a Py4J error, whose ``repr`` is
``PythonException()`` and whose text is the worker's whole traceback, often followed by a
JVM stack trace. ``failure_cause`` finds the exception the worker raised in that text and
says it in one line, ``ValueError: bad row 3``, which the Airflow epoch task and the
command line put after ``checkpoint <id>:``.

Pure text work: nothing here imports Spark, so it also describes errors raised before Spark
was involved.
"""

from __future__ import annotations

import re

__all__ = ["failure_cause"]

TRACEBACK = "Traceback (most recent call last):"
MAX_CHARS = 500  # a message longer than this is cut, with "…" at the end
# The line a Python traceback ends with: a (possibly dotted) exception type, then its message.
_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
# Where a worker traceback's exception message ends: a blank line, a JVM frame, or what
# Spark appends (Connect: " SQLSTATE: 38000"; "JVM stacktrace:" when it sends one).
_END = re.compile(r"^(\s*$|\tat |\s*at [\w$.]+\(|JVM stacktrace:|\s*SQLSTATE: )")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\s*$")


def failure_cause(exc: BaseException) -> str:
    """One line naming what made an epoch fail.

    1. Walk ``exc`` and its causes (``__cause__``, then ``__context__``), outermost first.
    2. The first whose text holds a Python traceback (Spark's wrapper of a worker's error)
       gives the exception the worker raised: its type without the module path, and its
       message.
    3. Otherwise ``exc`` itself: ``Type: message``, or ``Type`` when the message is empty.

    Edge cases: with several tracebacks in one text (a worker error chained to another) the
    last is the one the worker raised, and it is the one named. A multi-line message is
    joined with spaces and cut at 500 characters. What Spark appends after the Python
    traceback (a JVM stack trace, Connect's ``SQLSTATE: 38000``) is left out.

    Args:
        exc: what processing the epoch raised.

    Returns:
        ``"ValueError: bad row 3"``, ``"ConfigError: config field 'parallelism' = 999 is
        invalid: ..."`` and the like, never empty and never more than one line.
    """
    # Step 1: the chain, outermost first, each exception once (a chain can loop).
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    # Step 2: the worker's exception, from the first text carrying a traceback.
    for link in chain:
        raised = _worker_exception(_text(link))
        if raised is not None:
            return raised
    # Step 3: no traceback anywhere: the exception as Python names it.
    return _one_line(type(exc).__name__, _text(exc))


def _text(exc: BaseException) -> str:
    """The exception's text; Spark's captured errors keep the worker's in ``desc``."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not hide the failure it describes
        text = ""
    desc = getattr(exc, "desc", None)
    if isinstance(desc, str) and TRACEBACK in desc and TRACEBACK not in text:
        text = desc
    return text


def _worker_exception(text: str) -> str | None:
    """``Type: message`` of the last traceback in ``text``; None without a traceback."""
    if TRACEBACK not in text:
        return None
    lines = text[text.rindex(TRACEBACK) + len(TRACEBACK) :].splitlines()
    for index, line in enumerate(lines):
        # Frames, their source lines and 3.11's ^^^ markers are indented; the raised
        # exception's line is the first that is not.
        if not line or line[0].isspace():
            continue
        found = _RAISED.match(line)
        if found is None:
            return None
        message = [found.group("message") or ""]
        for more in lines[index + 1 :]:
            if _END.match(more):
                break
            message.append(more)
        text = _SQLSTATE.sub("", "\n".join(message))
        return _one_line(found.group("type").rsplit(".", 1)[-1], text)
    return None


def _one_line(type_name: str, message: str) -> str:
    """``type_name: message`` on one line (``type_name`` alone for an empty message)."""
    flat = " ".join(message.split())
    if len(flat) > MAX_CHARS:
        flat = flat[: MAX_CHARS - 1] + "…"
    return f"{type_name}: {flat}" if flat else type_name
