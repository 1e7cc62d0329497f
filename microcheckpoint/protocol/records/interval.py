"""The data interval a checkpoint's barrier covers (barrier policy ``data_interval``).

Kept in the checkpoint's ``_pending`` labels as ``"data_interval": [start, end]``, ISO 8601
strings with their UTC offset (as Airflow's run gave them). The barrier reads up to the
first offset at or after ``end``; ``start`` is where the previous interval should have
ended (a gap is logged, never skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["DataInterval"]


@dataclass(frozen=True)
class DataInterval:
    """``[start, end)`` of a run's data; ``start`` is not after ``end``."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ValueError(
                f"data interval starts at {self.start.isoformat()}, after its end "
                f"{self.end.isoformat()}; give start <= end"
            )

    def to_json(self) -> list[str]:
        return [self.start.isoformat(), self.end.isoformat()]

    @classmethod
    def from_json(cls, body: Sequence[str]) -> DataInterval:
        """Raises ValueError unless ``body`` is two ISO 8601 times."""
        if isinstance(body, str) or len(body) != 2:
            raise ValueError(f"data_interval {body!r} is not [start, end]")
        return cls(datetime.fromisoformat(body[0]), datetime.fromisoformat(body[1]))
