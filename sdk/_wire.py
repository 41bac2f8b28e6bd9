"""Encoding of request-reply v3 messages, by hand, on the hot path.

Decoding uses the generated protobuf code (upb parses in C). Encoding a FromFunction with the
generated classes costs one Python object per field, so responses are written directly in the
protobuf wire format instead: every field is length-delimited or a varint, and the encodings
of typenames are cached. Tests check the bytes decode with the generated classes and with
Apache StateFun's own SDK to exactly the intended messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from statefun.sdk._context import DelayedMessage
from statefun.sdk._messages import EgressMessage, Message
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import ValueSpec
from statefun.sdk._varint import ONE_BYTE, varint
from statefun.sdk._varint import bytes_field as _field

__all__ = [
    "ONE_BYTE",
    "encode_address",
    "encode_incomplete_context",
    "encode_invocation_response",
    "encode_typed",
    "encode_typed_value",
    "message_field",
    "varint",
]


def message_field(tag: bytes, payload: bytes) -> bytes:
    """A sub-message field: present even when empty."""
    n = len(payload)
    return tag + (ONE_BYTE[n] if n < 128 else varint(n)) + payload


_typename_prefix: dict[str, bytes] = {}
_address_prefix: dict[str, bytes] = {}


def _typed_value_prefix(typename: str) -> bytes:
    prefix = _typename_prefix.get(typename)
    if prefix is None:
        prefix = _field(b"\x0a", typename.encode("utf-8"))
        if len(_typename_prefix) < 10_000:
            _typename_prefix[typename] = prefix
    return prefix


def encode_typed_value(typename: str, has_value: bool, value: bytes) -> bytes:
    """TypedValue fields (without the enclosing tag)."""
    if has_value:
        return _typed_value_prefix(typename) + b"\x10\x01" + _field(b"\x1a", value)
    # No value: bytes that came with it anyway are passed on as they are (as StateFun's SDK).
    return (
        _typed_value_prefix(typename) + _field(b"\x1a", value)
        if value
        else _typed_value_prefix(typename)
    )


_with_value_prefix: dict[str, bytes] = {}


def encode_typed(typed: Any) -> bytes:
    """TypedValue fields of a typed value (ours or a protobuf TypedValue); the hot path."""
    if typed.has_value:
        typename = typed.typename
        prefix = _with_value_prefix.get(typename)
        if prefix is None:
            prefix = _typed_value_prefix(typename) + b"\x10\x01"
            if len(_with_value_prefix) < 10_000:
                _with_value_prefix[typename] = prefix
        value: bytes = typed.value
        if not value:
            return prefix
        n = len(value)
        # one join: a chain of + would copy the bytes once per part (twice the time)
        return b"".join((prefix, b"\x1a", ONE_BYTE[n] if n < 128 else varint(n), value))
    return encode_typed_value(typed.typename, False, typed.value)


def encode_address(typename: str, id_: str) -> bytes:
    """Address fields for ``namespace/name`` and ``id`` (without the enclosing tag)."""
    prefix = _address_prefix.get(typename)
    if prefix is None:
        namespace, _, name = typename.rpartition("/")
        prefix = _field(b"\x0a", namespace.encode("utf-8")) + _field(b"\x12", name.encode("utf-8"))
        if len(_address_prefix) < 10_000:
            _address_prefix[typename] = prefix
    return prefix + _field(b"\x1a", id_.encode("utf-8"))


def _outgoing(message: Message) -> bytes:
    # message_field(0x12, message_field(0x0a, address) + message_field(0x12, typed value)), inlined
    address = encode_address(message.target_typename, message.target_id)
    typed = encode_typed(message.typed_value)
    a, t = len(address), len(typed)
    if a < 128 and t < 128:
        body = b"\x0a" + ONE_BYTE[a] + address + b"\x12" + ONE_BYTE[t] + typed
    else:
        body = b"\x0a" + varint(a) + address + b"\x12" + varint(t) + typed
    n = len(body)
    return b"\x12" + (ONE_BYTE[n] if n < 128 else varint(n)) + body


def _delayed(delayed: DelayedMessage) -> bytes:
    message = delayed.message
    if message is None:
        body = b"\x50\x01" + _field(b"\x5a", delayed.cancellation_token.encode("utf-8"))
    else:
        body = (
            (b"\x08" + varint(delayed.delay_ms) if delayed.delay_ms else b"")
            + message_field(b"\x12", encode_address(message.target_typename, message.target_id))
            + message_field(b"\x1a", encode_typed(message.typed_value))
            + _field(b"\x5a", delayed.cancellation_token.encode("utf-8"))
        )
    return message_field(b"\x1a", body)


_egress_prefix: dict[str, bytes] = {}


def _egress(message: EgressMessage) -> bytes:
    typename = message.typename
    prefix = _egress_prefix.get(typename)
    if prefix is None:
        namespace, _, name = typename.rpartition("/")
        prefix = _field(b"\x0a", namespace.encode("utf-8")) + _field(b"\x12", name.encode("utf-8"))
        if len(_egress_prefix) < 10_000:
            _egress_prefix[typename] = prefix
    typed = encode_typed(message.typed_value)
    t = len(typed)
    length = ONE_BYTE[t] if t < 128 else varint(t)
    n = len(prefix) + 1 + len(length) + t
    head = ONE_BYTE[n] if n < 128 else varint(n)
    return b"".join((b"\x22", head, prefix, b"\x1a", length, typed))


_state_name_field: dict[str, bytes] = {}


def _mutation(name: str, typed: Any) -> bytes:
    name_field = _state_name_field.get(name)
    if name_field is None:
        name_field = _field(b"\x12", name.encode("utf-8"))
        if len(_state_name_field) < 10_000:
            _state_name_field[name] = name_field
    if typed is None:  # DELETE is enum value 0: nothing but the name
        return message_field(b"\x0a", name_field)
    value = encode_typed(typed)
    t = len(value)
    body = b"\x08\x01" + name_field + b"\x1a" + (ONE_BYTE[t] if t < 128 else varint(t)) + value
    n = len(body)
    return b"\x0a" + (ONE_BYTE[n] if n < 128 else varint(n)) + body


def encode_invocation_response(
    mutations: Iterable[tuple[str, Any]],
    messages: Iterable[Message],
    delayed: Iterable[DelayedMessage],
    egress: Iterable[EgressMessage],
) -> bytes:
    """A serialized FromFunction holding an InvocationResponse.

    A batch without any effect gives an empty FromFunction (no response set), byte for byte
    what StateFun's SDK sends; StateFun's runtime reads that as an empty InvocationResponse.
    """
    parts: list[bytes] = []
    append = parts.append  # plain loops: cheaper than comprehensions for the usual 1 or 2 items
    for name, typed in mutations:
        append(_mutation(name, typed))
    for message in messages:
        append(_outgoing(message))
    if delayed:
        parts.extend(map(_delayed, delayed))
    if egress:
        parts.extend(map(_egress, egress))
    if not parts:
        return b""
    body = b"".join(parts)
    n = len(body)
    return b"\xa2\x06" + (ONE_BYTE[n] if n < 128 else varint(n)) + body


_EXPIRE_MODES = {
    (False, False): pb.FromFunction.ExpirationSpec.NONE,
    (False, True): pb.FromFunction.ExpirationSpec.AFTER_WRITE,
    (True, False): pb.FromFunction.ExpirationSpec.AFTER_INVOKE,
}


def encode_incomplete_context(missing: Iterable[ValueSpec]) -> bytes:
    """A serialized FromFunction asking the runtime to register ``missing`` state specs."""
    response = pb.FromFunction()
    values = response.incomplete_invocation_context.missing_values
    for spec in missing:
        expiration = pb.FromFunction.ExpirationSpec(
            mode=_EXPIRE_MODES[spec.after_call, spec.after_write]
        )
        if spec.after_call or spec.after_write:
            expiration.expire_after_millis = spec.duration
        values.add(
            state_name=spec.name, type_typename=spec.type.typename, expiration_spec=expiration
        )
    return bytes(response.SerializeToString())
