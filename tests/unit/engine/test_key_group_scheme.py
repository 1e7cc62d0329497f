"""``runner.key_group_scheme``: an operator keeps its stored state's scheme; a new one takes
Spark's hash unless it is a function whose key is not a plain string, an integer, a float or
a boolean (a collated string partitions by its collation; a nested key's hash depends on the
widths inside it; a map or variant has none)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
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
    [None, StringType(), IntegerType(), ShortType(), LongType(), DoubleType(), BooleanType()],
)
def test_a_new_operator_takes_spark_s_hash(key_type) -> None:
    assert key_group_scheme(_plan(), FN, key_type) == SPARK_HASH
    assert key_group_scheme(_plan(), AGG, key_type) == SPARK_HASH


@pytest.mark.parametrize(
    "key_type",
    [
        StringType("UTF8_LCASE"),
        ArrayType(StringType()),
        StructType([StructField("a", IntegerType())]),
        MAP,
        VariantType(),
        DecimalType(10, 2),
        DateType(),
    ],
)
def test_a_new_function_whose_key_is_not_a_plain_scalar_takes_blake2b(key_type) -> None:
    assert key_group_scheme(_plan(), FN, key_type) == BLAKE2B


@pytest.mark.parametrize("stored", [BLAKE2B, SPARK_HASH])
def test_an_operator_keeps_its_stored_scheme(stored: str) -> None:
    for op in (FN, AGG):
        assert key_group_scheme(_plan(**{op.uid: stored}), op, StringType()) == stored
