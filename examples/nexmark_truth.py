"""Ground truths of Nexmark queries 5, 7, 8 and 11, in plain Python (no engine, no Spark).

Windows follow Flink's assigners (offset 0, aligned to the epoch): a window is the
half-open interval ``[window_start, window_end)`` of event time in milliseconds; a tumbling
window of ``size`` holds ``ts`` when ``window_start = ts - ts % size``; a sliding window of
``size`` and ``slide`` starts at every multiple of ``slide`` in ``(ts - size, ts]``.

Every query takes an optional watermark per event (``watermarks[i]`` is the watermark event
``i`` met on arrival, as :func:`examples.nexmark_data.watermarks_at_arrival` gives it) and an
allowed lateness ``L``. Without watermarks the answer is the complete one (no event late).
With them, an event is dropped from window ``[s, e)`` when Flink's ``isWindowLate`` holds:
``e - 1 + L <= watermark`` (the window's last millisecond plus the lateness is behind the
watermark; its state is gone). The watermarks are the caller's: ``watermarks_at_arrival``
uses the engine's ``max seen - bound`` (Flink's generator subtracts one more millisecond).
With a bounded out-of-orderness below the watermark bound no event is dropped, and the
answer equals the complete one.

Rows are returned sorted, so two answers compare with ``==``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "T0_MS",
    "q11_user_sessions",
    "q5_hot_items",
    "q7_highest_bid",
    "q8_new_users",
    "sliding_starts",
    "tumbling_start",
]

T0_MS = 1_700_000_000_000
Marks = Sequence[int | None] | None


def tumbling_start(ts: int, size_ms: int) -> int:
    """The start of the tumbling window of ``size_ms`` holding ``ts`` (floor, also below 0)."""
    return ts - ts % size_ms


def sliding_starts(ts: int, size_ms: int, slide_ms: int) -> list[int]:
    """Starts of the sliding windows holding ``ts``, newest first (``ceil(size/slide)`` or
    ``floor`` of them when ``size`` is not a multiple of ``slide``)."""
    if size_ms < 1 or slide_ms < 1:
        raise ValueError(f"window size {size_ms} / slide {slide_ms} ms: give both >= 1")
    start, out = ts - ts % slide_ms, []
    while start > ts - size_ms:
        out.append(start)
        start -= slide_ms
    return out


def _accepted(
    events: Sequence[dict[str, Any]],
    marks: Marks,
    lateness: int,
    starts: Callable[[int], list[int]],
    size: int,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(window_start, event)`` for each window an event lands in and is not late for."""
    if marks is not None and len(marks) != len(events):
        raise ValueError(f"{len(marks)} watermarks for {len(events)} events: give one per event")
    for i, event in enumerate(events):
        mark = None if marks is None else marks[i]
        for start in starts(event["date_time"]):
            if mark is None or start + size - 1 + lateness > mark:
                yield start, event


def q5_hot_items(
    bids: Sequence[dict[str, Any]],
    size_ms: int = 10_000,
    slide_ms: int = 2_000,
    *,
    watermarks: Marks = None,
    allowed_lateness_ms: int = 0,
) -> list[dict[str, int]]:
    """Nexmark q5, hot items: per sliding window, the auctions with the most bids.

    Flink's Nexmark: count bids per (auction, HOP window), then keep each auction whose
    count is >= the window's maximum count. Ties: every auction with the maximum is a row.
    A window with no bids has no row.

    Returns:
        ``{"window_start", "window_end", "auction", "num"}`` sorted by window, then auction.
    """
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    starts = lambda ts: sliding_starts(ts, size_ms, slide_ms)  # noqa: E731
    for start, bid in _accepted(bids, watermarks, allowed_lateness_ms, starts, size_ms):
        counts[start][bid["auction"]] += 1
    rows = []
    for start in sorted(counts):
        top = max(counts[start].values())
        for auction in sorted(a for a, n in counts[start].items() if n == top):
            rows.append(
                {
                    "window_start": start,
                    "window_end": start + size_ms,
                    "auction": auction,
                    "num": top,
                }
            )
    return rows


def q7_highest_bid(
    bids: Sequence[dict[str, Any]],
    size_ms: int = 10_000,
    *,
    watermarks: Marks = None,
    allowed_lateness_ms: int = 0,
) -> list[dict[str, int]]:
    """Nexmark q7, highest bid: per tumbling window, the bids with the window's top price.

    Flink's Nexmark joins the bids with ``MAX(price)`` per TUMBLE window; here a bid belongs
    to its own window ``[start, end)`` only (Flink's ``BETWEEN end - 10 s AND end`` also
    admits a bid at exactly ``end``). Ties: every bid with the top price is a row, the same
    bid twice gives two rows.

    Returns:
        ``{"window_start", "window_end", "auction", "bidder", "price"}`` sorted.
    """
    windows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    starts = lambda ts: [tumbling_start(ts, size_ms)]  # noqa: E731
    for start, bid in _accepted(bids, watermarks, allowed_lateness_ms, starts, size_ms):
        windows[start].append(bid)
    rows = []
    for start, inside in windows.items():
        top = max(b["price"] for b in inside)
        rows.extend(
            {
                "window_start": start,
                "window_end": start + size_ms,
                "auction": b["auction"],
                "bidder": b["bidder"],
                "price": b["price"],
            }
            for b in inside
            if b["price"] == top
        )
    return sorted(rows, key=lambda r: tuple(r.values()))


def q8_new_users(
    persons: Sequence[dict[str, Any]],
    auctions: Sequence[dict[str, Any]],
    size_ms: int = 10_000,
    *,
    person_watermarks: Marks = None,
    auction_watermarks: Marks = None,
    allowed_lateness_ms: int = 0,
) -> list[dict[str, Any]]:
    """Nexmark q8, monitor new users: persons who joined and opened an auction in one window.

    Flink's Nexmark: persons grouped by (id, name, TUMBLE window) joined with auctions
    grouped by (seller, window) on id = seller and the same window. One row per person and
    window however many auctions they opened in it; an auction in a later window does not
    count.

    Returns:
        ``{"window_start", "window_end", "person", "name"}`` sorted by window, then person.
    """
    starts = lambda ts: [tumbling_start(ts, size_ms)]  # noqa: E731
    lateness = allowed_lateness_ms
    sellers = {
        (start, a["seller"])
        for start, a in _accepted(auctions, auction_watermarks, lateness, starts, size_ms)
    }
    rows = {
        (start, p["id"], p["name"])
        for start, p in _accepted(persons, person_watermarks, lateness, starts, size_ms)
        if (start, p["id"]) in sellers
    }
    return [
        {"window_start": s, "window_end": s + size_ms, "person": pid, "name": name}
        for s, pid, name in sorted(rows)
    ]


def q11_user_sessions(
    bids: Sequence[dict[str, Any]],
    gap_ms: int = 10_000,
    *,
    watermarks: Marks = None,
    allowed_lateness_ms: int = 0,
) -> list[dict[str, int]]:
    """Nexmark q11, user sessions: bids per bidder per session window of ``gap_ms``.

    Flink's session windows: a bid at ``t`` opens ``[t, t + gap)``; windows of a bidder that
    overlap *or touch* merge (Flink's ``TimeWindow.intersects`` is inclusive), so a bid
    exactly ``gap`` after the last one extends the session. A session is ``[first bid,
    last bid + gap)``. All sessions are returned, also those a final watermark has not
    closed yet.

    With watermarks, bids are taken in arrival order: before each bid, the bidder's
    sessions with ``end - 1 + L <= watermark`` are final (Flink cleared them); the bid then
    merges with the open sessions it touches, or, touching none, opens a session unless
    that session is already late (``t + gap - 1 + L <= watermark``: dropped). A bid that
    touches only a final session opens a new one beside it, as in Flink.

    Returns:
        ``{"bidder", "window_start", "window_end", "bids"}`` sorted by bidder, then start.
    """
    marks_given = watermarks is not None
    if marks_given and len(watermarks) != len(bids):
        raise ValueError(f"{len(watermarks)} watermarks for {len(bids)} bids: one per bid")
    done: list[tuple[int, int, int, int]] = []  # (bidder, start, end, count)
    open_: dict[int, list[list[int]]] = defaultdict(list)  # bidder -> [[start, end, count]]
    for i, bid in enumerate(bids):
        who, t = bid["bidder"], bid["date_time"]
        mark = watermarks[i] if marks_given else None
        sessions = open_[who]
        if mark is not None:
            final = [s for s in sessions if s[1] - 1 + allowed_lateness_ms <= mark]
            done.extend((who, *s) for s in final)
            sessions[:] = [s for s in sessions if s not in final]
        touching = [s for s in sessions if s[0] <= t + gap_ms and s[1] >= t]
        if not touching and mark is not None and t + gap_ms - 1 + allowed_lateness_ms <= mark:
            continue  # late: its session would be closed already
        merged = [
            min([t, *(s[0] for s in touching)]),
            max([t + gap_ms, *(s[1] for s in touching)]),
            1 + sum(s[2] for s in touching),
        ]
        sessions[:] = [s for s in sessions if s not in touching] + [merged]
    done.extend((who, *s) for who, sessions in open_.items() for s in sessions)
    return [
        {"bidder": who, "window_start": s, "window_end": e, "bids": n}
        for who, s, e, n in sorted(done)
    ]
