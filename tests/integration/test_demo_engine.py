"""``make demo-engine`` end to end: its own services, a kill -9 of one epoch's Spark job, exact counts."""

from __future__ import annotations

from harness import demo_engine as demo


def test_demo_recovers_from_a_killed_spark_job_exactly(capsys):
    assert demo.main(["--epochs", "3", "--lines-per-epoch", "60", "--crash-epoch", "2"]) == 0
    out = capsys.readouterr().out
    assert "the job died with exit code -9; checkpoint(s) [2] PENDING" in out
    assert "epoch 2: checkpoint 2 completed (attempt 2" in out  # re-run as a new attempt
    assert "lines produced: 180" in out
    assert "RESULT: OK" in out
    assert "OUTPUT: OK" in out
    assert "duplicates: 0" in out
