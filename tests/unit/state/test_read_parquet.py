"""Reading a state, sink or imported Parquet file starts no thread.

Arrow's C++ thread pools, once started, can abort a process as it exits (``terminate called
without an active exception``, apache/arrow#34314): 7 of 180 ``state export`` runs did on a
busy 2-core machine. The count is taken in a fresh interpreter, where nothing else of the
suite has started Arrow's pools already.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyarrow as pa

from microcheckpoint.state.files import ROWS, encode_rows, read_parquet

PROBE = textwrap.dedent(
    """
    import os, sys
    import pyarrow as pa
    from microcheckpoint.state.files import ROWS, encode_rows, read_parquet, rows_of
    from microcheckpoint.state.backends import decode_table, encode_table
    from microcheckpoint.state.handles import StateHandle

    def threads():
        return len(os.listdir("/proc/self/task"))

    rows = pa.table([[1, 2], ['"a"', '"b"'], ["1", "2"], [5, 6]], schema=ROWS)
    data = encode_rows(rows)
    before = threads()
    assert rows_of(data, StateHandle("chk-0000000001/t/base.parquet", (1, 2)), "x") == rows
    assert decode_table(encode_table({'"a"': (1, 5)}), "y") == {'"a"': (1, 5)}
    path = sys.argv[1]
    with open(path, "wb") as f:
        f.write(data)
    assert read_parquet(path, ["key"]).column("key").to_pylist() == ['"a"', '"b"']
    print(before, threads())
    """
)


def test_reading_parquet_files_starts_no_thread(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "rows.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before, f"reading started {after - before} threads"


def test_read_parquet_reads_bytes_and_columns() -> None:
    rows = pa.table([[3], ['"k"'], [None], [9]], schema=ROWS)
    assert read_parquet(encode_rows(rows)).cast(ROWS) == rows
    assert read_parquet(encode_rows(rows), ["kg"]).column_names == ["kg"]
