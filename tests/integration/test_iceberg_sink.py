"""IcebergSink stories: each epoch lands exactly once, whatever is re-committed or crashes.

Tables live in a SQLite ``SqlCatalog`` under ``tmp_path`` (warehouse on the local file system,
or on the session's SeaweedFS). Every assertion is on the exact table contents.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException

from microcheckpoint.errors import ConfigError
from microcheckpoint.sinks.base import EpochInfo
from microcheckpoint.sinks.iceberg import (
    EPOCH_KEY,
    IcebergCommit,
    IcebergSink,
    s3_catalog_properties,
)

pytestmark = pytest.mark.integration

PIPELINE = "orders"
UID = "ice-out"
SCHEMA = {"k": "string", "seq": "long", "amount": "double", "ok": "boolean"}


def epoch(n: int) -> EpochInfo:
    return EpochInfo(PIPELINE, UID, n)


def rows_of(n: int, part: int, count: int = 3) -> list[dict[str, Any]]:
    """Rows of epoch ``n``, subtask ``part``: unique ``(k, seq)`` per epoch and part."""
    return [
        {"k": f"p{part}-k{i}", "seq": n * 100 + i, "amount": n + i / 10, "ok": i % 2 == 0}
        for i in range(count)
    ]


def parts_of(n: int) -> list[list[dict[str, Any]]]:
    return [rows_of(n, 0), rows_of(n, 1)]


def key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["k"], row["seq"])


def local_sink(tmp_path: Path, **kwargs: Any) -> IcebergSink:
    sink = IcebergSink(UID, "sales.orders", SCHEMA, catalog_path=tmp_path / "catalog", **kwargs)
    sink.open()
    return sink


def snapshot_count(sink: IcebergSink) -> int:
    return len(sink.load_table().snapshots())


def test_append_epochs_commit_exactly_once_despite_recovery_and_zombie(tmp_path: Path) -> None:
    sink = local_sink(tmp_path)
    sink.open()  # idempotent
    assert sink.committed_epoch(PIPELINE) is None

    for n in (1, 2, 3):
        assert sink.commit(epoch(n), parts_of(n)) is IcebergCommit.COMMITTED
    expected = sorted((r for n in (1, 2, 3) for p in parts_of(n) for r in p), key=key)
    assert sorted(sink.read_table(), key=key) == expected
    snapshots = snapshot_count(sink)
    assert snapshots == 3
    summaries = [s.summary.additional_properties for s in sink.load_table().snapshots()]
    assert [s[EPOCH_KEY] for s in summaries] == ["1", "2", "3"]

    # Recovery re-commits epoch 3, a zombie notifier commits epoch 1 again: nothing changes.
    assert sink.commit(epoch(3), parts_of(3)) is IcebergCommit.DUPLICATE
    assert sink.commit(epoch(2), parts_of(2)) is IcebergCommit.SUBSUMED
    assert sink.commit(epoch(1), parts_of(1)) is IcebergCommit.SUBSUMED
    assert sorted(sink.read_table(), key=key) == expected
    assert snapshot_count(sink) == snapshots
    assert sink.committed_epoch(PIPELINE) == 3
    assert sink.committed_epoch("other-pipeline") is None

    # An empty epoch still advances the committed epoch (an empty snapshot).
    assert sink.commit(epoch(4), [[], []]) is IcebergCommit.COMMITTED
    assert sink.committed_epoch(PIPELINE) == 4
    assert len(sink.read_table()) == len(expected)


def test_crash_inside_commit_leaves_table_unchanged_and_retry_lands_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = local_sink(tmp_path)
    sink.commit(epoch(1), parts_of(1))
    before = sorted(sink.read_table(), key=key)

    # The driver dies inside the catalog commit, after the data files were written.
    original = sink.catalog.commit_table
    calls = Counter[str]()

    def crash_once(*args: Any, **kwargs: Any) -> Any:
        calls["commit"] += 1
        if calls["commit"] == 1:
            raise RuntimeError("driver killed inside the commit")
        return original(*args, **kwargs)

    monkeypatch.setattr(sink.catalog, "commit_table", crash_once)
    with pytest.raises(RuntimeError, match="driver killed"):
        sink.commit(epoch(2), parts_of(2))
    assert sorted(sink.read_table(), key=key) == before
    assert snapshot_count(sink) == 1
    assert sink.committed_epoch(PIPELINE) == 1

    # Recovery commits epoch 2 again: it lands once; a further re-commit is a no-op.
    assert sink.commit(epoch(2), parts_of(2)) is IcebergCommit.COMMITTED
    assert sink.commit(epoch(2), parts_of(2)) is IcebergCommit.DUPLICATE
    expected = sorted((r for n in (1, 2) for p in parts_of(n) for r in p), key=key)
    assert sorted(sink.read_table(), key=key) == expected
    assert snapshot_count(sink) == 2
    assert sink.committed_epoch(PIPELINE) == 2


def test_concurrent_zombie_commit_of_same_epoch_is_detected_on_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = local_sink(tmp_path)
    zombie = IcebergSink(UID, "sales.orders", SCHEMA, catalog_path=tmp_path / "catalog")

    # Between our epoch check and our catalog commit, a zombie commits the same epoch.
    original = sink.catalog.commit_table
    calls = Counter[str]()

    def zombie_first(*args: Any, **kwargs: Any) -> Any:
        calls["commit"] += 1
        if calls["commit"] == 1:
            assert zombie.commit(epoch(1), parts_of(1)) is IcebergCommit.COMMITTED
        return original(*args, **kwargs)

    monkeypatch.setattr(sink.catalog, "commit_table", zombie_first)
    # The first commit conflicts (CommitFailedException), the re-check finds epoch 1.
    assert sink.commit(epoch(1), parts_of(1)) is IcebergCommit.DUPLICATE
    assert calls["commit"] == 1
    expected = sorted((r for p in parts_of(1) for r in p), key=key)
    assert sorted(sink.read_table(), key=key) == expected
    assert snapshot_count(sink) == 1


def test_conflicts_on_every_attempt_raise_commit_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from microcheckpoint.errors import CommitConflict

    sink = local_sink(tmp_path, max_commit_attempts=2)

    def always_conflict(*args: Any, **kwargs: Any) -> Any:
        raise CommitFailedException("someone else won")

    monkeypatch.setattr(sink.catalog, "commit_table", always_conflict)
    with pytest.raises(CommitConflict, match=r"sales\.orders.*catalog 'microcheckpoint'"):
        sink.commit(epoch(1), parts_of(1))
    monkeypatch.undo()
    assert sink.read_table() == []


def test_upsert_keeps_latest_value_per_key(tmp_path: Path) -> None:
    sink = IcebergSink(
        UID,
        "sales.balances",
        {"k": "string", "region": "string", "v": "long"},
        mode="upsert",
        key_columns=("k", "region"),
        catalog_path=tmp_path / "catalog",
    )
    sink.open()
    epoch1 = [
        [{"k": "a", "region": "eu", "v": 1}, {"k": "b", "region": "eu", "v": 1}],
        [{"k": "a", "region": "us", "v": 1}, {"k": "c", "region": "eu", "v": 1}],
    ]
    assert sink.commit(epoch(1), epoch1) is IcebergCommit.COMMITTED
    epoch2 = [
        # Within an epoch the last row of a key wins: parts in order, rows in order.
        [{"k": "a", "region": "eu", "v": 2}, {"k": "b", "region": "eu", "v": 2}],
        [{"k": "a", "region": "eu", "v": 3}, {"k": "d", "region": "us", "v": 2}],
    ]
    assert sink.commit(epoch(2), epoch2) is IcebergCommit.COMMITTED
    expected = {("a", "eu", 3), ("b", "eu", 2), ("a", "us", 1), ("c", "eu", 1), ("d", "us", 2)}

    def contents() -> list[tuple[str, str, int]]:
        return [(r["k"], r["region"], r["v"]) for r in sink.read_table()]

    assert len(contents()) == len(expected)
    assert set(contents()) == expected

    snapshots = snapshot_count(sink)
    assert sink.commit(epoch(2), epoch2) is IcebergCommit.DUPLICATE
    assert sink.commit(epoch(1), [[{"k": "a", "region": "eu", "v": 1}]]) is IcebergCommit.SUBSUMED
    assert snapshot_count(sink) == snapshots
    assert set(contents()) == expected and len(contents()) == len(expected)
    assert sink.committed_epoch(PIPELINE) == 2

    assert sink.commit(epoch(3), [[{"k": "c", "region": "eu", "v": 9}]]) is IcebergCommit.COMMITTED
    assert sorted(contents()) == sorted((expected - {("c", "eu", 1)}) | {("c", "eu", 9)})


def test_append_on_s3_server(tmp_path: Path, s3_endpoint, s3_client, s3_bucket: str) -> None:
    props = s3_catalog_properties(
        s3_endpoint.url, s3_endpoint.region, s3_endpoint.access_key, s3_endpoint.secret_key
    )
    sink = IcebergSink(
        UID,
        "sales.orders",
        SCHEMA,
        catalog=props,
        catalog_path=tmp_path / "catalog",
        warehouse=f"s3://{s3_bucket}/wh",
    )
    sink.open()
    for n in (1, 2):
        assert sink.commit(epoch(n), parts_of(n)) is IcebergCommit.COMMITTED
    assert sink.commit(epoch(2), parts_of(2)) is IcebergCommit.DUPLICATE
    assert sink.commit(epoch(1), parts_of(1)) is IcebergCommit.SUBSUMED

    expected = sorted((r for n in (1, 2) for p in parts_of(n) for r in p), key=key)
    assert sorted(sink.read_table(), key=key) == expected
    assert snapshot_count(sink) == 2
    assert sink.committed_epoch(PIPELINE) == 2
    listed = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="wh/")
    keys = [obj["Key"] for obj in listed.get("Contents", [])]
    assert sum(k.endswith(".parquet") for k in keys) == 2
    assert any(k.endswith(".metadata.json") for k in keys)


def test_at_least_once_replay_duplicates_only_the_replayed_epoch(tmp_path: Path) -> None:
    sink = local_sink(tmp_path)
    sink.write_at_least_once(epoch(1), 0, rows_of(1, 0))
    sink.write_at_least_once(epoch(1), 1, rows_of(1, 1))
    sink.write_at_least_once(epoch(2), 0, rows_of(2, 0))
    # The epoch fails before its checkpoint completes and is replayed from its start offsets.
    sink.write_at_least_once(epoch(2), 0, rows_of(2, 0))
    sink.write_at_least_once(epoch(2), 1, rows_of(2, 1))
    sink.write_at_least_once(epoch(2), 2, [])  # an empty part writes nothing

    got = Counter(key(r) for r in sink.read_table())
    want = Counter(
        key(r) for r in rows_of(1, 0) + rows_of(1, 1) + rows_of(2, 0) * 2 + rows_of(2, 1)
    )
    assert got == want
    assert {k for k, c in got.items() if c > 1} == {key(r) for r in rows_of(2, 0)}
    assert snapshot_count(sink) == 5
    # At-least-once snapshots never count as exactly-once commits.
    assert sink.committed_epoch(PIPELINE) is None


def test_pickled_sink_commits_after_use(tmp_path: Path) -> None:
    sink = local_sink(tmp_path)
    assert sink.commit(epoch(1), parts_of(1)) is IcebergCommit.COMMITTED

    copy = pickle.loads(pickle.dumps(sink))
    assert copy._catalog is None  # the catalog is created again where the copy runs
    assert copy.commit(epoch(1), parts_of(1)) is IcebergCommit.DUPLICATE
    assert copy.commit(epoch(2), parts_of(2)) is IcebergCommit.COMMITTED
    assert sink.committed_epoch(PIPELINE) == 2
    expected = sorted((r for n in (1, 2) for p in parts_of(n) for r in p), key=key)
    assert sorted(sink.read_table(), key=key) == expected


def test_errors_name_table_catalog_and_fix(tmp_path: Path) -> None:
    local_sink(tmp_path)
    other = IcebergSink(UID, "sales.orders", {"k": "long"}, catalog_path=tmp_path / "catalog")
    with pytest.raises(
        ConfigError, match=r"table 'sales\.orders' in catalog 'microcheckpoint'.*pass"
    ):
        other.open()

    sink = local_sink(tmp_path)
    with pytest.raises(ConfigError, match=r"'sales\.orders'.*add them to the schema"):
        sink.commit(epoch(1), [[{"k": "a", "nope": 1}]])
    with pytest.raises(ConfigError, match=r"sales\.orders"):
        sink.commit(epoch(1), [[{"k": "a", "seq": "not a number"}]])
    with pytest.raises(ConfigError, match="key_columns"):
        IcebergSink(UID, "sales.x", SCHEMA, mode="upsert", catalog_path=tmp_path)
    with pytest.raises(ConfigError, match=r"namespace\.name"):
        IcebergSink(UID, "orders", SCHEMA, catalog_path=tmp_path)
    assert sink.read_table() == []
