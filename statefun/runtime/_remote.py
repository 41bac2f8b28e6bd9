"""Calling remote functions: the ToFunction encoder, the FromFunction decoder, the HTTP client.

The encoder and decoder are pure (bytes in, bytes out). ``RemoteClient`` is the one pooled
aiohttp client of the runtime: connect and read timeouts per attempt, retries with
exponential backoff until the endpoint's call timeout, then a RetryableFunctionError (or a
TerminalFunctionError at once when retrying cannot help).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
from google.protobuf.message import DecodeError

from statefun._exceptions import (
    MalformedResponseError,
    RetryableFunctionError,
    TerminalFunctionError,
)
from statefun.module._specs import TransportSpec
from statefun.runtime._envelope import Envelope
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._wire import encode_address, encode_typed_value, varint

__all__ = ["RemoteClient", "decode_from_function", "encode_to_function"]

log = logging.getLogger(__name__)

_HEADERS = {"Content-Type": "application/octet-stream"}


def _ld(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def encode_to_function(
    typename: str,
    id_: str,
    states: Iterable[tuple[str, str, Any]],
    batch: Sequence[Envelope],
) -> bytes:
    """A serialized ToFunction for ``batch`` to (typename, id_).

    ``states`` holds (state name, state typename, typed value or None) for every state the
    function registered; absent values are sent with ``has_value`` false, so the function sees
    the name and knows it was registered.
    """
    parts = [_ld(b"\x0a", encode_address(typename, id_))]
    for name, state_typename, typed in states:
        if typed is None:
            value = encode_typed_value(state_typename, False, b"")
        else:
            value = encode_typed_value(typed.typename, typed.has_value, typed.value)
        parts.append(_ld(b"\x12", _ld(b"\x0a", name.encode("utf-8")) + _ld(b"\x12", value)))
    for envelope in batch:
        caller = envelope.caller
        body = b""
        if caller is not None:
            body = _ld(b"\x0a", encode_address(caller.typename, caller.id))
        v = envelope.value
        body += _ld(b"\x12", encode_typed_value(v.typename, v.has_value, v.value))
        parts.append(_ld(b"\x1a", body))
    return _ld(b"\xa2\x06", b"".join(parts))


def decode_from_function(data: bytes, typename: str) -> Any:
    """Parse a FromFunction; MalformedResponseError if the bytes are not one."""
    try:
        response = pb.FromFunction.FromString(data)
    except DecodeError as exc:
        raise MalformedResponseError(
            f"function {typename} answered with bytes that are not a FromFunction: {exc}"
        ) from None
    # An empty FromFunction is a batch without effects: StateFun's SDKs send b"" for it.
    return response


class RemoteClient:
    """The pooled HTTP client for every remote function of the runtime."""

    def __init__(
        self,
        max_connections: int = 256,
        initial_backoff_ms: int = 50,
        max_backoff_ms: int = 5_000,
        max_response_bytes: int = 64 << 20,
    ) -> None:
        self._max_connections = max_connections
        self._initial_backoff = initial_backoff_ms / 1000.0
        self._max_backoff = max_backoff_ms / 1000.0
        self._max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[TransportSpec, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, url: str, body: bytes, transport: TransportSpec, typename: str) -> bytes:
        """POST ``body`` to ``url``; the response body. Retries until the call timeout."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        deadline = time.monotonic() + transport.call.total_seconds()
        backoff = self._initial_backoff
        attempt = 0
        while True:
            attempt += 1
            if attempt == 1:
                timeout = self._first_timeout(transport)
            else:
                timeout = aiohttp.ClientTimeout(
                    total=max(0.001, deadline - time.monotonic()),
                    connect=transport.connect.total_seconds(),
                    sock_read=transport.read.total_seconds(),
                )
            try:
                async with self._session.post(
                    url, data=body, headers=_HEADERS, timeout=timeout
                ) as response:
                    if response.status == 200:
                        length = response.content_length
                        if length is None:  # chunked: count while reading
                            return await self._read_limited(response, url, typename)
                        if length > self._max_response_bytes:
                            raise TerminalFunctionError(
                                f"function {typename} at {url} answered with {length} bytes, "
                                f"more than the limit of {self._max_response_bytes}"
                            )
                        return await response.read()
                    reason = (await response.text(errors="replace"))[:200].strip()
                    problem = f"HTTP {response.status} from {url}: {reason or response.reason}"
                    if 400 <= response.status < 500 and response.status not in (408, 429):
                        raise TerminalFunctionError(f"function {typename}: {problem}")
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                problem = f"{type(exc).__name__} calling {url}: {exc}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RetryableFunctionError(
                    f"function {typename} did not answer within its call timeout of "
                    f"{transport.call} ({attempt} attempts); last error: {problem}"
                )
            pause = min(backoff, remaining) * (0.5 + random.random() / 2)
            log.warning(
                "call to %s failed (attempt %d): %s; retrying in %.0f ms",
                typename,
                attempt,
                problem,
                pause * 1000,
            )
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, self._max_backoff)

    def _first_timeout(self, transport: TransportSpec) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(transport)
        if timeout is None:
            timeout = self._timeouts[transport] = aiohttp.ClientTimeout(
                total=transport.call.total_seconds(),
                connect=transport.connect.total_seconds(),
                sock_read=transport.read.total_seconds(),
            )
        return timeout

    async def _read_limited(
        self, response: aiohttp.ClientResponse, url: str, typename: str
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > self._max_response_bytes:
                raise TerminalFunctionError(
                    f"function {typename} at {url} answered with more than "
                    f"{self._max_response_bytes} bytes"
                )
            chunks.append(chunk)
        return b"".join(chunks)
