"""The named fault points: slow and crash points, armed only through the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from microcheckpoint import faults


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    calls: list[float] = []
    monkeypatch.setattr(faults, "_sleep", calls.append)  # other threads keep time.sleep
    return calls


@pytest.mark.parametrize("content", ["7.5", "wordcount 7.5"])
def test_the_first_epoch_of_the_named_pipeline_sleeps_once(tmp_path: Path, slept, content) -> None:
    flag = tmp_path / "slow-once"
    flag.write_text(content)
    faults.slow_point(str(flag), "wordcount")
    faults.slow_point(str(flag), "wordcount")
    assert slept == [7.5]
    assert not flag.exists()


def test_another_pipeline_passes_by_and_leaves_the_flag(tmp_path: Path, slept) -> None:
    flag = tmp_path / "slow-once"
    flag.write_text("wordcount 7.5")
    faults.slow_point(str(flag), "wordcount_hourly")
    assert slept == []
    assert flag.read_text() == "wordcount 7.5"
    faults.slow_point(str(flag), "wordcount")
    assert slept == [7.5]


def test_no_flag_no_sleep(tmp_path: Path, slept) -> None:
    faults.slow_point(None, "wordcount")
    faults.slow_point(str(tmp_path / "absent"), "wordcount")
    assert slept == []


def test_unarmed_points_do_nothing_and_records_pass_through_untouched() -> None:
    quiet = faults.Faults()
    batches = iter([[0, 1], [2]])
    assert quiet.reading_batches(batches) is batches
    quiet.point("after_snapshot")
    armed_elsewhere = faults.Faults("after_acks", 1)
    armed_elsewhere.point("after_snapshot")
    assert list(armed_elsewhere.reading_batches([[0, 1], [2]])) == [[0, 1], [2]]


def test_the_environment_arms_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.CRASH_ENV, "reading")
    monkeypatch.setenv(faults.SLOW_ENV, "/tmp/flag")
    armed = faults.Faults.from_env()
    assert armed == faults.Faults("reading", os.getpid(), "/tmp/flag")
    monkeypatch.delenv(faults.CRASH_ENV)
    monkeypatch.delenv(faults.SLOW_ENV)
    assert faults.Faults.from_env() == faults.Faults(None, os.getpid(), None)


@pytest.mark.parametrize(
    ("point", "printed"),
    [
        ("reading", "[0, 1, 2, 3, 4]"),
        ("after_snapshot", "[0, 1, 2, 3, 4] [5, 6, 7, 8, 9] snapshot"),
    ],
)
def test_an_armed_point_kills_the_process_there(point: str, printed: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from microcheckpoint.faults import Faults
        f = Faults({point!r}, 0)
        for batch in f.reading_batches([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]):
            print(batch, end=" ", flush=True)
        print("snapshot", end=" ", flush=True)
        f.point("after_snapshot")
        print("acked", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.strip() == printed


def test_arming_helpers_refuse_unknown_points(tmp_path: Path) -> None:
    from harness.faults import crash_env, slow_once

    assert crash_env("after_acks") == {faults.CRASH_ENV: "after_acks"}
    with pytest.raises(ValueError, match="unknown crash point 'after_lunch'"):
        crash_env("after_lunch")
    flag = tmp_path / "flag"
    assert slow_once(flag, 2.5, "wordcount") == {faults.SLOW_ENV: str(flag)}
    assert flag.read_text() == "wordcount 2.5"


def test_a_hold_point_holds_one_process_until_released(tmp_path: Path) -> None:
    import threading

    from harness.faults import Hold

    hold = Hold(tmp_path / "hold", "publishing")
    flag = hold.env[faults.HOLD_ENV]
    calls: list[str] = []
    assert not faults.hold_point(flag, "reading", lambda: calls.append("flushed"))
    assert calls == [] and not hold.reached  # another point passes by and leaves it armed
    done = threading.Event()

    def holder() -> None:
        faults.hold_point(flag, "publishing", lambda: calls.append("flushed"))
        done.set()

    thread = threading.Thread(target=holder)
    thread.start()
    hold.wait_reached(30)
    assert calls == ["flushed"]
    assert not done.wait(0.2)  # still held
    assert not faults.hold_point(flag, "publishing")  # a second process passes by
    hold.release()
    thread.join(30)
    assert done.is_set() and not hold.reached


def test_a_reading_hold_comes_after_the_first_batch_only(tmp_path: Path) -> None:
    import threading

    from harness.faults import Hold

    hold = Hold(tmp_path / "hold", "reading")
    armed = faults.Faults(hold_flag=hold.env[faults.HOLD_ENV])
    seen: list[list[int]] = []

    def read() -> None:
        seen.extend(armed.reading_batches([[0, 1], [2], [3]]))

    thread = threading.Thread(target=read)
    thread.start()
    hold.wait_reached(30)
    assert seen == [[0, 1]]
    hold.release()
    thread.join(30)
    assert seen == [[0, 1], [2], [3]]
    with pytest.raises(ValueError, match="unknown hold point 'lunch'"):
        Hold(tmp_path / "other", "lunch")
