"""One keyed process function with state of every kind, in versions that change its state
(tests of state evolution and of offline state). The input folder comes from
``EVOLUTION_INPUT``, so the console script's ``--module`` loads the same pipeline.

Per key: a count (value of long), the event times seen (list, 1 h TTL), the latest event
time as a record (value with fields), the times by ``ts % 3`` (map), the highest (reducing)
and the mean (aggregating); an event-time timer ``GAP`` ms after each epoch's latest row
of the key reports the count and the latest record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from microcheckpoint.engine import (
    Aggregator,
    EventTime,
    FileSource,
    KeyedProcess,
    KeyedProcessFunction,
    Pipeline,
    StateTtl,
    aggregating_state,
    list_state,
    map_state,
    reducing_state,
    value_state,
)
from microcheckpoint.state.kinds import StateDescriptor

GAP = 50
BOUND = 5
SCHEMA = "k string, at long, count long, last string"
MEAN = Aggregator(lambda: [0, 0], lambda a, v: [a[0] + v, a[1] + 1], lambda a: a[0] / a[1])


class Tally(KeyedProcessFunction):
    """The function of every version: it uses the states its version declares."""

    def __init__(self, *states: StateDescriptor) -> None:
        self.states = states
        self.names = {d.name for d in states}

    def process(self, key, rows, ctx):
        times = [r["ts"] for r in rows]
        count = ctx.state("count")
        count.update(count.value() + len(rows))
        if "recent" in self.names:
            ctx.state("recent").add_all(times)
        ctx.state("last").update({"ts": max(times)})
        for t in times:
            ctx.state("seen").put(t % 3, t)
            ctx.state("top").add(t)
            ctx.state("mean").add(t)
        ctx.timers.register_event_time(max(times) + GAP)
        return []

    def on_timer(self, key, timestamp, ctx):
        last = json.dumps(ctx.state("last").value(), sort_keys=True)
        return [{"k": key, "at": timestamp, "count": ctx.state("count").value(), "last": last}]


COUNT = value_state("count", default=0, type="long")
RECENT = list_state("recent", ttl=StateTtl(3600))
LAST = value_state("last", fields={"ts": 0})
OTHERS = (map_state("seen"), reducing_state("top", reduce=max), aggregating_state("mean", MEAN))
VERSIONS = {
    "v1": (COUNT, RECENT, LAST, *OTHERS),
    "added": (COUNT, RECENT, LAST, *OTHERS, value_state("extra")),
    "dropped": (COUNT, LAST, *OTHERS),
    "retyped": (value_state("count", default=0, type="string"), RECENT, LAST, *OTHERS),
    "field_added": (COUNT, RECENT, value_state("last", fields={"ts": 0, "src": "file"}), *OTHERS),
}


def pipeline(version: str = "v1", name: str | None = None, folder: str | None = None) -> Pipeline:
    """The pipeline of ``version`` reading ``folder`` (default: ``EVOLUTION_INPUT``)."""
    where = folder or os.environ.get("EVOLUTION_INPUT") or "/tmp/evolution-input"
    source = FileSource(
        "files", Path(where).as_uri(), max_files_per_epoch=1, event_time=EventTime("ts", BOUND)
    )
    operator = KeyedProcess("tally", "k", Tally(*VERSIONS[version]), SCHEMA)
    return Pipeline(name or os.environ.get("MICROCHECKPOINT_PIPELINE", "evolving"), source).then(
        operator
    )


v1 = pipeline("v1")
added = pipeline("added")
dropped = pipeline("dropped")
retyped = pipeline("retyped")
field_added = pipeline("field_added")
