"""The slow-epoch fault injection used by the end-to-end timeout test."""

from __future__ import annotations

from pathlib import Path

import pytest

from microcheckpoint import faults


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    calls: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", calls.append)
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
