"""Named state of every kind, TTL, and the stored form (``state.kinds``), with no Spark."""

from __future__ import annotations

import json

import pytest

from microcheckpoint.errors import ConfigError
from microcheckpoint.state.kinds import (
    Aggregator,
    KeyState,
    StateTtl,
    aggregating_state,
    cleanup,
    is_pseudo_key,
    list_state,
    map_state,
    reducing_state,
    value_state,
)

T = 1_700_000_000_000
AVG = Aggregator(lambda: [0, 0], lambda a, v: [a[0] + v, a[1] + 1], lambda a: a[0] / a[1])


def _descs(*descs):
    return {d.name: d for d in descs}


def _roundtrip(state: KeyState, now: int) -> KeyState:
    """What the next epoch sees: the stored object through JSON, read at ``now``."""
    stored = json.loads(json.dumps(state.stored()))
    return KeyState(state.descriptors, stored, now)


def test_every_kind_reads_back_what_was_written_after_a_round_trip() -> None:
    descs = _descs(
        value_state("v", default=0),
        list_state("l"),
        map_state("m"),
        reducing_state("r", reduce=max),
        aggregating_state("a", AVG),
    )
    ks = KeyState(descs, None, T)
    ks.state("v").update(5)
    ks.state("l").add_all(["x", "y"])
    ks.state("l").add("z")
    ks.state("m").put(["k", 1], {"n": 1})
    ks.state("m").put("b", 2)
    for n in (3, 9, 4):
        ks.state("r").add(n)
        ks.state("a").add(n)
    again = _roundtrip(ks, T + 1)
    assert again.state("v").value() == 5
    assert again.state("l").get() == ["x", "y", "z"]
    assert dict((json.dumps(k), v) for k, v in again.state("m").items()) == {
        '["k", 1]': {"n": 1},
        '"b"': 2,
    }
    assert again.state("m").get(["k", 1]) == {"n": 1} and again.state("m").contains("b")
    assert again.state("r").get() == 9
    assert again.state("a").get() == pytest.approx(16 / 3)
    again.state("m").remove("b")
    again.state("l").update([])
    again.state("v").clear()
    third = _roundtrip(again, T + 2)
    assert third.state("v").value() == 0  # the default
    assert third.state("l").get() == []
    assert third.state("m").keys() == [["k", 1]]


def test_a_key_with_nothing_left_stores_none() -> None:
    ks = KeyState(_descs(value_state("v")), {"s": {"v": [1, T]}}, T)
    ks.state("v").clear()
    assert ks.changed and ks.stored() is None


def test_ttl_on_create_and_write_refreshes_and_expires_exactly_at_the_ttl() -> None:
    descs = _descs(value_state("v", ttl=StateTtl(10)))
    ks = KeyState(descs, None, T)
    ks.state("v").update("a")
    ks = _roundtrip(ks, T + 5_000)
    ks.state("v").update("b")  # refreshes: lives until T + 15 s
    assert _roundtrip(ks, T + 14_999).state("v").value() == "b"
    assert _roundtrip(ks, T + 15_000).state("v").value() is None  # invisible at once


def test_ttl_on_create_keeps_the_first_timestamp() -> None:
    descs = _descs(value_state("v", ttl=StateTtl(10, update="on_create")))
    ks = KeyState(descs, None, T)
    ks.state("v").update("a")
    ks = _roundtrip(ks, T + 5_000)
    ks.state("v").update("b")
    assert _roundtrip(ks, T + 9_999).state("v").value() == "b"
    assert _roundtrip(ks, T + 10_000).state("v").value() is None


def test_ttl_expires_list_elements_and_map_entries_one_by_one() -> None:
    descs = _descs(list_state("l", ttl=StateTtl(10)), map_state("m", ttl=StateTtl(10)))
    ks = KeyState(descs, None, T)
    ks.state("l").add(1)
    ks.state("m").put("old", 1)
    ks = _roundtrip(ks, T + 6_000)
    ks.state("l").add(2)
    ks.state("m").put("new", 2)
    later = _roundtrip(ks, T + 12_000)
    assert later.state("l").get() == [2]
    assert later.state("m").keys() == ["new"] and not later.state("m").contains("old")
    # cleanup (what a compaction applies) removes the expired entries from the stored form
    assert cleanup(descs, ks.stored(), T + 12_000) == {
        "s": {"l": [[2, T + 6_000]], "m": {'"new"': [2, T + 6_000]}}
    }
    assert cleanup(descs, ks.stored(), T + 16_000) is None


def test_expired_reducing_state_starts_over() -> None:
    descs = _descs(reducing_state("r", reduce=lambda a, b: a + b, ttl=StateTtl(1)))
    ks = KeyState(descs, None, T)
    ks.state("r").add(5)
    ks = _roundtrip(ks, T + 1_000)
    ks.state("r").add(7)
    assert ks.state("r").get() == 7


def test_record_fields_read_their_defaults_when_missing() -> None:
    descs = _descs(value_state("v", fields={"count": 0, "flag": False}))
    ks = KeyState(descs, {"s": {"v": [{"count": 3}, T]}}, T)
    assert ks.state("v").value() == {"count": 3, "flag": False}


def test_an_undeclared_state_name_is_refused_naming_the_declared_ones() -> None:
    ks = KeyState(_descs(value_state("count")), None, T)
    with pytest.raises(ConfigError) as err:
        ks.state("cuont")
    assert "'cuont'" in str(err.value) and "count" in str(err.value)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: value_state(""), "state name"),
        (lambda: StateTtl(0), "ttl"),
        (lambda: StateTtl(5, update="on_read"), "ttl update"),
        (lambda: reducing_state("r", reduce=None), "reduce of state 'r'"),
        (lambda: value_state("v", type="int"), "type of state 'v'"),
    ],
)
def test_bad_descriptors_are_refused_naming_the_setting(build, named) -> None:
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == named


def test_pseudo_keys_are_never_a_user_keys_canonical_json() -> None:
    assert is_pseudo_key("\u0000timers") and not is_pseudo_key('"\\u0000timers"')
