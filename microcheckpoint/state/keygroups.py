"""Key groups: how keyed state is split so it can be restored with another parallelism.

A key belongs to one of ``max_parallelism`` key groups, by a stable hash of its serialized
bytes (the same in every process and Python version, unlike ``hash()``). Subtask ``i`` of
``parallelism`` owns a contiguous range of key groups; rescaling reassigns whole ranges, so
state never has to be re-hashed (Flink's scheme).

Two schemes decide a key's group and a group's owner; an operator keeps the one it started
with (its acks name it: ``protocol.schemes``), so stored state is never re-grouped:

- ``BLAKE2B`` (every operator until 2026-11, every process function): the blake2b hash of
  the key's canonical JSON, computed in Python; subtask ``i`` owns a contiguous range.
- ``SPARK_HASH`` (a new built-in aggregation): ``pmod(hash(key), max_parallelism)``, Spark
  SQL's Murmur3 hash (seed 42), computed in the JVM; subtask ``i`` owns the groups ``g`` with
  ``g % parallelism == i``. When ``parallelism`` divides ``max_parallelism``, a key's subtask
  is ``pmod(hash(key), parallelism)``: the partition Spark's own aggregation shuffle sends it
  to, so the aggregated rows need no second shuffle (``engine/runner.py``).
"""

from __future__ import annotations

import hashlib

from microcheckpoint.errors import ConfigError, InvalidValue
from microcheckpoint.protocol.schemes import (
    BLAKE2B,
    SCHEME_FIELD,
    SCHEMES,
    SPARK_HASH,
    check_scheme,
    scheme_of,
)

__all__ = [
    "BLAKE2B",
    "SCHEMES",
    "SCHEME_FIELD",
    "SPARK_HASH",
    "key_group_for",
    "key_group_range",
    "owned_key_groups",
    "owner_of",
    "scheme_of",
    "spark_hash",
    "spark_key_group",
    "subtask_for_key_group",
]


def key_group_for(key: bytes, max_parallelism: int) -> int:
    """The key group of a serialized key, in ``[0, max_parallelism)``."""
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % max_parallelism


def _check(max_parallelism: int, parallelism: int, what: str, index: int, bound: int) -> None:
    """Refuse a parallelism out of range, then an index (``what``) outside ``[0, bound)``."""
    if not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            "parallelism",
            parallelism,
            f"an integer from 1 to max_parallelism ({max_parallelism}); raise max_parallelism "
            "only for a new pipeline, since it fixes the key groups of stored state",
        )
    if not 0 <= index < bound:
        raise InvalidValue(f"{what} {index} is outside [0, {bound})")


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> range:
    """The key groups subtask ``subtask`` of ``parallelism`` owns (contiguous, maybe empty)."""
    _check(max_parallelism, parallelism, "subtask", subtask, parallelism)
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask of ``parallelism`` that owns ``key_group``."""
    _check(max_parallelism, parallelism, "key group", key_group, max_parallelism)
    return key_group * parallelism // max_parallelism


def owned_key_groups(
    max_parallelism: int, parallelism: int, subtask: int, scheme: str = BLAKE2B
) -> range:
    """The key groups subtask ``subtask`` of ``parallelism`` owns under ``scheme``."""
    check_scheme(scheme)
    if scheme == BLAKE2B:
        return key_group_range(max_parallelism, parallelism, subtask)
    _check(max_parallelism, parallelism, "subtask", subtask, parallelism)
    return range(subtask, max_parallelism, parallelism)


def owner_of(max_parallelism: int, parallelism: int, key_group: int, scheme: str = BLAKE2B) -> int:
    """The subtask of ``parallelism`` that owns ``key_group`` under ``scheme``."""
    check_scheme(scheme)
    if scheme == BLAKE2B:
        return subtask_for_key_group(max_parallelism, parallelism, key_group)
    _check(max_parallelism, parallelism, "key group", key_group, max_parallelism)
    return key_group % parallelism


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 = ((h1 ^ (h1 >> 16)) * 0x85EBCA6B) & _M32
    h1 = ((h1 ^ (h1 >> 13)) * 0xC2B2AE35) & _M32
    return h1 ^ (h1 >> 16)


def spark_hash(value: str | bytes | int, kind: str = "string", seed: int = 42) -> int:
    """Spark SQL's ``hash(value)`` (Murmur3 x86 32-bit, Spark's variant), as a signed int.

    ``kind``: ``"string"`` (UTF-8 bytes; Spark mixes each byte past the last 4-byte word
    on its own, unlike the reference Murmur3), ``"int"`` or ``"long"`` (an integer column's
    type: the same number hashes differently as an int and as a long).
    """
    h1 = seed & _M32
    if kind in ("int", "long"):
        number = int(value) & (_M32 if kind == "int" else 0xFFFFFFFFFFFFFFFF)
        words = [number & _M32] if kind == "int" else [number & _M32, number >> 32]
        for word in words:
            h1 = _mix_h1(h1, _mix_k1(word))
        h1 = _fmix(h1, 4 * len(words))
    else:
        data = value.encode() if isinstance(value, str) else bytes(value)
        aligned = len(data) - len(data) % 4
        for i in range(0, aligned, 4):
            h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
        for byte in data[aligned:]:
            h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte > 127 else byte) & _M32))
        h1 = _fmix(h1, len(data))
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_key_group(value: str | int, max_parallelism: int, kind: str = "string") -> int:
    """The ``SPARK_HASH`` key group of a key: ``pmod(hash(key), max_parallelism)``."""
    return spark_hash(value, kind) % max_parallelism
