"""Decoding Kafka record values (``bytes``, ``text``, ``json`` with an optional schema).

Pure: imports no Kafka client, so the pipeline API validates formats at load time and the
executors decode what the range reader (``kafka_reader``) yields.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from microcheckpoint.errors import ConfigError, InvalidValue, KafkaSourceError
from microcheckpoint.ids import TopicPartition

__all__ = [
    "SCHEMA_TYPES",
    "VALUE_FORMATS",
    "SourceRecord",
    "check_value_format",
    "decode_json_columns",
    "decode_record",
    "decode_value",
]

VALUE_FORMATS = ("bytes", "text", "json")
SCHEMA_TYPES = ("string", "long", "double", "boolean")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(r"-?[0-9]+")  # strings a long field accepts (JSON integer syntax)
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")  # and a double field
# The Arrow type of each schema type (``decode_json_columns``).
_ARROW_TYPES = {"string": "string", "long": "int64", "double": "float64", "boolean": "bool"}


@dataclass(frozen=True)
class SourceRecord:
    """One Kafka record as read by ``read_split``; ``headers`` keep the produced order
    (a header value may be None when the producer sent a null)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def check_value_format(fmt: str, schema: dict[str, str] | None = None) -> None:
    """Validate a value format and optional JSON schema (at load time).

    Raises:
        ConfigError: ``fmt`` is not one of ``VALUE_FORMATS``, a schema is given for a format
            other than ``json``, or a schema type is not one of ``SCHEMA_TYPES``.
    """
    if fmt not in VALUE_FORMATS:
        raise ConfigError("value_format", fmt, f"one of {', '.join(VALUE_FORMATS)}")
    if schema is None:
        return
    if fmt != "json":
        raise ConfigError("value_schema", schema, "a schema only applies to value_format 'json'")
    if not isinstance(schema, dict):
        raise ConfigError("value_schema", schema, "a mapping of field name to type")
    for name, kind in schema.items():
        if not isinstance(name, str) or kind not in SCHEMA_TYPES:
            raise ConfigError(
                "value_schema", {name: kind}, f"field names map to one of {', '.join(SCHEMA_TYPES)}"
            )


def decode_value(value: bytes | None, fmt: str, schema: dict[str, str] | None = None) -> Any:
    """Decode a record value.

    - ``bytes``: the value as it is.
    - ``text``: the value as strict UTF-8.
    - ``json``: strict JSON in UTF-8 (``NaN`` and ``Infinity`` are refused). With ``schema``
      (``{field: type}``), the value must be an object and the result is a dict with exactly
      the schema's fields in the schema's order: a missing field or JSON ``null`` gives None,
      other fields are dropped. Types: ``string`` (str; a number, boolean, object or array
      becomes its compact JSON text), ``long`` (an integer in the signed 64-bit range, an
      integral float or a string holding an integer), ``double`` (a number or a string
      holding a finite number), ``boolean`` (true/false or the strings "true"/"false").

    A null value (a tombstone) decodes to None in every format.

    Raises:
        ConfigError: ``fmt`` or ``schema`` is invalid (see ``check_value_format``).
        ValueError: the value is not valid UTF-8 or JSON, or does not fit the schema.
    """
    check_value_format(fmt, schema)
    if value is None or fmt == "bytes":
        return value
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidValue(f"value is not valid UTF-8: {exc}") from None
    if fmt == "text":
        return text
    try:
        parsed = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # JSONDecodeError, a refused constant, an over-long integer
        raise InvalidValue(f"value is not valid JSON: {exc}") from None
    if schema is None:
        return parsed
    if not isinstance(parsed, dict):
        raise InvalidValue(f"value is JSON {type(parsed).__name__}, the schema needs an object")
    return {name: _coerce(name, parsed.get(name), kind) for name, kind in schema.items()}


def decode_record(record: SourceRecord, fmt: str, schema: dict[str, str] | None = None) -> Any:
    """``decode_value`` of ``record.value``, with errors that name where the record is.

    Raises:
        ConfigError: ``fmt`` or ``schema`` is invalid.
        KafkaSourceError: the value cannot be decoded; the message names topic, partition and
            offset.
    """
    check_value_format(fmt, schema)
    try:
        return decode_value(record.value, fmt, schema)
    except ValueError as exc:
        raise KafkaSourceError(
            f"record at offset {record.offset} of topic {record.topic!r} partition "
            f"{record.partition} cannot be decoded as value_format {fmt!r}: {exc}; fix the "
            "producer, or change value_format / value_schema"
        ) from exc


def decode_json_columns(
    values: list[bytes | None], schema: dict[str, str]
) -> dict[str, Any] | None:
    """The ``schema``'s fields of JSON ``values`` as Arrow arrays, decoded in bulk by Arrow's
    JSON reader; None when that cannot be sure to equal ``decode_value`` per value, and the
    caller decodes value by value (which also names a record that does not decode).

    Bulk decoding is taken only when its rows are the per-value results: every value is valid
    UTF-8 and non-blank, holds no newline, byte order mark, ``NaN`` or ``Infinity`` (Arrow's
    reader accepts those, strict JSON does not), and gives exactly one row; Arrow's reader
    refuses what would need a conversion here (a number for a string field, a string holding
    a number, an integral float for a long), a field given twice and any syntax error, so
    those values go value by value. A null value (a tombstone) gives a row of nulls, as per
    value.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if not values:
        return None
    raw = pc.fill_null(pa.array(values, pa.binary()), b"{}")
    try:
        text = raw.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    if (
        pc.min(pc.utf8_length(pc.utf8_trim_whitespace(text))).as_py() == 0
        or pc.any(pc.match_substring_regex(text, r"\n|NaN|Infinity|\x{FEFF}")).as_py()
    ):
        return None
    arrow = pa.schema(
        [(name, pa.type_for_alias(_ARROW_TYPES[kind])) for name, kind in schema.items()]
    )
    options = pj.ParseOptions(explicit_schema=arrow, unexpected_field_behavior="ignore")
    joined = b"\n".join(v if v is not None else b"{}" for v in values)
    try:
        table = pj.read_json(
            pa.BufferReader(joined),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(joined) + 1),
            parse_options=options,
        )
    except pa.ArrowInvalid:
        return None
    if table.num_rows != len(values):
        return None
    columns = {name: table.column(name).combine_chunks() for name in schema}
    for name, kind in schema.items():
        if kind == "double" and pc.all(pc.is_finite(columns[name])).as_py() is False:
            return None
    return columns


def _refuse_constant(name: str) -> Any:
    raise InvalidValue(f"{name} is not a JSON number")


def _coerce(name: str, raw: Any, kind: str) -> Any:
    if raw is None:
        return None
    if kind == "string":
        return raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"))
    if kind == "boolean":
        if isinstance(raw, bool):
            return raw
        if raw in ("true", "false"):
            return raw == "true"
    elif kind == "long":
        number = _long(raw)
        if number is not None:
            return number
    elif kind == "double":
        number = _double(raw)
        if number is not None:
            return number
    raise InvalidValue(f"field {name!r} must be {kind}, got {json.dumps(raw)[:80]}")


def _long(raw: Any) -> int | None:
    if (isinstance(raw, float) and raw.is_integer()) or (
        isinstance(raw, str) and len(raw) <= 20 and _INTEGER.fullmatch(raw)
    ):
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        return None
    return raw if _LONG_MIN <= raw <= _LONG_MAX else None


def _double(raw: Any) -> float | None:
    if isinstance(raw, str) and len(raw) <= 400 and _NUMBER.fullmatch(raw):
        raw = float(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    try:
        number = float(raw)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
