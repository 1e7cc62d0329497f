"""Runs DAG runs with ``dag.test()`` in its own process (Airflow reads its config at import).

Usage: python dagtest_driver.py '{"dag_file": ..., "runs": [{"dag_id": ..., "conf": {...},
"logical_date": "2026-01-01T00:00:00+00:00", "touch": {"path": "text"}}]}'. Runs the runs in
order (``touch`` writes files first, e.g. a fault-injection flag), each on a fresh load of
the DAG file. Prints one line
``RESULT <json>`` with, per run, the run state, its seconds, every task's state and the XCom
values.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from datetime import datetime


def _text(state: object) -> str:
    return str(getattr(state, "value", state))


def _load(path: str, index: int) -> object:
    """A fresh copy of the DAG file's module: ``dag.test()`` renders a run's conf into the
    DAG's own task objects, so a second run of the same DAG object would reuse the first
    run's rendered values."""
    spec = importlib.util.spec_from_file_location(f"dag_under_test_{index}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    request = json.loads(sys.argv[1])

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    results = []
    for index, run in enumerate(request["runs"]):
        dag = getattr(_load(request["dag_file"], index), run["dag_id"])
        for path, text in (run.get("touch") or {}).items():
            with open(path, "w") as handle:
                handle.write(text)
        kwargs = {}
        if run.get("logical_date"):
            kwargs["logical_date"] = datetime.fromisoformat(run["logical_date"])
        started = time.monotonic()
        dag_run = dag.test(run_conf=run.get("conf") or {}, **kwargs)
        seconds = round(time.monotonic() - started, 1)
        with create_session() as session:
            tis = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dag_run.run_id)
            tasks = {ti.task_id: _text(ti.state) for ti in tis}
            xcoms = {
                x.task_id: x.value
                for x in session.query(XComModel).filter_by(
                    dag_id=dag.dag_id, run_id=dag_run.run_id, key="return_value"
                )
            }
        results.append(
            {
                "run_id": dag_run.run_id,
                "state": _text(dag_run.state),
                "seconds": seconds,
                "tasks": tasks,
                "xcom": {
                    k: v if not isinstance(v, bytes) else v.decode() for k, v in xcoms.items()
                },
            }
        )
    print("RESULT " + json.dumps(results, default=str))


if __name__ == "__main__":
    main()
