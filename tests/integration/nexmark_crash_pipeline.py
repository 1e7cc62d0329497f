"""The Nexmark pipelines the Nexmark crash tests run in ``spark_jobs/run_epoch.py`` jobs.

``q7`` and ``q11`` are single-stage (``examples.nexmark_queries``); ``q5_a`` and ``q5_b``
are q5's two stages (``examples.nexmark_query_stages``). Where they read and write comes
from the environment, read at import (the driver and the Connect server's workers import
this module): ``NEXMARK_CRASH_BIDS`` (the bids folder URL), ``NEXMARK_CRASH_SINK`` (the
FileSink target), ``NEXMARK_CRASH_BOOTSTRAP`` and ``NEXMARK_CRASH_TOPIC`` (q5's internal
topic). The watermark bound is ``BOUND_MS``, above the generator's out-of-orderness.
"""

from __future__ import annotations

import os

from examples.nexmark_queries import q7 as build_q7
from examples.nexmark_queries import q11 as build_q11
from examples.nexmark_query_stages import build as build_stages

__all__ = ["BOUND_MS", "q5_a", "q5_b", "q7", "q11"]

BOUND_MS = 2_000
BIDS = os.environ.get("NEXMARK_CRASH_BIDS", "file:///tmp/nexmark-crash/in/bids")
SINK = os.environ.get("NEXMARK_CRASH_SINK", "file:///tmp/nexmark-crash/out")
BOOTSTRAP = os.environ.get("NEXMARK_CRASH_BOOTSTRAP", "127.0.0.1:9092")
TOPIC = os.environ.get("NEXMARK_CRASH_TOPIC", "nexmark-crash-q5")

q7 = build_q7(BIDS, SINK, bound_ms=BOUND_MS)
q11 = build_q11(BIDS, SINK, bound_ms=BOUND_MS)
q5_a, q5_b = build_stages("q5", BIDS, SINK, BOOTSTRAP, TOPIC, bound_ms=BOUND_MS)
