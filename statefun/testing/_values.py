"""Typed values as plain Python values: what a test compares.

A typed value (typename + bytes) is decoded when its type is known: the built-in types, the
``Type`` objects the harness was given or found (the ValueSpecs of its functions, module-level
``Type`` objects of their modules, the types of values sent to it), Kafka and Kinesis egress
records, and protobuf messages whose class is loaded in the process. Anything else stays a
``Raw(typename, bytes)``, which compares equal to that tuple.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from google.protobuf import descriptor_pool, message_factory

from statefun.ingress._records import typed_value_from_json
from statefun.sdk._messages import KAFKA_PRODUCER_RECORD_TYPENAME, KINESIS_EGRESS_RECORD_TYPENAME
from statefun.sdk._proto import egress_pb2
from statefun.sdk._types import BUILTIN_TYPES, Type, TypedValue

__all__ = ["KafkaRecord", "KinesisRecord", "Raw", "TypeTable"]

_PROTOBUF_PREFIX = "type.googleapis.com/"


class Raw(NamedTuple):
    """A value whose type the harness does not know: its typename and its bytes."""

    typename: str
    value: bytes | None


class KafkaRecord(NamedTuple):
    """A record for a Kafka egress (``kafka_egress_message``): topic, key and value bytes."""

    topic: str
    key: str | None
    value: bytes


class KinesisRecord(NamedTuple):
    """A record for a Kinesis egress (``kinesis_egress_message``)."""

    stream: str
    partition_key: str
    value: bytes
    explicit_hash_key: str | None = None


class _JsonSerializer:
    """The JSON encoding the file and HTTP ingresses use for a typename they do not know."""

    @staticmethod
    def deserialize(data: bytes) -> Any:
        return json.loads(data)


class TypeTable:
    """The types a harness knows, by typename."""

    def __init__(self, types: Iterable[Type] = ()) -> None:
        self._types: dict[str, Type] = dict(BUILTIN_TYPES)
        self._json: set[str] = set()
        for tpe in types:
            self.add(tpe)

    def add(self, tpe: Type) -> None:
        if not isinstance(tpe, Type):
            raise TypeError(f"expected a statefun Type, got {type(tpe).__name__}")
        self._types.setdefault(tpe.typename, tpe)

    def add_json(self, typename: str) -> None:
        """``typename`` is JSON text (a value sent to the harness with that typename)."""
        if typename not in self._types:
            self._json.add(typename)

    def add_module_types(self, fun: Any) -> None:
        """The module-level ``Type`` objects (JSON, protobuf and simple types) of the module
        that defines the function ``fun``."""
        namespace = getattr(fun, "__globals__", None)
        if namespace is None:  # a callable object: its class's module, if imported
            module = sys.modules.get(getattr(fun, "__module__", "") or "")
            namespace = vars(module) if module is not None else {}
        for value in list(namespace.values()):
            if isinstance(value, Type):
                self.add(value)

    def get(self, typename: str) -> Type | None:
        return self._types.get(typename)

    # -- plain values -> typed values ------------------------------------------------------

    def encode(self, value: Any, typename: str | None, tpe: Type | None) -> TypedValue:
        """The typed value of ``value``: with ``tpe``, its serializer; a TypedValue as it is;
        else as a file ingress record (a str, bool, int or float without a typename becomes
        the built-in type; with a known typename, that type; bytes with a typename are taken
        as they are; anything else is JSON text)."""
        if tpe is not None:
            if typename is not None and typename != tpe.typename:
                raise ValueError(f"typename {typename!r} differs from type {tpe.typename!r}")
            self.add(tpe)
            return TypedValue(tpe.typename, tpe.serializer().serialize(value))
        if isinstance(value, TypedValue):
            return value
        if typename is not None:
            known = self._types.get(typename)
            if known is not None:
                return TypedValue(typename, known.serializer().serialize(value))
            if isinstance(value, bytes | bytearray):
                return TypedValue(typename, bytes(value))
            self.add_json(typename)
        return typed_value_from_json(value, typename)

    # -- typed values -> plain values ------------------------------------------------------

    def decode_state(self, values: Mapping[str, Any], specs: Mapping[str, Any]) -> dict[str, Any]:
        """An address's state values, decoded: by their ValueSpec's type (``specs``, by name)
        when the stored value has it, else as ``decode`` does; absent values left out."""
        out: dict[str, Any] = {}
        for name, typed in values.items():
            if typed is None or not typed.has_value:
                continue
            spec = specs.get(name)
            if spec is not None and spec.type.typename == typed.typename:
                out[name] = spec.type.serializer().deserialize(bytes(typed.value))
            else:
                out[name] = self.decode(typed)
        return out

    def decode(self, typed: Any) -> Any:
        """The plain value of a typed value (anything with typename, has_value and value)."""
        if typed is None or not typed.has_value:
            return None
        typename = str(typed.typename)
        data = bytes(typed.value)
        try:
            tpe = self._types.get(typename)
            if tpe is not None:
                return tpe.serializer().deserialize(data)
            if typename in self._json:
                return _JsonSerializer.deserialize(data)
            if typename == KAFKA_PRODUCER_RECORD_TYPENAME:
                kafka = egress_pb2.KafkaProducerRecord.FromString(data)
                return KafkaRecord(kafka.topic, kafka.key or None, kafka.value_bytes)
            if typename == KINESIS_EGRESS_RECORD_TYPENAME:
                kinesis = egress_pb2.KinesisEgressRecord.FromString(data)
                return KinesisRecord(
                    kinesis.stream,
                    kinesis.partition_key,
                    kinesis.value_bytes,
                    kinesis.explicit_hash_key or None,
                )
            if typename.startswith(_PROTOBUF_PREFIX):
                return _decode_protobuf(typename[len(_PROTOBUF_PREFIX) :], data, typed)
        except Exception:  # bytes that are not what their typename says: show them raw
            return Raw(typename, data)
        return Raw(typename, data)


def _decode_protobuf(full_name: str, data: bytes, typed: Any) -> Any:
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError:
        return Raw(str(typed.typename), data)
    return message_factory.GetMessageClass(descriptor).FromString(data)
