"""Key groups: how keyed state is split so it can be restored with another parallelism.

A key belongs to one of ``max_parallelism`` key groups, by a stable hash of its serialized
bytes (the same in every process and Python version, unlike ``hash()``). Subtask ``i`` of
``parallelism`` owns a contiguous range of key groups; rescaling reassigns whole ranges, so
state never has to be re-hashed (Flink's scheme).
"""

from __future__ import annotations

import hashlib

from microcheckpoint.errors import ConfigError, InvalidValue

__all__ = ["key_group_for", "key_group_range", "subtask_for_key_group"]


def key_group_for(key: bytes, max_parallelism: int) -> int:
    """The key group of a serialized key, in ``[0, max_parallelism)``."""
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % max_parallelism


def _check(max_parallelism: int, parallelism: int) -> None:
    if not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            "parallelism",
            parallelism,
            f"an integer from 1 to max_parallelism ({max_parallelism}); raise max_parallelism "
            "only for a new pipeline, since it fixes the key groups of stored state",
        )


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> range:
    """The key groups subtask ``subtask`` of ``parallelism`` owns (contiguous, maybe empty)."""
    _check(max_parallelism, parallelism)
    if not 0 <= subtask < parallelism:
        raise InvalidValue(f"subtask {subtask} is outside [0, {parallelism})")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask of ``parallelism`` that owns ``key_group``."""
    _check(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise InvalidValue(f"key group {key_group} is outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism
