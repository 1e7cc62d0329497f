"""The Nexmark ground truths on hand-worked inputs, and the generator's determinism.

Times are offsets from ``B`` (``T0_MS``, a multiple of 10 s), so window boundaries read as
written: the 10 s tumbling windows are ``[0, 10000)``, ``[10000, 20000)``, ...
"""

from __future__ import annotations

import json

import pytest

from examples.nexmark_data import (
    T0_MS,
    NexmarkConfig,
    generate,
    kafka_values,
    late_events,
    max_out_of_orderness,
    read_parquet,
    watermarks_at_arrival,
    write_parquet,
)
from examples.nexmark_truth import (
    q5_hot_items,
    q7_highest_bid,
    q8_new_users,
    q11_user_sessions,
    sliding_starts,
    tumbling_start,
)

B = T0_MS
assert B % 10_000 == 0


def bid(auction: int, at: int, price: int = 1, bidder: int = 0) -> dict[str, int]:
    return {"auction": auction, "bidder": bidder, "price": price, "date_time": B + at}


def hot(start: int, auction: int, num: int) -> dict[str, int]:
    return {
        "window_start": B + start,
        "window_end": B + start + 10_000,
        "auction": auction,
        "num": num,
    }


def marks(*values: int | None) -> list[int | None]:
    return [None if v is None else B + v for v in values]


# -- window alignment -------------------------------------------------------------------------


def test_window_starts_are_aligned_and_half_open() -> None:
    assert tumbling_start(B + 9_999, 10_000) == B
    assert tumbling_start(B + 10_000, 10_000) == B + 10_000
    assert tumbling_start(-1, 10_000) == -10_000
    assert sliding_starts(12_345, 10_000, 2_000) == [12_000, 10_000, 8_000, 6_000, 4_000]
    # 10000 is not in [0, 10000): five windows, the oldest starting at 2000
    assert sliding_starts(10_000, 10_000, 2_000) == [10_000, 8_000, 6_000, 4_000, 2_000]
    # size not a multiple of the slide: 3 windows for ts 4, 2 for ts 5
    assert sliding_starts(4, 5, 2) == [4, 2, 0]
    assert sliding_starts(5, 5, 2) == [4, 2]
    with pytest.raises(ValueError, match=r"window size 10 / slide 0 ms: give both >= 1"):
        sliding_starts(1, 10, 0)


# -- q5 ---------------------------------------------------------------------------------------


def test_q5_hot_items_per_sliding_window_with_ties() -> None:
    bids = [bid(1, 1_000), bid(1, 3_000), bid(2, 3_500), bid(2, 11_000), bid(3, 11_500)]
    # 1000 is in the windows starting -8000..0; 3000 and 3500 in -6000..2000;
    # 11000 and 11500 in 2000..10000.
    assert q5_hot_items(bids) == [
        hot(-8_000, 1, 1),  # only the bid at 1000
        hot(-6_000, 1, 2),  # a1 twice, a2 once
        hot(-4_000, 1, 2),
        hot(-2_000, 1, 2),
        hot(0, 1, 2),
        hot(2_000, 2, 2),  # a1 at 3000, a2 at 3500 and 11000, a3 at 11500
        hot(4_000, 2, 1),  # a2 and a3 once each: a tie, both rows
        hot(4_000, 3, 1),
        hot(6_000, 2, 1),
        hot(6_000, 3, 1),
        hot(8_000, 2, 1),
        hot(8_000, 3, 1),
        hot(10_000, 2, 1),
        hot(10_000, 3, 1),
    ]


def test_q5_a_late_bid_leaves_closed_windows_only() -> None:
    # bid 2 (9500) arrives at watermark 11000: of its windows (ends 10000..18000) only
    # [0, 10000) is closed (10000 - 1 <= 11000), so there a1 is alone, elsewhere a2 counts.
    bids = [bid(1, 1_000), bid(2, 13_000), bid(2, 9_500)]
    full = q5_hot_items(bids)
    late = q5_hot_items(bids, watermarks=marks(None, 11_000, 11_000))
    assert [r for r in full if r["window_start"] == B] == [hot(0, 1, 1), hot(0, 2, 1)]
    assert [r for r in late if r["window_start"] == B] == [hot(0, 1, 1)]
    assert [r for r in late if r["window_start"] != B] == [
        r for r in full if r["window_start"] != B
    ]
    assert hot(8_000, 2, 2) in late  # [8000, 18000) holds 9500 and 13000
    # allowed lateness 1002 keeps [0, 10000) open (9999 + 1002 > 11000), 1001 does not
    wm = marks(None, 11_000, 11_000)
    assert q5_hot_items(bids, watermarks=wm, allowed_lateness_ms=1_001) == late
    assert q5_hot_items(bids, watermarks=wm, allowed_lateness_ms=1_002) == full


# -- q7 ---------------------------------------------------------------------------------------


def test_q7_highest_bid_ties_boundaries_and_duplicates() -> None:
    bids = [
        bid(1, 1_000, price=5, bidder=1),
        bid(2, 9_999, price=9, bidder=2),  # last millisecond of [0, 10000)
        bid(3, 500, price=9, bidder=3),  # ties with it
        bid(4, 10_000, price=3, bidder=1),  # first millisecond of [10000, 20000)
        bid(5, 25_000, price=8, bidder=5),
        bid(5, 25_000, price=8, bidder=5),  # the same bid twice: two rows
    ]

    def row(start: int, auction: int, bidder: int, price: int) -> dict[str, int]:
        return {
            "window_start": B + start,
            "window_end": B + start + 10_000,
            "auction": auction,
            "bidder": bidder,
            "price": price,
        }

    assert q7_highest_bid(bids) == [
        row(0, 2, 2, 9),
        row(0, 3, 3, 9),
        row(10_000, 4, 1, 3),
        row(20_000, 5, 5, 8),
        row(20_000, 5, 5, 8),
    ]


def test_q7_late_bid_dropped_unless_within_allowed_lateness() -> None:
    bids = [bid(1, 1_000, price=5), bid(2, 12_000, price=9), bid(3, 9_000, price=8)]
    wm = watermarks_at_arrival(bids, 2_000)
    assert wm == marks(None, -1_000, 10_000)
    assert late_events(bids, 2_000) == [2]  # 9000 <= 12000 - 2000
    tops = lambda rows: [(r["window_start"] - B, r["auction"]) for r in rows]  # noqa: E731
    # [0, 10000) closed at watermark 10000 (9999 <= 10000): auction 3's 8 is dropped
    assert tops(q7_highest_bid(bids, watermarks=wm)) == [(0, 1), (10_000, 2)]
    assert tops(q7_highest_bid(bids, watermarks=wm, allowed_lateness_ms=1)) == [(0, 1), (10_000, 2)]
    assert tops(q7_highest_bid(bids, watermarks=wm, allowed_lateness_ms=2)) == [(0, 3), (10_000, 2)]
    assert q7_highest_bid(bids, watermarks=wm, allowed_lateness_ms=2) == q7_highest_bid(bids)


# -- q8 ---------------------------------------------------------------------------------------


def test_q8_new_users_join_in_the_same_window_once() -> None:
    persons = [
        {"id": 1, "name": "A", "date_time": B + 1_000},
        {"id": 2, "name": "B", "date_time": B + 9_000},
        {"id": 3, "name": "C", "date_time": B + 12_000},
    ]
    auctions = [
        {"seller": 1, "date_time": B + 5_000},  # twice in p1's window: one row
        {"seller": 1, "date_time": B + 6_000},
        {"seller": 2, "date_time": B + 10_500},  # the window after p2 joined: no row
        {"seller": 3, "date_time": B + 19_999},  # last millisecond of p3's window
        {"seller": 4, "date_time": B + 3_000},  # nobody joined as 4
    ]
    assert q8_new_users(persons, auctions) == [
        {"window_start": B, "window_end": B + 10_000, "person": 1, "name": "A"},
        {"window_start": B + 10_000, "window_end": B + 20_000, "person": 3, "name": "C"},
    ]
    # p1's auctions arrive at watermark 10000: [0, 10000) is closed, p1 has no row
    late = {"auction_watermarks": marks(10_000, 10_000, None, None, None)}
    assert [r["person"] for r in q8_new_users(persons, auctions, **late)] == [3]
    assert [
        r["person"] for r in q8_new_users(persons, auctions, **late, allowed_lateness_ms=1)
    ] == [3]
    assert [
        r["person"] for r in q8_new_users(persons, auctions, **late, allowed_lateness_ms=2)
    ] == [1, 3]


# -- q11 --------------------------------------------------------------------------------------


def session(bidder: int, start: int, end: int, bids: int) -> dict[str, int]:
    return {"bidder": bidder, "window_start": B + start, "window_end": B + end, "bids": bids}


def test_q11_sessions_merge_when_touching_and_when_bridged() -> None:
    bids = [
        bid(0, 0, bidder=1),
        bid(0, 4_000, bidder=1),
        bid(0, 14_000, bidder=1),  # exactly the gap after 4000: [4000, 14000) touches, merges
        bid(0, 24_001, bidder=1),  # 10001 after 14000: a new session
        bid(0, 30_000, bidder=2),
        bid(0, 10_000, bidder=2),  # out of order: apart from [30000, 40000)
        bid(0, 20_000, bidder=2),  # bridges both into one session
    ]
    assert q11_user_sessions(bids) == [
        session(1, 0, 24_000, 3),
        session(1, 24_001, 34_001, 1),
        session(2, 10_000, 40_000, 3),
    ]
    assert q11_user_sessions(bids, gap_ms=9_999) == [
        session(1, 0, 13_999, 2),
        session(1, 14_000, 23_999, 1),
        session(1, 24_001, 34_000, 1),
        session(2, 10_000, 19_999, 1),
        session(2, 20_000, 29_999, 1),
        session(2, 30_000, 39_999, 1),
    ]


def test_q11_late_bids_and_sessions_closed_by_the_watermark() -> None:
    bids = [bid(0, t, bidder=1) for t in (0, 25_000, 5_000, 12_000)]
    wm = marks(None, 20_000, 20_000, 20_000)
    # complete: 0, 5000, 12000 chain into [0, 22000)
    assert q11_user_sessions(bids) == [session(1, 0, 22_000, 3), session(1, 25_000, 35_000, 1)]
    # [0, 10000) is final at 20000; 5000's own session would end 15000: dropped;
    # 12000's would end 22000 > 20000: a new session
    assert q11_user_sessions(bids, watermarks=wm) == [
        session(1, 0, 10_000, 1),
        session(1, 12_000, 22_000, 1),
        session(1, 25_000, 35_000, 1),
    ]
    # lateness 6000: [0, 10000) is still final (9999 + 6000 <= 20000), 5000 is not late
    # (14999 + 6000 > 20000) and opens [5000, 15000) beside it; 12000 joins that one
    assert q11_user_sessions(bids, watermarks=wm, allowed_lateness_ms=6_000) == [
        session(1, 0, 10_000, 1),
        session(1, 5_000, 22_000, 2),
        session(1, 25_000, 35_000, 1),
    ]
    with pytest.raises(ValueError, match=r"^3 watermarks for 4 bids: one per bid$"):
        q11_user_sessions(bids, watermarks=wm[:3])


# -- lateness ---------------------------------------------------------------------------------


def test_late_events_per_event_and_per_epoch() -> None:
    events = [{"date_time": t} for t in (1_000, 5_000, 2_000, 7_000, 2_500)]
    assert watermarks_at_arrival(events, 2_000) == [None, -1_000, 3_000, 3_000, 5_000]
    assert late_events(events, 2_000) == [2, 4]
    assert watermarks_at_arrival(events, 2_000, [2, 3]) == [None, None, 3_000, 3_000, 3_000]
    assert late_events(events, 2_000, [2, 3]) == [2, 4]
    assert late_events(events, 2_000, [3, 2]) == [4]  # 2000 is in the first epoch
    assert late_events([{"date_time": 5_000}, {"date_time": 3_000}], 2_000) == [1]  # ==: late
    assert max_out_of_orderness(events) == 4_500
    with pytest.raises(ValueError, match=r"^epoch_sizes sum to 4 for 5 events: give sizes >= 0"):
        watermarks_at_arrival(events, 2_000, [2, 2])


# -- the generator ----------------------------------------------------------------------------


def test_generator_is_deterministic_and_mixes_like_nexmark() -> None:
    config = NexmarkConfig(bids=920, seed=7, max_delay_ms=300)
    first, again = generate(config), generate(config)
    assert first == again
    assert generate(NexmarkConfig(bids=920, seed=8, max_delay_ms=300)) != first
    # 920 bids = 20 blocks of 50 events: 20 persons, 60 auctions
    assert (len(first.persons), len(first.auctions), len(first.bids)) == (20, 60, 920)
    assert sorted(p["id"] for p in first.persons) == list(range(20))
    assert {b["bidder"] for b in first.bids} <= set(range(20))
    assert {a["seller"] for a in first.auctions} <= set(range(20))
    for kind in ("persons", "auctions", "bids"):
        rows = first.stream(kind)
        assert max_out_of_orderness(rows) < 300
        assert late_events(rows, 300) == []
        assert late_events(rows, 300, [len(rows) // 2, len(rows) - len(rows) // 2]) == []
    assert max_out_of_orderness(first.bids) == 275  # the delays use their range
    in_order = generate(NexmarkConfig(bids=920, seed=7, max_delay_ms=0)).bids
    assert [b["date_time"] for b in in_order] == sorted(b["date_time"] for b in in_order)
    # a delay below 1 ms is no delay: events 0-2 ms apart stay in order
    tight = generate(NexmarkConfig(bids=920, seed=7, gap_ms=1, max_delay_ms=1))
    assert max_out_of_orderness(tight.bids) == 0 and late_events(tight.bids, 1) == []
    with pytest.raises(ValueError, match=r"^NexmarkConfig.bids = 0: give >= 1$"):
        NexmarkConfig(bids=0)
    with pytest.raises(ValueError, match=r"^Nexmark stream 'bid': give one of"):
        first.stream("bid")


def test_no_event_late_within_the_bound_so_truths_are_complete() -> None:
    events = generate(NexmarkConfig(bids=3_000, seed=3, max_delay_ms=2_000))
    wm = {
        k: watermarks_at_arrival(events.stream(k), 2_000) for k in ("persons", "auctions", "bids")
    }
    assert q5_hot_items(events.bids, watermarks=wm["bids"]) == q5_hot_items(events.bids)
    assert q7_highest_bid(events.bids, watermarks=wm["bids"]) == q7_highest_bid(events.bids)
    assert q11_user_sessions(events.bids, watermarks=wm["bids"]) == q11_user_sessions(events.bids)
    assert q8_new_users(
        events.persons,
        events.auctions,
        person_watermarks=wm["persons"],
        auction_watermarks=wm["auctions"],
    ) == q8_new_users(events.persons, events.auctions)
    assert q8_new_users(events.persons, events.auctions) != []
    # a smaller bound makes events late; per epoch fewer (its watermark lags behind)
    per_event = set(late_events(events.bids, 500))
    per_epoch = set(late_events(events.bids, 500, [300] * 10))
    assert per_epoch < per_event and per_epoch


def test_parquet_round_trip_is_exact(tmp_path) -> None:
    events = generate(NexmarkConfig(bids=460, seed=1))
    folders = write_parquet(events, tmp_path, files=3)
    for kind, folder in folders.items():
        assert folder == tmp_path / kind
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
        assert read_parquet(folder) == events.stream(kind)
    import pyarrow.parquet as pq

    sizes = [pq.read_metadata(folders["bids"] / n).num_rows for n in sorted(names)]
    assert sizes == [153, 153, 154]
    assert str(pq.read_schema(folders["auctions"] / names[0]).field("expires").type) == "int64"


def test_kafka_values_are_json_with_event_time_timestamps() -> None:
    rows = [bid(3, 42, price=7, bidder=9)]
    assert kafka_values(rows, key_field="auction") == [
        (b"3", b'{"auction":3,"bidder":9,"date_time":%d,"price":7}' % (B + 42), B + 42)
    ]
    [(key, value, _)] = kafka_values(rows)
    assert key is None and json.loads(value) == rows[0]
