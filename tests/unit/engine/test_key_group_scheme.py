"""``runner.key_group_scheme``: an operator keeps its stored state's scheme; a new one takes
Spark's hash unless it is a function whose key Spark cannot hash (a map, a variant)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    VariantType,
)

from microcheckpoint.engine import KeyedOperator, running_sum
from microcheckpoint.engine.runner import key_group_scheme
from microcheckpoint.state.keygroups import BLAKE2B, SPARK_HASH

FN = KeyedOperator("fn", "k", lambda key, rows, state: ([], state), "k string")
AGG = running_sum("agg", key="k")
MAP = MapType(StringType(), IntegerType())


def _plan(**stored: str) -> SimpleNamespace:
    return SimpleNamespace(key_groups=stored)


@pytest.mark.parametrize(
    "key_type",
    [None, StringType(), IntegerType(), DoubleType(), ArrayType(StringType())],
)
def test_a_new_operator_takes_spark_s_hash(key_type) -> None:
    assert key_group_scheme(_plan(), FN, key_type) == SPARK_HASH
    assert key_group_scheme(_plan(), AGG, key_type) == SPARK_HASH


@pytest.mark.parametrize(
    "key_type",
    [
        MAP,
        VariantType(),
        ArrayType(MAP),
        StructType([StructField("a", StringType()), StructField("m", MAP)]),
    ],
)
def test_a_new_function_whose_key_spark_cannot_hash_takes_blake2b(key_type) -> None:
    assert key_group_scheme(_plan(), FN, key_type) == BLAKE2B


@pytest.mark.parametrize("stored", [BLAKE2B, SPARK_HASH])
def test_an_operator_keeps_its_stored_scheme(stored: str) -> None:
    for op in (FN, AGG):
        assert key_group_scheme(_plan(**{op.uid: stored}), op, StringType()) == stored
