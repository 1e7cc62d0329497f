"""Key group schemes: which one an operator's stored state uses, as its acks name it.

The scheme decides a key's group and a group's owner (``state.keygroups`` has both); an
operator keeps the scheme it started with, so stored state is never re-grouped. A keyed
subtask's ack names it in ``operator_state`` under ``SCHEME_FIELD``; an ack without it is
``BLAKE2B``, the only scheme before 2026-11.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from microcheckpoint.errors import InvalidValue

__all__ = ["BLAKE2B", "SCHEMES", "SCHEME_FIELD", "SPARK_HASH", "check_scheme", "scheme_of"]

BLAKE2B = "blake2b"
SPARK_HASH = "spark-murmur3"
SCHEMES = (BLAKE2B, SPARK_HASH)
SCHEME_FIELD = "key_groups"


def check_scheme(scheme: str) -> None:
    """Raise ``InvalidValue`` for a scheme this version does not know."""
    if scheme not in SCHEMES:
        raise InvalidValue(
            f"key group scheme {scheme!r} is unknown to this version: one of {list(SCHEMES)}; "
            "upgrade microcheckpoint to restore this state"
        )


def scheme_of(operator_states: Iterable[Mapping[str, Any]]) -> str:
    """The scheme that one operator's acks (their ``operator_state``) name.

    Raises:
        InvalidValue: the acks name different schemes, or one this version does not know.
    """
    found = {state.get(SCHEME_FIELD, BLAKE2B) for state in operator_states}
    if len(found) > 1:
        raise InvalidValue(f"an operator's acks name different key group schemes: {sorted(found)}")
    scheme = found.pop() if found else BLAKE2B
    check_scheme(scheme)
    return scheme
