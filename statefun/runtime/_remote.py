"""Calling remote functions: the ToFunction encoder, the FromFunction decoder, the HTTP client.

The encoder and decoder are pure (bytes in, bytes out). ``RemoteClient`` is the one pooled
HTTP client of the runtime (``_http.HttpPool``): connect and read timeouts per attempt, the
call timeout over all attempts, retries with exponential backoff and jitter until the call
timeout, then a RetryableFunctionError (or a TerminalFunctionError at once when retrying
cannot help: a 4xx other than 408/429, an oversized response, a URL that cannot be called).
A 404 or 410 (or an answer whose text says so, as SDKs word it) says the endpoint
has no such function: a FunctionNotFoundError, which sends the
batch to the dead letters whatever the failure policy (a message to a type no one serves is
the sender's problem, not the job's); so does a failure this SDK's server reports as an
``InvalidValueError`` (a message's value does not decode as its own type): a
MessageValueError.

Failed attempts are reported per endpoint (its URL's origin), not per call: the first failure
is one WARNING line, further ones are counted and reported at most once per
``log_interval_s`` with the count and the last error, and the first success after them is one
INFO line ("answers again"). ``trouble`` tells what the failures of an endpoint are (the HTTP
ingress says so when a /call times out).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from statefun._compiled import hot_loops
from statefun._exceptions import (
    FunctionNotFoundError,
    MalformedResponseError,
    MessageValueError,
    RetryableFunctionError,
    TerminalFunctionError,
)
from statefun._http.client import (
    HttpPool,
    HttpProtocolError,
    ResponseTooLarge,
    Target,
    parse_target,
)
from statefun.module._specs import TransportSpec
from statefun.runtime._envelope import Envelope
from statefun.runtime._stats import EndpointStats
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._wire import (
    ONE_BYTE,
    encode_address,
    encode_typed,
    encode_typed_value,
    message_field,
)

__all__ = [
    "IngressEncoding",
    "RemoteClient",
    "decode_from_function",
    "encode_to_function",
    "ingress_encoding",
    "ingress_invocation",
    "invocation",
]

log = logging.getLogger(__name__)

#: what a function server that passes its error text on says for a type it does not have
#: (this SDK, and StateFun's Python SDK): "function does not exist", whatever the status
#: what this SDK's server says when a message's value does not decode as its own type
_INVALID_VALUE = re.compile(r"\bInvalidValueError: ")
_NO_SUCH_FUNCTION = re.compile(
    r"no function is registered for type|unable to find a function of type", re.IGNORECASE
)


#: encode_to_function's loop over a batch, compiled (statefun/_hotloops.c), when built
_invocation_wires: Callable[[list[Envelope], Callable[[Envelope], bytes]], list[bytes]] | None = (
    None if hot_loops is None else hot_loops.invocation_wires
)


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
    parts = [message_field(b"\x0a", encode_address(typename, id_))]
    for name, state_typename, typed in states:
        value = (
            encode_typed_value(state_typename, False, b"") if typed is None else encode_typed(typed)
        )
        parts.append(
            message_field(
                b"\x12",
                message_field(b"\x0a", name.encode("utf-8")) + message_field(b"\x12", value),
            )
        )
    if _invocation_wires is not None and type(batch) is list:
        parts += _invocation_wires(batch, invocation)  # (the loop below, compiled)
    else:
        for envelope in batch:
            wire = envelope.wire
            parts.append(invocation(envelope) if wire is None else wire)
    return message_field(b"\xa2\x06", b"".join(parts))


def invocation(envelope: Envelope) -> bytes:
    """The Invocation field of ``envelope`` in a ToFunction's InvocationBatchRequest (on the
    hot path: once per message waiting in a remote function's mailbox)."""
    caller = envelope.caller
    if caller is None:
        return ingress_invocation(envelope.value)
    sender = message_field(b"\x0a", encode_address(caller.typename, caller.id))
    return message_field(b"\x1a", sender + message_field(b"\x12", encode_typed(envelope.value)))


def ingress_invocation(typed: Any) -> bytes:
    """The Invocation field of a message with value ``typed`` from no caller."""
    encoded = encode_typed(typed)
    n = len(encoded)
    if n < 126:  # both lengths take one byte: one join (a chain of + copies once per part)
        return b"".join((b"\x1a", ONE_BYTE[n + 2], b"\x12", ONE_BYTE[n], encoded))
    return message_field(b"\x1a", message_field(b"\x12", encoded))


class IngressEncoding(NamedTuple):
    """How a run of one value type is encoded (``ingress_encoding``): ``encode``, and the
    tables it reads, for the compiled loop (``statefun/_hotloops.c``: ``mailbox_run``)."""

    typename: str  # the values' type
    #: by the value's length (1 to ``limit`` - 1): the Invocation's tag and length, the
    #: argument's, the TypedValue's head and the value's tag and length
    prefixes: list[bytes]
    limit: int
    encode: Callable[[Any], bytes]  # any value: its Invocation (the Python of the tables)


#: typename -> its IngressEncoding; bounded, as a value's type may come from outside (the HTTP
#: ingress's requests): past the bound an encoding is made per run, not kept
_encodings: dict[str, IngressEncoding] = {}


def ingress_encoding(typename: str) -> IngressEncoding:
    """``ingress_invocation`` for a run of values of ``typename`` (an ingress's records, encoded
    ahead in a busy address's mailbox: ``Dispatcher.offer_run``): everything before a value's
    bytes is made once per value length, and each value's Invocation is one concatenation.
    Any other value (another type, none, a long one) goes through ``ingress_invocation``; the
    bytes are the same either way."""
    known = _encodings.get(typename)
    if known is not None:
        return known
    head = encode_typed_value(typename, False, b"") + b"\x10\x01"  # typename, has_value
    size = len(head) + 2  # the TypedValue without its value's bytes
    limit = max(126 - size, 0)  # below it, both enclosing lengths take one byte
    prefixes = [b"\x1a%c\x12%c%s\x1a%c" % (size + n + 2, size + n, head, n) for n in range(limit)]

    def encode(typed: Any) -> bytes:
        if typed.typename == typename and typed.has_value:
            value: bytes = typed.value  # (or another buffer: the sum is bytes all the same)
            n = len(value)
            if 0 < n < limit:
                return prefixes[n] + value
        return ingress_invocation(typed)

    encoding = IngressEncoding(typename, prefixes, limit, encode)
    if len(_encodings) < 1_000:
        _encodings[typename] = encoding
    return encoding


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


def tls_context(transport: TransportSpec) -> ssl.SSLContext | None:
    """The TLS settings of an endpoint's transport (None: the system's trust store, no client
    certificate). ValueError or OSError naming the field and file that are wrong."""
    fields = {
        "trust_cacerts": transport.trust_cacerts,
        "client_cert": transport.client_cert,
        "client_key": transport.client_key,
        "client_key_password": transport.client_key_password,
    }
    if not any(fields.values()):
        return None
    for name, value in fields.items():
        if value and value.startswith("classpath:"):
            raise ValueError(
                f"transport.{name} {value!r}: classpath: names only mean something inside "
                "StateFun's JVM; give a file path"
            )
    if bool(transport.client_cert) != bool(transport.client_key):
        raise ValueError("transport.client_cert and transport.client_key go together")
    try:
        context = ssl.create_default_context(cafile=transport.trust_cacerts)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"transport.trust_cacerts {transport.trust_cacerts!r}: {exc}") from None
    if transport.client_cert and transport.client_key:
        password = None
        if transport.client_key_password:
            password = Path(transport.client_key_password).read_text(encoding="utf-8").strip()
        try:
            context.load_cert_chain(transport.client_cert, transport.client_key, password)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"transport.client_cert {transport.client_cert!r} / client_key "
                f"{transport.client_key!r}: {exc}"
            ) from None
    return context


class _Plan(NamedTuple):
    """How calls to one URL go: its target and the transport's figures, in seconds."""

    transport: TransportSpec
    target: Target
    call: float
    connect: float
    read: float
    max_response_bytes: int
    origin: str  # what failures are reported per ("http://host:port")
    stats: EndpointStats  # the origin's counts (shared by the plans of its URLs)


def _origin_text(target: Target) -> str:
    scheme, host, port = target.origin
    return f"{scheme}://{port}" if isinstance(port, str) else f"{scheme}://{host}:{port}"


class _Trouble:
    """The failed attempts of one endpoint (origin): what is reported and when."""

    __slots__ = ("failing", "last_error", "last_line", "since", "total", "unreported")

    def __init__(self) -> None:
        self.failing = False  # no attempt succeeded since the last failure
        self.since = 0.0  # when the current run of failures began
        self.total = 0  # failed attempts in the current run
        self.unreported = 0  # failed attempts since the last line
        self.last_line = float("-inf")
        self.last_error = ""


class RemoteClient:
    """The pooled HTTP client for every remote function of the runtime (see ``_http``)."""

    def __init__(
        self,
        max_connections: int = 256,
        initial_backoff_ms: int = 50,
        max_backoff_ms: int = 5_000,
        max_response_bytes: int = 64 << 20,
        log_interval_s: float = 10.0,
    ) -> None:
        self._max_connections = max_connections
        self._log_interval = log_interval_s
        #: per origin, its failed attempts; ``_failing`` holds the origins failing now (read
        #: on every successful call: empty while all is well)
        self._trouble: dict[str, _Trouble] = {}
        self._failing: set[str] = set()
        #: failed attempts that were retried, in all (a count for benchmarks and tests)
        self.retried_attempts = 0
        self._initial_backoff = initial_backoff_ms / 1000.0
        self._max_backoff = max_backoff_ms / 1000.0
        self._max_response_bytes = max_response_bytes
        self._pool: HttpPool | None = None
        self._plans: dict[tuple[str, int], _Plan] = {}
        #: per endpoint (the origin of its URLs): calls, errors, retries, latency
        self.endpoints: dict[str, EndpointStats] = {}

    async def start(self) -> None:
        if self._pool is None:
            self._pool = HttpPool(self._max_connections, self._max_response_bytes)

    @property
    def open_connections(self) -> int:
        """Connections open to remote functions now (all endpoints: the pool is shared)."""
        return 0 if self._pool is None else self._pool.open_connections

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _plan(self, url: str, transport: TransportSpec, typename: str) -> _Plan:
        # Keyed by the transport's identity: hashing the spec (a frozen dataclass of a dozen
        # fields) on every call would cost more than the lookup saves. The plan holds the
        # transport, so its id stays its own; endpoints that share a URL keep a plan each.
        plan = self._plans.get((url, id(transport)))
        if plan is not None and plan.transport is transport:
            return plan
        try:
            context = tls_context(transport) if url.lower().startswith("https") else None
            target = parse_target(
                url, context, transport.pool_ttl.total_seconds(), transport.headers
            )
        except (ValueError, OSError, ssl.SSLError) as exc:
            raise TerminalFunctionError(f"function {typename}: {exc}") from None
        origin = _origin_text(target)
        stats = self.endpoints.get(origin)
        if stats is None:
            stats = self.endpoints[origin] = EndpointStats()
        plan = self._plans[(url, id(transport))] = _Plan(
            transport,
            target,
            transport.call.total_seconds(),
            transport.connect.total_seconds(),
            transport.read.total_seconds(),
            min(self._max_response_bytes, transport.payload_max_bytes),
            origin,
            stats,
        )
        return plan

    def _failed(self, origin: str, typename: str, problem: str, pause: float) -> None:
        """An attempt to ``origin`` failed and is retried: a line now and then, with counts."""
        self.retried_attempts += 1
        self.endpoints[origin].retries += 1
        trouble = self._trouble.get(origin)
        if trouble is None:
            trouble = self._trouble[origin] = _Trouble()
        now = time.monotonic()
        if not trouble.failing:
            trouble.failing, trouble.since, trouble.total = True, now, 0
            self._failing.add(origin)
        trouble.total += 1
        trouble.unreported += 1
        trouble.last_error = problem
        if now - trouble.last_line < self._log_interval:
            return
        if trouble.total == 1:
            log.warning(
                "endpoint %s: call to %s failed: %s; retrying in %.0f ms (further failures "
                "of this endpoint are counted, one line per %.0f s)",
                origin,
                typename,
                problem,
                pause * 1000,
                self._log_interval,
            )
        else:
            log.warning(
                "endpoint %s: %d call attempt(s) failed in the last %.1f s (%d since it "
                "began failing %.1f s ago), retrying; last error: %s",
                origin,
                trouble.unreported,
                min(now - trouble.last_line, now - trouble.since),
                trouble.total,
                now - trouble.since,
                problem,
            )
        trouble.last_line, trouble.unreported = now, 0

    def _answered(self, origin: str) -> None:
        """A call to ``origin`` succeeded: the end of its run of failures."""
        self._failing.discard(origin)
        trouble = self._trouble.get(origin)
        if trouble is None or not trouble.failing:
            return
        trouble.failing = False
        now = time.monotonic()
        # one line per run of failures that was reported (not for a lone failure between two
        # lines, which the next line counts)
        if trouble.unreported < trouble.total:
            log.info(
                "endpoint %s answers again (%d call attempt(s) failed since its first "
                "failure %.1f s ago)",
                origin,
                trouble.total,
                now - trouble.since,
            )
            trouble.unreported = 0
            trouble.last_line = now

    def trouble(self, url: str) -> str | None:
        """What the failures of the endpoint of ``url`` are, while it fails (None: it does
        not, as far as the calls so far tell)."""
        for (planned, _), plan in self._plans.items():
            if planned == url:
                trouble = self._trouble.get(plan.origin)
                if trouble is None or not trouble.failing:
                    return None
                return (
                    f"{trouble.total} call attempt(s) to {plan.origin} failed in the last "
                    f"{time.monotonic() - trouble.since:.1f} s, last: {trouble.last_error}"
                )
        return None

    async def call(
        self,
        url: str,
        body: bytes,
        transport: TransportSpec,
        typename: str,
        before_wait: Callable[[], None] | None = None,
    ) -> bytes:
        """POST ``body`` to ``url``; the response body. Retries until the call timeout.

        ``before_wait`` (if given) is called once the request is written, or before the call
        first waits for anything else (a connection, the pool, a retry), or as it fails: the
        dispatcher sends the outputs of an address's previous batch then. It may be called
        more than once and must act once.
        """
        if self._pool is None:
            if before_wait is not None:
                before_wait()
            await self.start()
        pool = self._pool
        assert pool is not None
        plan = self._plan(url, transport, typename)
        target, call_timeout, connect, read, limit = plan[1:6]
        deadline = time.monotonic() + call_timeout
        backoff = self._initial_backoff
        attempt = 0
        problem = ""
        stats = plan.stats
        stats.calls += 1
        stats.in_flight += 1
        began = time.monotonic()
        try:
            while True:
                attempt += 1
                # the pool bounds the connect time by this too
                timeout = call_timeout if attempt == 1 else max(0.001, deadline - time.monotonic())
                try:
                    try:
                        response = await pool.post(
                            target, body, connect, read, timeout, limit, before_wait
                        )
                    finally:
                        if before_wait is not None:
                            before_wait()  # (if the pool did not: it failed before waiting)
                            before_wait = None
                    if response.status == 200:
                        if self._failing:
                            self._answered(plan.origin)
                        stats.latency.observe(time.monotonic() - began)
                        return response.body
                    reason = response.body[:200].decode("utf-8", "replace").strip()
                    problem = f"HTTP {response.status} from {url}: {reason or response.reason}"
                    if response.status in (404, 410) or _NO_SUCH_FUNCTION.search(reason):
                        # no such function there: the sender's problem, not the job's
                        raise FunctionNotFoundError(f"function {typename}: {problem}")
                    if _INVALID_VALUE.search(reason):  # a message's value fails its own type
                        raise MessageValueError(f"function {typename}: {problem}")
                    if 400 <= response.status < 500 and response.status not in (408, 429):
                        raise TerminalFunctionError(f"function {typename}: {problem}")
                except ResponseTooLarge as exc:
                    raise TerminalFunctionError(
                        f"function {typename} at {url} answered with {exc}"
                    ) from None
                except (TimeoutError, HttpProtocolError, OSError) as exc:
                    # A last attempt cut short by the call timeout says less than the one before.
                    cut_short = isinstance(exc, TimeoutError) and time.monotonic() >= deadline
                    if not (cut_short and problem):
                        problem = f"{type(exc).__name__} calling {url}: {exc}"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RetryableFunctionError(
                        f"function {typename} did not answer within its call timeout of "
                        f"{transport.call} ({attempt} attempts); last error: {problem}"
                    )
                pause = min(backoff, remaining) * (0.5 + random.random() / 2)
                self._failed(plan.origin, typename, problem, pause)
                await asyncio.sleep(pause)
                backoff = min(backoff * 2, self._max_backoff)
        except asyncio.CancelledError:
            raise
        except BaseException:
            stats.errors += 1
            raise
        finally:
            stats.in_flight -= 1
