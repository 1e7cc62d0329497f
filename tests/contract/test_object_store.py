"""One contract for the object-store port, run against the file store and the S3 server.

The S3 variant talks HTTP to a real SeaweedFS (or the S3 named by
MICROCHECKPOINT_S3_ENDPOINT); nothing here is mocked.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from microcheckpoint.storage.file import FileStore
from microcheckpoint.storage.port import ObjectStore, WriteOutcome, swap, write_once


class UnknownOnce(ObjectStore):
    """Wraps a store: the first conditional write returns UNKNOWN, after it landed or not."""

    def __init__(self, inner: ObjectStore, landed: bool) -> None:
        self.inner, self.landed, self.url, self.calls = inner, landed, inner.url, 0

    def get(self, key):
        return self.inner.get(key)

    def put(self, key, data):
        self.inner.put(key, data)

    def _once(self, write):
        self.calls += 1
        if self.calls == 1:
            if self.landed:
                write()
            return WriteOutcome.UNKNOWN
        return write()

    def put_if_absent(self, key, data):
        return self._once(lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key, data, etag):
        return self._once(lambda: self.inner.put_if_match(key, data, etag))

    def delete(self, key):
        self.inner.delete(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)


class ObjectStoreContract:
    """Every implementation of ``ObjectStore`` must pass these."""

    @pytest.fixture
    def store(self) -> Iterator[ObjectStore]:
        raise NotImplementedError

    def test_get_missing_is_none(self, store):
        assert store.get("a/missing") is None
        assert not store.exists("a/missing")

    def test_put_get_roundtrip_and_overwrite(self, store):
        store.put("a/b/c.bin", b"\x00\x01data")
        first = store.get("a/b/c.bin")
        assert first is not None and first.data == b"\x00\x01data" and first.key == "a/b/c.bin"
        store.put("a/b/c.bin", b"other")
        second = store.get("a/b/c.bin")
        assert second.data == b"other" and second.etag != first.etag

    def test_put_if_absent_once(self, store):
        assert store.put_if_absent("k", b"one") is WriteOutcome.OK
        assert store.put_if_absent("k", b"two") is WriteOutcome.CONFLICT
        assert store.get("k").data == b"one"

    def test_put_if_absent_cannot_be_won_twice_concurrently(self, store):
        results: list[WriteOutcome] = []
        lock = threading.Lock()
        barrier = threading.Barrier(8)

        def race(i: int) -> None:
            barrier.wait()
            outcome = store.put_if_absent("race/_metadata", f"writer-{i}".encode())
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(WriteOutcome.OK) == 1
        assert results.count(WriteOutcome.CONFLICT) == 7
        winner = store.get("race/_metadata").data
        assert winner in {f"writer-{i}".encode() for i in range(8)}

    def test_compare_and_swap(self, store):
        store.put("ptr", b"1")
        etag = store.get("ptr").etag
        assert store.put_if_match("ptr", b"2", etag) is WriteOutcome.OK
        assert store.put_if_match("ptr", b"3", etag) is WriteOutcome.CONFLICT  # stale etag
        assert store.get("ptr").data == b"2"
        assert store.put_if_match("absent", b"x", etag) is WriteOutcome.CONFLICT
        assert store.get("absent") is None

    def test_compare_and_swap_race_has_one_winner(self, store):
        store.put("counter", b"0")
        etag = store.get("counter").etag
        results: list[WriteOutcome] = []
        barrier = threading.Barrier(6)

        def race(i: int) -> None:
            barrier.wait()
            results.append(store.put_if_match("counter", f"{i + 1}".encode(), etag))

        threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(WriteOutcome.OK) == 1
        assert results.count(WriteOutcome.CONFLICT) == 5

    def test_delete_is_idempotent(self, store):
        store.put("d/x", b"1")
        store.delete("d/x")
        store.delete("d/x")
        assert store.get("d/x") is None
        assert list(store.list("d/")) == []

    def test_delete_all_removes_every_key_and_skips_missing_ones(self, store):
        keys = [f"m/chk-{i}/f" for i in range(5)]
        for key in [*keys, "m/kept"]:
            store.put(key, b"1")
        store.delete_all([*keys, "m/never-written"])
        assert list(store.list("m/")) == ["m/kept"]
        store.delete_all(keys)  # again: nothing left to delete is no error
        store.delete_all([])
        assert list(store.list("m/")) == ["m/kept"]

    def test_list_is_sorted_prefix_filtered_and_consistent(self, store):
        keys = [f"p/chk-{i:03d}/f{j}" for i in range(9) for j in range(3)] + ["q/z", "pz"]
        for key in keys:
            store.put(key, b"v")
        listed = list(store.list("p/"))
        assert listed == sorted(k for k in keys if k.startswith("p/"))
        assert list(store.list("p/chk-00")) == sorted(k for k in keys if k.startswith("p/chk-00"))
        assert list(store.list("p")) == sorted(k for k in keys if k.startswith("p"))
        store.delete("p/chk-000/f0")
        assert "p/chk-000/f0" not in list(store.list("p/"))
        assert len(list(store.list(""))) == len(keys) - 1

    @pytest.mark.parametrize("landed", [True, False])
    def test_unknown_outcome_resolved_by_reading(self, store, landed):
        wrapped = UnknownOnce(store, landed)
        assert write_once(wrapped, "u/_metadata", b"mine") is WriteOutcome.OK
        assert store.get("u/_metadata").data == b"mine"
        assert wrapped.calls == (1 if landed else 2)  # no blind retry when it had landed

    def test_unknown_outcome_when_another_writer_won(self, store):
        store.put_if_absent("w/_metadata", b"theirs")
        assert (
            write_once(UnknownOnce(store, False), "w/_metadata", b"mine") is WriteOutcome.CONFLICT
        )
        assert store.get("w/_metadata").data == b"theirs"

    @pytest.mark.parametrize("landed", [True, False])
    def test_unknown_swap_resolved_by_reading(self, store, landed):
        store.put("s", b"old")
        etag = store.get("s").etag
        wrapped = UnknownOnce(store, landed)
        assert swap(wrapped, "s", b"new", etag) is WriteOutcome.OK
        assert store.get("s").data == b"new"
        assert wrapped.calls == (1 if landed else 2)


class TestFileStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path) -> Iterator[ObjectStore]:
        yield FileStore(f"file://{tmp_path}/root")

    def test_internal_files_are_not_listed(self, store):
        store.put("a", b"1")
        store.put("b", b"2")
        store.put_if_match("a", b"3", store.get("a").etag)  # creates the lock file
        assert list(store.list("")) == ["a", "b"]

    def test_keys_cannot_escape_the_root(self, store):
        from microcheckpoint.errors import StorageError

        for bad in ("../x", "/abs", "a//b", "a/./b"):
            with pytest.raises(StorageError, match="invalid object key"):
                store.put(bad, b"x")


@pytest.mark.integration
class TestS3Store(ObjectStoreContract):
    @pytest.fixture
    def store(self, s3_client, s3_bucket) -> Iterator[ObjectStore]:
        from microcheckpoint.adapters.s3 import S3Store

        yield S3Store(s3_client, s3_bucket, f"root-{uuid.uuid4().hex[:6]}", page_size=7)

    def test_listing_paginates(self, store):
        keys = [f"many/{i:04d}" for i in range(30)]
        for key in keys:
            store.put(key, b"")
        assert list(store.list("many/")) == keys  # 30 keys over pages of 7

    def test_the_adapter_s_clients_leave_timestamps_as_text(self, store):
        """botocore would parse every listed key's LastModified (most of a listing's
        parse); the adapter reads none, so its clients keep the text S3 sent."""
        store.put("when/x", b"")
        page = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
        stamp = page["Contents"][0]["LastModified"]
        assert isinstance(stamp, str) and stamp[:2] == "20"
        assert list(store.list("when/")) == ["when/x"]

    def test_delete_all_sends_one_request_per_batch(self, store, monkeypatch):
        import microcheckpoint.adapters.s3 as s3

        monkeypatch.setattr(s3, "_DELETE_BATCH", 3)
        keys = [f"b/{i:02d}" for i in range(7)]
        for key in keys:
            store.put(key, b"")
        sent: list[int] = []

        def count(params, **_kw):
            sent.append(len(params["Delete"]["Objects"]))

        events = store.client.meta.events
        events.register("provide-client-params.s3.DeleteObjects", count)
        try:
            store.delete_all(keys)
        finally:
            events.unregister("provide-client-params.s3.DeleteObjects", count)
        assert sorted(sent) == [1, 3, 3]
        assert list(store.list("b/")) == []

    def test_a_key_delete_objects_refuses_is_named(self, store):
        """An error S3 returns for one key of a DeleteObjects request is raised, naming it."""
        from microcheckpoint.errors import StorageError

        def refuse(parsed, **_kw):
            parsed["Errors"] = [
                {"Key": store._key("e/1"), "Code": "AccessDenied", "Message": "Access Denied"}
            ]

        store.put("e/1", b"")
        store.put("e/2", b"")
        events = store.client.meta.events
        events.register("after-call.s3.DeleteObjects", refuse)
        try:
            with pytest.raises(StorageError, match=r"deleting .*/e/1 failed: AccessDenied"):
                store.delete_all(["e/1", "e/2"])
        finally:
            events.unregister("after-call.s3.DeleteObjects", refuse)

    def test_missing_bucket_names_bucket_and_fix(self, s3_client):
        from microcheckpoint.adapters.s3 import S3Store
        from microcheckpoint.errors import StorageError

        store = S3Store(s3_client, "no-such-bucket-here")
        with pytest.raises(StorageError, match=r"no-such-bucket-here.*create it"):
            store.put("k", b"v")

    def test_unreachable_endpoint_is_a_clear_error(self):
        from harness import services
        from microcheckpoint.adapters.s3 import S3Store, make_client
        from microcheckpoint.errors import StorageError

        port = services.free_port()
        client = make_client(f"http://127.0.0.1:{port}", "us-east-1", "k", "s")
        store = S3Store(client, "bucket")
        with pytest.raises(StorageError, match=f"127.0.0.1:{port}.*unreachable"):
            store.get("k")

    def test_throttling_and_5xx_are_retried(self, store):
        """503 SlowDown on the first sends of a GET and of a conditional PUT: retried, then OK."""
        from botocore.awsrequest import AWSResponse

        failures = {"left": 2}

        class Raw:
            def stream(self, **_kw):
                yield b""

        def inject(request, **_kw):
            if failures["left"] > 0:
                failures["left"] -= 1
                body = b"<Error><Code>SlowDown</Code><Message>slow</Message></Error>"
                response = AWSResponse(request.url, 503, {}, Raw())
                response._content = body
                return response
            return None

        store.put("t/x", b"v")
        events = store.client.meta.events
        events.register_first("before-send.s3.*", inject)
        try:
            assert store.get("t/x").data == b"v"
            assert failures["left"] == 0
            failures["left"] = 2
            assert store.put_if_absent("t/y", b"w") is WriteOutcome.OK
            assert failures["left"] == 0
        finally:
            events.unregister("before-send.s3.*", inject)
        assert store.get("t/y").data == b"w"

    def test_500_on_conditional_write_is_unknown_and_resolved(self, store):
        """A 500 may or may not have landed: the adapter says UNKNOWN, write_once reads back."""
        from botocore.awsrequest import AWSResponse

        state = {"fail": True}

        class Raw:
            def stream(self, **_kw):
                yield b""

        def inject(request, **_kw):
            if state["fail"] and request.method == "PUT":
                state["fail"] = False
                response = AWSResponse(request.url, 500, {}, Raw())
                response._content = b"<Error><Code>InternalError</Code></Error>"
                return response
            return None

        events = store.client.meta.events
        events.register_first("before-send.s3.*", inject)
        try:
            assert store.put_if_absent("i/_metadata", b"a") is WriteOutcome.UNKNOWN
            assert write_once(store, "i/_metadata", b"a") is WriteOutcome.OK
        finally:
            events.unregister("before-send.s3.*", inject)
        assert store.get("i/_metadata").data == b"a"
