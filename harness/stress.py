"""Randomized stress: the seeded step lists and the numbers they produce.

A stress run (``tests/integration/test_stress.py``) is a seeded random list of steps over
one pipeline: produce more records, run a cycle, kill a cycle with ``kill -9`` after a
random part of a cycle's measured duration, take a savepoint, restore a random retained
checkpoint or savepoint with a random parallelism. This module plans the steps (the same
seed gives the same list, so a failure is replayed with ``make stress SEEDS=<seed>``) and
keeps the tally that goes into docs/reliability.md. It runs nothing itself.

    python -m harness.stress REPORT.jsonl   # the table of the runs written to REPORT.jsonl
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

__all__ = ["Kind", "Step", "Tally", "pick", "plan_steps", "table"]


class Kind(Enum):
    PRODUCE = "produce"  # one to three more seqs of every key
    CYCLE = "cycle"  # a whole local cycle, to its end
    KILL = "kill"  # a cycle SIGKILLed after ``at`` x the measured cycle duration
    SAVEPOINT = "savepoint"  # a savepoint of the latest completed checkpoint
    RESTORE = "restore"  # re-base on a retained checkpoint or savepoint, maybe rescaled


# How often each kind comes up: kills and cycles most, restores often enough to matter.
WEIGHTS = {Kind.PRODUCE: 3, Kind.CYCLE: 3, Kind.KILL: 4, Kind.SAVEPOINT: 1, Kind.RESTORE: 2}
PARALLELISMS = (1, 2, 3)


@dataclass(frozen=True)
class Step:
    """One step; ``at`` is a fraction in [0, 1): of the cycle time (KILL) or of the list of
    restorable points (RESTORE), so a replay picks the same moment and the same point."""

    kind: Kind
    seqs: int = 0
    at: float = 0.0
    parallelism: int = 0

    def __str__(self) -> str:
        if self.kind is Kind.PRODUCE:
            return f"produce({self.seqs})"
        if self.kind is Kind.KILL:
            return f"kill({self.at:.2f})"
        if self.kind is Kind.RESTORE:
            return f"restore({self.at:.2f}, p={self.parallelism})"
        return self.kind.value


def plan_steps(seed: int, count: int) -> list[Step]:
    """``count`` random steps for ``seed`` (the run's fixed prologue, produce and one
    cycle to measure a cycle's duration, is not part of them)."""
    rng = random.Random(seed)
    kinds = list(WEIGHTS)
    steps = []
    for _ in range(count):
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        if kind is Kind.PRODUCE:
            steps.append(Step(kind, seqs=rng.randint(1, 3)))
        elif kind is Kind.KILL:
            steps.append(Step(kind, at=round(rng.uniform(0.05, 1.0), 2)))
        elif kind is Kind.RESTORE:
            steps.append(Step(kind, at=rng.random(), parallelism=rng.choice(PARALLELISMS)))
        else:
            steps.append(Step(kind))
    return steps


def pick(items: list, at: float):
    """The item at fraction ``at`` of ``items`` (non-empty)."""
    return items[min(int(at * len(items)), len(items) - 1)]


@dataclass
class Tally:
    """What one seed's run did and found; ``lost``, ``duplicated`` and ``violations`` must
    stay 0. ``kills_landed`` says where in an epoch each kill left storage."""

    seed: int
    steps: int
    cycles: int = 0
    epochs: int = 0  # checkpoints completed
    kills: int = 0
    kills_landed: Counter[str] = field(default_factory=Counter)
    restores: int = 0
    rescales: int = 0
    savepoints: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    violations: int = 0
    recovery_s: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "kills_landed": dict(self.kills_landed)})


def table(tallies: list[dict]) -> str:
    """One Markdown row per seed and a total row (recovery: median / max seconds)."""

    def recovery(values: list[float]) -> str:
        if not values:
            return "-"
        return f"{statistics.median(values):.1f} / {max(values):.1f}"

    head = (
        "| seed | steps | epochs | kills | restores (rescaled) | savepoints | records | lost "
        "| duplicated | violations | recovery after a kill (median / max s) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    columns = ("steps", "epochs", "kills", "restores", "rescales", "savepoints", "records")
    total = dict.fromkeys((*columns, "lost", "duplicated", "violations"), 0)
    every: list[float] = []
    for t in tallies:
        for name in total:
            total[name] += t[name]
        every += t["recovery_s"]
        rows.append(
            f"| {t['seed']} | {t['steps']} | {t['epochs']} | {t['kills']} | {t['restores']} "
            f"({t['rescales']}) | {t['savepoints']} | {t['records']} | {t['lost']} "
            f"| {t['duplicated']} | {t['violations']} | {recovery(t['recovery_s'])} |"
        )
    rows.append(
        f"| **{len(tallies)} seeds** | {total['steps']} | {total['epochs']} | {total['kills']} "
        f"| {total['restores']} ({total['rescales']}) | {total['savepoints']} "
        f"| {total['records']} | {total['lost']} | {total['duplicated']} "
        f"| {total['violations']} | {recovery(every)} |"
    )
    landed: Counter[str] = Counter()
    for t in tallies:
        landed.update(t["kills_landed"])
    where = ", ".join(f"{name} {n}" for name, n in sorted(landed.items()))
    return head + "\n".join(rows) + f"\n\nWhere the kills landed: {where or 'none'}.\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.stress REPORT.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[0])
    lines = path.read_text().splitlines() if path.exists() else []
    tallies = [json.loads(line) for line in lines if line.strip()]
    if not tallies:
        print(f"{path}: no stress runs recorded", file=sys.stderr)
        return 1
    print(table(sorted(tallies, key=lambda t: t["seed"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
