"""Reading the fault proxy's request log: kinds, purposes and the critical path of an epoch.

Pure functions over ``harness.s3_proxy.RequestRecord`` (no services), used by
``bench/s3_requests.py`` and its test.

The critical path is measured two ways:

- **observed** (``longest_sequence``): the largest set of the epoch's requests no two of
  which overlapped in time, each ending before the next began (the longest chain of the
  interval order, found greedily by end time). On two cores the Spark tasks of a stage run
  two at a time, so requests that could overlap on a bigger cluster may follow one another
  here: an upper bound, on this machine, of what the store's latency multiplies;
- **by dependency** (``dependency_path``): the driver's requests (one thread: they follow
  one another) plus, for every Spark stage, the requests of its longest task (the tasks of
  a stage may run side by side; the keyed stage ends before the sink's begins). A task is
  one client connection of an executor (each task opens its store, and one thread uses one
  connection); its stage is the uid of the ack it wrote. A keyed task's GETs of state
  files are not in its chain: it sends them as it starts, beside its shuffle read
  (``engine.keyed._prefetch``), so no request of its waits for them. What the chain would
  be with a core per task.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

from harness.s3_proxy import Op, RequestRecord

__all__ = [
    "KINDS",
    "dependency_path",
    "kind_of",
    "longest_sequence",
    "prefix_of",
    "purpose_of",
]

KINDS = ("PUT", "conditional PUT", "GET", "HEAD", "LIST", "DELETE")
_MARKERS = {
    "_pending": "_pending (barrier n, put-if-absent)",
    "_outcome": "_outcome (COMPLETED claim)",
    "_metadata": "_metadata (the commit point)",
    "_notified": "_notified",
    "_restore": "_restore (read: no restore)",
    "_stopped": "_stopped (read: not stopped)",
    "_cancelled": "_cancelled (read: id floor)",
    "_failures_reset": "_failures_reset (read)",
}
_CHK = re.compile(r"^(.*?/)chk-0*(\d+)/")


def kind_of(record: RequestRecord) -> str:
    """The request's kind: one of ``KINDS``, or ``OTHER`` (bucket creation and the like)."""
    if record.op is Op.CONDITIONAL_PUT:
        return "conditional PUT"
    if record.op is Op.PUT:
        return "PUT"
    if record.op is Op.DELETE:
        return "DELETE"
    if record.method == "HEAD":
        return "HEAD"  # HeadObject, and HeadBucket (the proxy calls that a LIST)
    if record.op is Op.LIST:
        return "LIST"
    if record.op is Op.GET:
        return "GET"
    return "OTHER"


def _list_prefix(record: RequestRecord) -> str:
    query = parse_qs(urlsplit(record.path).query)
    return query.get("prefix", [""])[0]


def purpose_of(record: RequestRecord) -> str:
    """What the request is for, from its key (a LIST's from its prefix).

    Edge cases: a GET of a missing marker (``_restore`` when nothing was restored) is a
    request all the same and counts under that marker; a DELETE of a key already gone (a
    discarded checkpoint's ``_pending``) too.
    """
    if record.op is Op.LIST:
        if record.method == "HEAD":
            return "bucket check"
        prefix = _list_prefix(record)
        if prefix.endswith("/chk-"):
            return "list the pipeline's checkpoints (scan)"
        if "/chk-" in prefix:
            return "list one checkpoint (cleanup)"
        if "/_manifests/" in prefix:
            return "list the sink's manifests"
        return f"list {prefix or 'the bucket'}"
    if record.op is Op.DELETE and record.method == "POST":
        return "deletes (DeleteObjects, several keys)"
    key = record.key
    name = key.rsplit("/", 1)[-1]
    if key.startswith(("_probe/", "checkpoints/_probe/")):
        return "store probe"
    if "/acks/" in key:
        return "ack (one per task, put-if-absent)"
    if "/state/" in key:
        return "state file (keyed snapshot)"
    if "/sink/" in key:
        return "sink staged part"
    if "/_manifests/" in key:
        return "sink manifest (publish commit)"
    if "/epoch-" in key:
        return "sink published part"
    if name.startswith("_attempt-"):
        return "_attempt marker"
    return _MARKERS.get(name, f"other ({name})")


def prefix_of(record: RequestRecord, checkpoint_id: int) -> str:
    """The folder the request goes to, with the pipeline's name as ``<p>``: the epoch's own
    checkpoint ``chk-<n>/``, an older one ``chk-<older>/``, the pipeline's folder (its
    markers), the sink's output folder; a LIST by the prefix it lists."""
    key = _list_prefix(record) if record.op is Op.LIST else record.key
    if record.op is Op.LIST and record.method == "HEAD":
        return "(the bucket)"
    if record.op is Op.LIST and key.endswith("/chk-"):
        return f"LIST {key.split('/')[0]}/<p>/chk-"
    match = _CHK.match(key)
    if match:
        root = match.group(1).split("/")[0]
        which = "chk-<n>" if int(match.group(2)) == checkpoint_id else "chk-<older>"
        return f"{'LIST ' if record.op is Op.LIST else ''}{root}/<p>/{which}/"
    parts = key.split("/")
    if len(parts) > 2:
        return f"{parts[0]}/<p>/" + ("" if parts[2].startswith("_") else f"{parts[2]}/")
    return f"{parts[0]}/" if len(parts) > 1 else "(the bucket)"


def longest_sequence(records: Iterable[RequestRecord]) -> int:
    """The most requests no two of which overlapped in time (each ended before the next
    started): greedy by end time, which is optimal for intervals. Zero for no requests."""
    count, last_end = 0, float("-inf")
    for record in sorted(records, key=lambda r: r.ended):
        if record.started >= last_end:
            count += 1
            last_end = record.ended
    return count


def _stage(records: list[RequestRecord]) -> str:
    """The uid of the ack one connection's task wrote (``?`` when it wrote none)."""
    for record in records:
        if "/acks/" in record.key and record.op is Op.CONDITIONAL_PUT:
            return record.key.rsplit("/", 1)[-1].split("#", 1)[0]
    return "?"


def dependency_path(records: Iterable[RequestRecord], driver_host: str) -> int:
    """The driver's requests plus, per Spark stage, its longest task's (see the module).

    Args:
        records: one epoch's requests.
        driver_host: the host name in the driver's ``Host`` header (the executors use another).
    """
    driver = 0
    tasks: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in records:
        if record.host.startswith(driver_host):
            driver += 1
        elif not (record.op is Op.GET and "/state/" in record.key):
            tasks[record.client_port].append(record)
    longest: Counter[str] = Counter()
    for task in tasks.values():
        stage = _stage(task)
        longest[stage] = max(longest[stage], len(task))
    return driver + sum(longest.values())
