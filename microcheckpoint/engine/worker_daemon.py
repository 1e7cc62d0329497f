"""PySpark's worker daemon, with an epoch's imports done once before it forks workers.

Spark starts Python workers by forking them from one daemon per executor
(``spark.python.daemon.module``). PySpark's own daemon imports nothing heavy first, because
pyarrow and numpy start threads on import and a fork copies no thread. So every worker
imports pyarrow, pandas, PySpark's Arrow serializers and the engine again: about 0.85 s of
CPU per worker, and a Spark JVM starts a new worker whenever one sat idle for a minute.

This daemon imports them once, with their threads turned off, then runs PySpark's daemon:
jemalloc's background thread (``JE_ARROW_MALLOC_CONF=background_thread:false``: it frees
pages in the allocating thread instead) and OpenBLAS's pool (``OPENBLAS_NUM_THREADS=1``:
the engine does no linear algebra). It checks that the process still runs one thread and
says so on the executor's stderr if not (jemalloc and OpenBLAS take their own locks around
a fork, but an unknown thread's locks could be held in the copy). Forked workers share the
imported pages with the daemon until they write to them.

Set by ``engine.spark.EPOCH_SETTINGS`` (``spark.python.daemon.module``), in-process and on
the Connect server alike.
"""

from __future__ import annotations

import os
import sys

__all__ = ["preload"]

# The modules an epoch's Python workers import: PySpark's worker and Arrow serializers (and
# with them pyarrow, pandas and numpy), and the engine's functions that Spark runs there.
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "microcheckpoint.engine.keyed",
    "microcheckpoint.engine.routing",
    "microcheckpoint.engine.sinkstage",
    "microcheckpoint.engine.sources",
    "microcheckpoint.engine.operator_subtask",
)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no daemon forks there (spark.python.use.daemon)
        return 1


def preload(modules: tuple[str, ...] = PRELOAD) -> bool:
    """Import ``modules`` with their threads off. False, with nothing imported, when this
    process runs another thread already; False, with a line on stderr, when the imports
    started one."""
    os.environ["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if _threads() != 1:
        return False
    import importlib

    for name in modules:
        importlib.import_module(name)
    threads = _threads()
    if threads != 1:
        print(
            f"microcheckpoint worker daemon: {threads - 1} thread(s) started by the preloaded "
            "imports; workers are forked from a process with threads",
            file=sys.stderr,
        )
        return False
    return True


if __name__ == "__main__":
    preload()
    from pyspark import daemon

    daemon.manager()
