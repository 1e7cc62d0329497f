"""Crash stories across stages, unaligned: ``stage-b`` checkpoints unaligned while
``stage-a`` commits with partition 1's marker held back (``MICROCHECKPOINT_SLOW_CHANNEL``),
so its cuts leave that channel in flight; kill -9 of each stage at each crash point, in a
seeded random order, and every record must still be counted exactly once (the checks of
``test_stage_crash.Story.check``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from microcheckpoint.protocol.records.alignment import AlignmentMode
from tests.integration.test_crash_recovery import CRASH_POINTS
from tests.integration.test_stage_crash import CONFIGS, SEED, Story

pytestmark = pytest.mark.integration


def test_unaligned_stages_killed_at_every_point_count_every_record_once(
    kafka_bootstrap: str, spark_connect_url: str, tmp_path: Path
) -> None:
    # Stage b checkpoints unaligned while stage a commits with partition 1's marker held
    # back: its cuts leave partition 1 in flight, and the next checkpoint reads that first.
    story = Story(kafka_bootstrap, spark_connect_url, tmp_path, {**CONFIGS["b"], "unaligned": True})
    kills = [(stage, point) for stage in "ab" for point in CRASH_POINTS]
    random.Random(SEED + 1).shuffle(kills)
    print(f"seed {SEED + 1}: kills in order {kills}")
    story.run("a")
    story.run("b")
    for stage, point in kills:
        if stage == "a":
            story.run("a", point)
        story.together(crash_b=point if stage == "b" else None)
        # b recovers, or reads the rest of partition 1 up to its marker (the in-flight
        # range), so the next round's b again waits for a's new markers.
        story.run("b")
    alignments = story.check()
    assert {a.mode for a in alignments} == {AlignmentMode.UNALIGNED}
    # Cuts really left the slow channel in flight (more than a few: most rounds do).
    slow = [f"{story.internal}:1"]
    inflight = [a for a in alignments if [i.channel for i in a.inflight] == slow]
    assert len(inflight) >= 3, alignments
