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
# ``decode_json_columns``: what a value must be, what it must not hold, the bytes of a batch
# at most, and the field each value is tagged with (a name no producer writes: a value with
# it has the field twice, which Arrow refuses, and goes value by value).
_ONE_OBJECT = r"^[ \t\r]*\{.*\}[ \t\r]*$"
_NOT_IN_BULK = r"\n|NaN|Inf|\x{FEFF}|-0(?:[^.eE0-9]|$)|[0-9]{300}"
_BULK_MAX_BYTES = 1 << 30
_ROW = "\x01row"
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
    except RecursionError:
        raise InvalidValue("value is JSON nested too deeply to decode") from None
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

    Bulk decoding is taken only for values that are one JSON object each, in valid UTF-8,
    with no newline, byte order mark, ``NaN``, ``Inf`` or ``Infinity`` (Arrow's reader takes
    those, strict JSON does not), no ``-0`` (an integer zero per value, a negative zero to
    Arrow), no run of 300 digits (past a double's range, or Python's limit on an integer's
    digits) and at most 500 brackets (Python's parser has a depth limit); each value is tagged with its
    index and every row must carry its own, so a row is always its value's. Arrow's reader
    refuses what would need a conversion here (a number for a string field, a string holding
    a number, an integral float for a long), a field given twice and any syntax error, so
    those values go value by value. A null value (a tombstone) gives a row of nulls, as per
    value.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    n = len(values)
    if not n:
        return None
    raw = pc.fill_null(pa.array(values, pa.binary()), b"{}")
    lengths = pc.binary_length(raw)
    if pc.sum(lengths).as_py() > _BULK_MAX_BYTES:
        return None
    try:
        text = raw.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    # Values that begin with "{" and end with "}" (no space around them, as producers
    # write them) are one object each without a regular expression, the rest with one.
    bare = pc.all(pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}"))).as_py()
    if (
        not (bare or pc.all(pc.match_substring_regex(text, _ONE_OBJECT)).as_py())
        or pc.any(pc.match_substring_regex(text, _NOT_IN_BULK)).as_py()
        # brackets are counted only where a value is long enough to hold more than 500
        or (
            pc.max(lengths).as_py() > 500
            and pc.max(pc.count_substring_regex(text, r"[\[{]")).as_py() > 500
        )
    ):
        return None
    # Each value tagged with its index: {"<_ROW>":i, ...}, then one value per line.
    if bare:
        rest = pc.utf8_slice_codeunits(text, 1)
    else:
        rest = pc.replace_substring_regex(text, r"^[ \t\r]*\{", "", max_replacements=1)
    empty = pc.match_substring_regex(rest, r"^[ \t\r]*\}")
    index = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    tagged = pc.binary_join_element_wise(
        "{" + json.dumps(_ROW) + ":", index, pc.if_else(empty, "", ","), rest, "\n", ""
    )
    # the lines, as they lie in the array's data buffer
    bounds = np.frombuffer(tagged.buffers()[1], np.int32, n + 1 + tagged.offset)[tagged.offset :]
    start, stop = int(bounds[0]), int(bounds[-1])
    arrow = pa.schema(
        [(_ROW, pa.int64())]
        + [(name, pa.type_for_alias(_ARROW_TYPES[kind])) for name, kind in schema.items()]
    )
    options = pj.ParseOptions(explicit_schema=arrow, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(
            pa.BufferReader(tagged.buffers()[2].slice(start, stop - start)),
            read_options=pj.ReadOptions(use_threads=False, block_size=stop - start + 1),
            parse_options=options,
        )
    except (pa.ArrowInvalid, OverflowError):
        return None
    rows = table.column(_ROW)
    if table.num_rows != n or rows.null_count or not np.array_equal(rows.to_numpy(), np.arange(n)):
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
