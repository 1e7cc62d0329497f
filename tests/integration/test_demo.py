"""``make demo`` end to end: its own services, a crash in one cycle, an exact result."""

from __future__ import annotations

from microcheckpoint import demo


def test_demo_recovers_from_an_expired_checkpoint_exactly(capsys):
    assert demo.main(["--cycles", "4", "--records-per-cycle", "90", "--crash-cycle", "2"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint 2 aborted as EXPIRED: True" in out
    assert "records produced:                   360" in out
    assert "records counted by the tasks:       360" in out
    assert "records still to read (lag):        0" in out
    assert "RESULT: OK" in out
    # The epoch after the abort re-reads the aborted range: [30, 60) plus its own 30.
    assert "cycle 3: checkpoint 3 barrier {0: (30, 90), 1: (30, 90), 2: (30, 90)}" in out
