"""The worked example of docs/engine.md ("State of every kind") runs as written: its code
block is executed and its function driven through ``run_function`` epoch by epoch."""

from __future__ import annotations

import re
from pathlib import Path

from microcheckpoint.engine.process import EpochTimes
from tests.unit.engine.test_process import Store

DOC = Path(__file__).resolve().parents[3] / "docs" / "engine.md"
T = 1_700_000_000_000


def _example() -> dict:
    text = DOC.read_text()
    section = text[text.index("### State of every kind") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)
    return scope


def test_the_sessions_example_reports_each_quiet_users_session_once() -> None:
    scope = _example()
    assert scope["pipeline"].operators[0].uid == "sessions"
    store, fn = Store(), scope["Sessions"]()
    click = lambda page, ts, dwell: {"page": page, "ts": ts, "dwell_ms": dwell}  # noqa: E731
    # epoch 1: two clicks of ann; the watermark stays below her session's end (61 s)
    out = store.epoch(
        fn, EpochTimes(T, None, 30_000), {"ann": [click("a", 0, 100), click("b", 1_000, 300)]}
    )
    assert out == []
    # epoch 2: one more click moves her end to 70 s; the timer at 61 s fires and is skipped
    out = store.epoch(fn, EpochTimes(T, 30_000, 65_000), {"ann": [click("a", 10_000, 200)]})
    assert out == []
    # epoch 3: the watermark passes 70 s: one report of all three clicks
    out = store.epoch(fn, EpochTimes(T, 65_000, 80_000), {"bob": [click("z", 79_000, 50)]})
    assert out == [{"user": "ann", "clicks": 3, "pages": 3, "mean_ms": 200.0}]
    # her "seen" map (a day's TTL) outlives the session; the other states were cleared
    (ann,) = [v for k, v in store.groups[0].items() if k == '"ann"']
    assert set(ann["s"]) == {"seen"} and set(ann["s"]["seen"]) == {'"a"', '"b"'}
