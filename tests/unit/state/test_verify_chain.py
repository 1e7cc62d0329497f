"""``verify_chain`` (``verify --from --to``) on edge cases a real run rarely makes: a
``_metadata`` written before the lineage, a partition dropped between two checkpoints, and
a claim finished by another coordinator. (tests/integration/test_verify.py runs it through
the console script on a real run, healthy and damaged.)"""

from __future__ import annotations

import json

from microcheckpoint.ids import CheckpointId
from microcheckpoint.state.verify import verify_chain
from tests.unit.conftest import TP0, TP1

C1, C2 = CheckpointId(1), CheckpointId(2)


def rows(h, first: int, last: int) -> dict[str, object]:
    """The chain's rows by check name, without the unit harness's ``state.bin`` files
    (not a state format verify knows: they are the integration test's business)."""
    _, checks = verify_chain(h.store, "pipe", first, last)
    return {c.check: c for c in checks if not c.check.startswith("file://")}


def rewrite(h, cid: CheckpointId, change) -> None:
    key = h.layout.metadata(cid)
    body = json.loads(h.store.get(key).data)
    change(body)
    h.store.put(key, json.dumps(body, indent=1, sort_keys=True).encode())


def test_two_epochs_chain_with_hash_and_contiguous_offsets(h) -> None:
    coord = h.coordinator(retained=3)
    h.epoch(coord, {TP0: 10, TP1: 4})
    h.epoch(coord, {TP0: 15, TP1: 9})
    found = rows(h, 1, 2)
    assert [c.ok for c in found.values()] == [True, True, True]
    link = found["chk-1 -> chk-2"]
    assert not link.warning
    assert link.detail == "sha256 of its _metadata matches; offsets continue on 2 partitions"


def test_a_metadata_from_before_the_lineage_warns_and_is_checked_by_offsets(h) -> None:
    coord = h.coordinator(retained=3)
    h.epoch(coord, {TP0: 10})
    h.epoch(coord, {TP0: 15})
    for cid in (C1, C2):  # as stored by an earlier version: no lineage, the finisher's token
        rewrite(h, cid, lambda b: (b.pop("previous_sha256"), b.update(writer="f" * 32)))
    found = rows(h, 1, 2)
    assert all(c.ok for c in found.values()), found
    assert found["chk-1"].warning and "written before the lineage" in found["chk-1"].detail
    assert found["chk-1 -> chk-2"].warning
    assert "no hash of its _metadata recorded" in found["chk-1 -> chk-2"].detail


def test_a_partition_the_next_checkpoint_drops_breaks_the_link(h) -> None:
    coord = h.coordinator(retained=3)
    h.epoch(coord, {TP0: 10, TP1: 4})
    h.epoch(coord, {TP0: 15, TP1: 9})
    rewrite(h, C2, lambda b: b["barrier"].pop(str(TP1)))
    found = rows(h, 1, 2)
    link = found["chk-1 -> chk-2"]
    assert not link.ok
    assert f"partition {TP1}: checkpoint 1 read it up to 4, checkpoint 2 has no range" in (
        link.detail
    )


def test_claims_finished_in_a_row_record_each_others_hash_and_their_claimers(h) -> None:
    import hashlib

    from tests.unit.protocol.helpers import TASKS, ack_all

    coord = h.coordinator(max_concurrent=2, retained=3)
    coord.trigger(TASKS, {TP0: 10}, h.startup({TP0: 0}))
    coord.trigger(TASKS, {TP0: 15}, h.startup({TP0: 0}))
    for cid in (C1, C2):
        ack_all(h, coord, cid)
        claim = {"outcome": "COMPLETED", "attempt": 1, "at_ms": 1, "writer": f"claimer{cid}"}
        h.store.put_if_absent(h.layout.outcome(cid), json.dumps(claim).encode())
    h.coordinator().finish_completing()  # another process finishes both, in id order
    first = h.store.get(h.layout.metadata(C1)).data
    second = json.loads(h.store.get(h.layout.metadata(C2)).data)
    assert second["base"] == 1  # C2 continued from C1 while C1 was pending
    assert second["previous_sha256"] == hashlib.sha256(first).hexdigest()
    assert (json.loads(first)["writer"], second["writer"]) == ("claimer1", "claimer2")
    found = rows(h, 1, 2)
    assert all(c.ok and not c.warning for c in found.values()), found
