"""``canonical_key`` and ``key_of``: a key's canonical JSON (sorted object keys, no spaces,
non-ASCII kept) and back, as ``json`` gives them, for every JSON value; the state's value
text is ``json.dumps(value, sort_keys=True)``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from microcheckpoint.errors import ConfigError
from microcheckpoint.state.backends import canonical_key, key_of
from microcheckpoint.state.files import rows_from_groups

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.sampled_from(["", '"', "\\", "\u0000", "\n", "å", "日本", "😀", "\ud800", 'a"b'])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(values)
def test_canonical_key_is_json_s_canonical_form_and_key_of_reads_it_back(value) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_key(value) == expected
    assert key_of(expected) == json.loads(expected)


@given(values.filter(lambda v: v is not None))  # None: a deletion, stored as null
def test_the_stored_value_text_is_json_with_sorted_keys(value) -> None:
    table = rows_from_groups({3: {"k": (value, 7)}})
    assert table.column("state").to_pylist() == [json.dumps(value, sort_keys=True)]


def test_a_key_that_is_not_json_names_itself() -> None:
    with pytest.raises(ConfigError, match="key"):
        canonical_key({1, 2})
