"""``microcheckpoint-warm``: the epochs' Python workers kept between sparse epochs.

Through the console script, against the session's Spark Connect server: every round runs a
task on workers already warm, and they are the workers a job of the shared session (the one
every epoch joins) runs on. Bad input is one line and exit code 2, before any connection.
The rounds' timing and a failed round are ``tests/unit/engine/test_warm.py``'s (a round
against no server waits out the Connect client's own retries, minutes).
Spark ends a worker idle for a minute (``engine.warm``); that a kept worker outlives the
minute is measured, not tested here (docs/engine.md), since it takes more than a minute.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cli_support import REPO

pytestmark = pytest.mark.integration
SCRIPT = Path(sys.executable).with_name("microcheckpoint-warm")

# The workers a job of the shared session runs on, in a process of its own (this test
# process may hold a classic Spark session, which cannot sit beside a Connect one).
CLIENT = """
import json, sys
from microcheckpoint.engine.spark import connect_spark
from microcheckpoint.engine.warm import touch_workers
print(json.dumps(touch_workers(connect_spark(sys.argv[1]), 2)))
"""


def _warm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_rounds_keep_the_shared_sessions_workers(spark_connect_url: str) -> None:
    done = _warm(spark_connect_url, "--rounds", "3", "--every", "2", "--parallelism", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    rounds = []
    for number, line in enumerate(lines, start=1):
        found = re.fullmatch(
            rf"round {number}: 2 Python worker\(s\) warm \(pids (\d+), (\d+)\) in [\d.]+ s", line
        )
        assert found, line
        rounds.append(sorted(map(int, found.groups())))
    # The workers outlive the rounds: the last round runs on workers an earlier round had
    # (a round may meet a worker not yet back in Spark's idle pool and start one more, as
    # on a busy machine; the pool hands out its oldest idle worker first).
    kept = set().union(*map(set, rounds[:-1]))
    assert set(rounds[-1]) <= kept, rounds
    kept |= set(rounds[-1])
    # A job of the shared session, which every epoch joins, runs on those very workers.
    client = subprocess.run(
        [sys.executable, "-c", CLIENT, spark_connect_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert client.returncode == 0, client.stderr[-3000:]
    assert set(json.loads(client.stdout.splitlines()[-1])) <= kept, (rounds, client.stdout)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("sc://127.0.0.1:1", "--every", "55"),
            "microcheckpoint: config field 'every' = 55.0 is invalid: seconds from one round's "
            "start to the next, above 0 and at most 50 (Spark ends a Python worker idle for "
            "60 s), e.g. 45",
        ),
        (
            ("sc://127.0.0.1:1", "--every", "0"),
            "microcheckpoint: config field 'every' = 0.0 is invalid: seconds from one round's "
            "start to the next, above 0 and at most 50 (Spark ends a Python worker idle for "
            "60 s), e.g. 45",
        ),
        (
            ("sc://127.0.0.1:1", "--parallelism", "0"),
            "microcheckpoint: config field 'parallelism' = 0 is invalid: the number of Python "
            "workers to keep, 1 or more",
        ),
        (
            ("sc://127.0.0.1:1", "--rounds", "0"),
            "microcheckpoint: config field 'rounds' = 0 is invalid: 1 or more, or leave it out "
            "to run until stopped",
        ),
        (
            ("http://127.0.0.1:15002",),
            "microcheckpoint: config field 'remote' = 'http://127.0.0.1:15002' is invalid: the "
            "Spark Connect URL, sc://host:port",
        ),
        (
            ("sc://127.0.0.1:1", "--paralelism", "2"),
            "microcheckpoint: No such option: --paralelism (Possible options: --parallelism); "
            "see `microcheckpoint-warm --help`",
        ),
    ],
)
def test_bad_input_is_one_line_before_any_connection(args: tuple[str, ...], line: str) -> None:
    done = _warm(*args, timeout=60)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [line], "")
