"""The S3 request budget (``bench/s3_requests.py``, docs/operations.md) counted exactly.

Runs the bench's own ``count_epochs`` (the word count with keyed state and an exactly-once
S3 sink, every request through the logging fault proxy) on one partition at parallelism 2,
and asserts the second epoch's requests, which the protocol fixes: one put-if-absent each
of ``_pending`` (which also begins the run's attempt), ``_outcome`` and ``_metadata``, one
per task's ack, the scans' LISTs, retention's deletes. Only the GETs of state files depend on which Python
worker's cache a subtask lands in, so they are left out of the exact GET count.
"""

from __future__ import annotations

import pytest

from bench._s3_budget import KINDS
from bench.s3_requests import count_epochs

pytestmark = pytest.mark.integration

STATE_GET = ("state file (keyed snapshot)", "GET")
# Epoch 2 of 1 partition at parallelism 2: per (purpose, kind), as measured and explained
# in docs/operations.md ("The S3 request budget").
EXPECTED = {
    ("_pending (barrier n, put-if-absent)", "conditional PUT"): 1,
    ("ack (one per task, put-if-absent)", "conditional PUT"): 5,  # source, 2 keyed, 2 sink
    ("_outcome (COMPLETED claim)", "conditional PUT"): 1,
    ("_metadata (the commit point)", "conditional PUT"): 1,
    ("sink manifest (publish commit)", "conditional PUT"): 1,
    ("state file (keyed snapshot)", "PUT"): 2,
    ("sink staged part", "PUT"): 2,
    ("sink published part", "PUT"): 2,
    ("_notified", "PUT"): 1,
    # Listings: start (recovery and trigger; with the _pending it writes, it serves the
    # plan), complete (it reads the acks meanwhile), notify (it reads _restore and the sink
    # publishes meanwhile; retention decides on it).
    ("list the pipeline's checkpoints (scan)", "LIST"): 3,
    # Each record read once by the driver (its own writes never: the views share them).
    ("_metadata (the commit point)", "GET"): 1,  # checkpoint 1's: the start point
    ("ack (one per task, put-if-absent)", "GET"): 5,  # complete
    ("_restore (read: no restore)", "GET"): 2,  # start, notify (for retention)
    ("sink staged part", "GET"): 2,
    ("sink manifest (publish commit)", "GET"): 1,
    ("_stopped (read: not stopped)", "GET"): 1,
    ("_cancelled (read: id floor)", "GET"): 1,
    ("_failures_reset (read)", "GET"): 1,
    # Retention drops checkpoint 1 (its _pending, then _metadata, then the rest) and
    # deletes checkpoint 2's acks (now inside its _metadata). A round of one key is a
    # DELETE; the last round's nine keys (checkpoint 1's _outcome, _notified and two
    # staged parts, checkpoint 2's five acks) go in one DeleteObjects request.
    ("_pending (barrier n, put-if-absent)", "DELETE"): 1,
    ("_metadata (the commit point)", "DELETE"): 1,
    ("deletes (DeleteObjects, several keys)", "DELETE"): 1,
}


def test_a_steady_state_epoch_makes_exactly_the_budgeted_requests(
    spark, s3_endpoint, kafka_bootstrap, s3_bucket
) -> None:
    first, second = count_epochs(
        spark, s3_endpoint, kafka_bootstrap, s3_bucket, partitions=1, parallelism=2, epochs=2
    )
    purposes = second.purposes()
    state_gets = purposes.pop(STATE_GET, 0)
    kinds = second.kinds()
    print(f"\nS3 REQUESTS epoch 2, 1 partition, parallelism 2: {dict(kinds)}")
    assert (first.checkpoint_id, second.checkpoint_id) == (1, 2)
    assert dict(purposes) == EXPECTED
    assert {k: kinds[k] for k in KINDS} == {
        "PUT": 7,
        "conditional PUT": 9,
        "GET": 14 + state_gets,
        "HEAD": 0,
        "LIST": 3,
        "DELETE": 3,
    }
    # Each keyed subtask reads at most its chain (epoch 1's delta of each subtask).
    assert 0 <= state_gets <= 2
    # The critical path, at most: the driver's 28 requests (it sends some at once: the
    # markers, the acks it reads, retention beside the sink's publish), then the longest
    # keyed task (PUT delta, put-if-absent ack; the GET of its chain, when its worker's
    # cache lacks it, goes as the task starts, beside its shuffle read), then the longest
    # sink task (PUT staged part, ack).
    assert second.driver() == 28
    assert second.critical() == 28 + 2 + 2
    assert second.sequential() <= len(second.records)
