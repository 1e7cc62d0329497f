"""A folder as a source partition: positions in name order, named ranges, a guarded past."""

from __future__ import annotations

import pytest

from microcheckpoint.adapters.file_offsets import FileOffsets, HybridOffsets, data_files
from microcheckpoint.errors import ConfigError, KafkaSourceError
from microcheckpoint.ids import TopicPartition
from microcheckpoint.storage.file import FileStore

TP = TopicPartition("files.src", 0)
K0 = TopicPartition("live", 0)


@pytest.fixture
def folder(tmp_path) -> FileStore:
    store = FileStore(tmp_path.as_uri())
    for name in ("b.parquet", "a.parquet", "_SUCCESS", ".tmp-x", "sub/c.parquet"):
        store.put(name, b"x")
    return store


def test_data_files_skip_markers_and_sort_by_name(folder) -> None:
    assert data_files(folder) == ["a.parquet", "b.parquet", "sub/c.parquet"]


def test_the_folder_is_one_partition_from_zero_to_its_file_count(folder) -> None:
    offsets = FileOffsets(folder, "files.src")
    assert offsets.partitions("files.src") == [TP]
    assert offsets.partitions("other") == []
    assert offsets.beginning_offsets([TP]) == {TP: 0}
    assert offsets.end_offsets([TP]) == {TP: 3}
    folder.put("d.parquet", b"x")
    assert offsets.end_offsets([TP]) == {TP: 4}  # every trigger lists again
    assert offsets.committed_group_offsets("g", [TP]) == {TP: None}
    offsets.commit_group_offsets("g", {TP: 2})  # a folder has no group: nothing to do


def test_ranges_are_named_and_capped(folder) -> None:
    offsets = FileOffsets(folder, "files.src", max_files=2)
    assert offsets.limit_ends({TP: 3}, {TP: 0}) == {TP: 2}
    assert offsets.limit_ends({TP: 3}, {TP: 2}) == {TP: 3}
    offsets.end_offsets([TP])
    assert offsets.files_of(TP, 0, 2, None) == ["a.parquet", "b.parquet"]
    assert offsets.files_of(TP, 2, 3, "b.parquet") == ["sub/c.parquet"]
    assert offsets.files_of(K0, 0, 5, None) is None


def test_a_rewritten_past_is_refused_naming_both_files(folder) -> None:
    offsets = FileOffsets(folder, "files.src")
    folder.put("0-early.parquet", b"x")  # sorts before everything read so far
    offsets.end_offsets([TP])
    with pytest.raises(KafkaSourceError) as caught:
        offsets.files_of(TP, 2, 4, "b.parquet")
    assert "position 1 holds 'a.parquet', not 'b.parquet', the last file read" in str(caught.value)
    assert "Only add files whose names sort after the last one" in str(caught.value)


def test_a_folder_has_no_timestamps_for_data_interval(folder) -> None:
    with pytest.raises(ConfigError, match="files carry no record timestamps"):
        FileOffsets(folder, "files.src").offsets_for_times([TP], 0)


class FakeKafka:
    def __init__(self) -> None:
        self.committed: dict = {}

    def partitions(self, topic):
        return [K0] if topic == "live" else []

    def end_offsets(self, tps):
        return dict.fromkeys(tps, 100)

    def beginning_offsets(self, tps):
        return dict.fromkeys(tps, 0)

    def committed_group_offsets(self, group, tps):
        return dict.fromkeys(tps)

    def commit_group_offsets(self, group, offsets):
        self.committed.update(offsets)


def test_hybrid_holds_kafka_back_until_every_file_is_read(folder) -> None:
    kafka = FakeKafka()
    hybrid = HybridOffsets(FileOffsets(folder, "files.src"), kafka)
    assert hybrid.partitions("files.src") == [TP]
    assert hybrid.partitions("live") == [K0]
    ends = hybrid.end_offsets([TP, K0])
    assert ends == {TP: 3, K0: 100}
    assert hybrid.limit_ends(ends, {TP: 1}) == {TP: 3}  # files remain: Kafka waits
    assert hybrid.limit_ends(ends, {TP: 3}) == {TP: 3, K0: 100}
    hybrid.commit_group_offsets("g", {TP: 3, K0: 40})
    assert kafka.committed == {K0: 40}
