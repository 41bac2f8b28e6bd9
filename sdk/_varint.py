"""Protobuf wire primitives shared by the hand-written encoders: varints and byte fields."""

from __future__ import annotations

__all__ = ["ONE_BYTE", "bytes_field", "varint"]

#: the varints of 0..127, one byte each (indexing this beats calling ``varint`` on hot paths)
ONE_BYTE = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    """The protobuf varint of a non-negative int (or a negative int64, as 10 bytes)."""
    if 0 <= n < 128:
        return ONE_BYTE[n]
    if 0 < n < 16384:  # two bytes: the length of most fields that need more than one
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def bytes_field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited string or bytes field; empty ones are left out, as proto3 does."""
    n = len(payload)
    if not n:
        return b""
    return b"".join((tag, ONE_BYTE[n] if n < 128 else varint(n), payload))
