"""Turning a JSON record (file lines, ``statefun send``) into a typed value."""

from __future__ import annotations

import base64
import json
from typing import Any

from statefun.sdk._types import (
    BUILTIN_TYPES,
    BoolType,
    DoubleType,
    FloatType,
    IntType,
    LongType,
    StringType,
    TypedValue,
    validate_typename,
)

__all__ = ["BUILTIN_TYPES", "RecordError", "typed_value_from_json", "typed_value_from_text"]


class RecordError(ValueError):
    """A record that cannot become a message; the message says which field and why."""


def typed_value_from_json(value: Any, typename: str | None) -> TypedValue:
    """A typed value from a JSON value and an optional typename.

    Without a typename a str becomes io.statefun.types/string, a bool .../bool, an int
    .../int (.../long if it does not fit 32 bits) and a float .../double. With a built-in
    typename the value is encoded as that type; with any other typename it is JSON text.
    """
    if typename is None:
        if isinstance(value, str):
            return TypedValue(StringType.typename, StringType.serializer().serialize(value))
        if isinstance(value, bool):
            return TypedValue(BoolType.typename, BoolType.serializer().serialize(value))
        if isinstance(value, int):
            tpe = IntType if -(2**31) <= value < 2**31 else LongType
            return TypedValue(tpe.typename, tpe.serializer().serialize(value))
        if isinstance(value, float):
            return TypedValue(DoubleType.typename, DoubleType.serializer().serialize(value))
        raise RecordError(
            f"a {type(value).__name__} value needs a 'type' (a typename such as 'example/Order')"
        )
    try:
        validate_typename(typename, "type")
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    builtin = BUILTIN_TYPES.get(typename)
    if builtin is None:
        return TypedValue(typename, json.dumps(value, ensure_ascii=False).encode("utf-8"))
    try:
        return TypedValue(typename, builtin.serializer().serialize(value))
    except (TypeError, ValueError) as exc:
        raise RecordError(f"value {value!r} is not a valid {typename}: {exc}") from None


def typed_value_from_text(text: str, typename: str) -> TypedValue:
    """A typed value of a built-in type from its text form ('42', 'true', 'hello')."""
    builtin = BUILTIN_TYPES[typename]
    value: Any
    try:
        if builtin in (IntType, LongType):
            value = int(text)
        elif builtin in (FloatType, DoubleType):
            value = float(text)
        elif builtin is BoolType:
            lowered = text.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError("expected true or false")
            value = lowered == "true"
        else:
            value = text
        return TypedValue(typename, builtin.serializer().serialize(value))
    except (TypeError, ValueError) as exc:
        raise RecordError(f"{text[:80]!r} is not a valid {typename}: {exc}") from None


def typed_value_from_record(record: dict[str, Any]) -> TypedValue:
    """The value of a JSON record: 'value' (+ optional 'type') or 'value_base64' + 'type'."""
    typename = record.get("type")
    if typename is not None and not isinstance(typename, str):
        raise RecordError("'type' must be a string typename")
    if "value_base64" in record:
        if typename is None:
            raise RecordError("'value_base64' needs a 'type'")
        try:
            raw = base64.b64decode(record["value_base64"], validate=True)
        except (ValueError, TypeError):
            raise RecordError("'value_base64' is not valid base64") from None
        return TypedValue(typename, raw)
    if "value" not in record:
        raise RecordError("the record has no 'value' (or 'value_base64')")
    return typed_value_from_json(record["value"], typename)
