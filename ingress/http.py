"""``io.pystatefun.http.v1/ingress``: messages to function addresses over HTTP.

* ``POST /messages/{namespace}/{type}/{id}`` sends the body to the address: 202 Accepted.
* ``POST /call/{namespace}/{type}/{id}`` sends it and waits for the function's reply: the
  message's caller is ``pystatefun.http/reply:<request id>``, and whatever the function sends
  to its caller (``context.send(message_builder(context.caller.typename, context.caller.id,
  ...))``) is the response body, typed by the ``X-Statefun-Typename`` header. 504 after the
  reply timeout, saying why when the runtime can tell (the message still waits for its
  function, or the function ran and sent nothing to its caller); 422 with the reason at once
  if the message goes to the dead letters.
* ``GET /health``.

The value's type: a ``typename`` query parameter or an ``X-Statefun-Typename`` header names
it and the body is its encoded bytes - except that a ``text/plain`` body for a built-in type
is parsed from text (``42``, ``true``). Without a typename a ``text/plain`` body is a
io.statefun.types/string. Everything else is a 4xx with a one-line reason.

A request with an ``Idempotency-Key`` header whose key was seen before gets the first
request's outcome instead of being processed again (``ingress/_idempotency.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from statefun._addresses import REPLY_NAME, REPLY_NAMESPACE
from statefun._exceptions import UnavailableError, UndeliverableError
from statefun._http.server import HttpServer, Reply, Request, ServerOptions, media_type, plain
from statefun._oserrors import listen_error
from statefun.ingress._idempotency import HEADER_KEY, IdempotentRequests
from statefun.ingress._keystore import Entry
from statefun.ingress._records import BUILTIN_TYPES, RecordError, typed_value_from_text
from statefun.ingress._wal import WriteAheadLog
from statefun.ingress.base import IngressContext, Source
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import StringType, TypedValue, validate_typename

__all__ = ["HttpSource", "RequestRefused", "call_reply", "unavailable"]

log = logging.getLogger(__name__)

TYPENAME_HEADER = "X-Statefun-Typename"
_TYPENAME_KEY = TYPENAME_HEADER.lower()  # as Request.headers has it
#: every 503 says when to send again: a refusal is for a moment (busy, starting, moving)
RETRY_AFTER = "Retry-After"
RETRY_AFTER_S = "1"


class RequestRefused(Exception):
    """A request answered with an error reply instead of a message."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.body.decode("utf-8", "replace").strip())
        self.reply = reply


_ROUTES = ("messages", "call")


class HttpSource(Source):
    """An HTTP server that turns requests into messages (unbounded)."""

    def __init__(
        self,
        ingress_id: str,
        host: str = "127.0.0.1",
        port: int = 8090,
        max_body_bytes: int = 1 << 20,
        reply_timeout_s: float = 30.0,
        max_pending: int = 10_000,
        replies: dict[str, asyncio.Future[Any]] | None = None,
        wal_dir: Path | None = None,
        log_calls: bool = True,
        wal_retained: int = 3,  # checkpoints_retained: the WAL keeps what the oldest needs
        held_replies: Callable[[], Sequence[tuple[str, Any]]] | None = None,
        idempotency_retention_s: float = 86_400.0,
        idempotency_max_keys: int = 1_000_000,
        idempotency_max_reply_bytes: int = 256 << 20,
        server_options: ServerOptions | None = None,
        unanswered: Callable[[str, str], str] | None = None,
        request_prefix: str | None = None,
    ) -> None:
        super().__init__(ingress_id)
        #: why a /call got no reply in time, from its request id and function type (the
        #: job's ``UnansweredCalls.describe``); said in the 504
        self.unanswered = unanswered
        #: the server's limits, Host allow-list, bearer token and TLS (``_http.defences``)
        self.server_options = server_options or ServerOptions()
        self.wal = WriteAheadLog(wal_dir, retained=wal_retained) if wal_dir is not None else None
        #: whether /call messages go through the WAL too. Not when replies are held until a
        #: checkpoint: the reply is then the acknowledgement, sent only once a checkpoint
        #: holds the message or its effects, and a call lost in a crash failed visibly.
        self.log_calls = log_calls
        self.position = 0  # sequence number of the last WAL record handed to the runtime
        self._checkpointed = 0
        self._group: list[tuple[list[Any], asyncio.Future[None]]] = []
        self._group_ready = asyncio.Event()
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.reply_timeout_s = reply_timeout_s
        self.max_pending = max_pending
        self.replies: dict[str, asyncio.Future[Any]] = {} if replies is None else replies
        #: Idempotency-Keys; kept next to the WAL (so across crashes) when there is one
        self.keys = IdempotentRequests(
            ingress_id,
            idempotency_retention_s,
            idempotency_max_keys,
            idempotency_max_reply_bytes,
            wal_dir,
            self.replies,
            held_replies,
        )
        self._context: IngressContext | None = None
        self._server: HttpServer | None = None
        self._ids = itertools.count()
        #: before ``-<n>`` in request ids (a clustered worker's names the process: the
        #: function's reply finds the connection's worker by it)
        self._prefix = request_prefix or os.urandom(4).hex()
        self._waiting = 0
        self.accepted = 0

    async def start(self) -> None:
        if self.wal is not None:
            wal, keys = self.wal, self.keys
            await asyncio.to_thread(wal.open)
            keyed, logged = await asyncio.to_thread(
                lambda: ([r for r in wal.read_after(0) if len(r) > 7], keys.read_log())
            )
            keys.load(logged, keyed, self.position)  # on the loop: restored calls' futures
        self._server = HttpServer(
            self, options=self.server_options, name=f"HTTP ingress {self.ingress_id}"
        )
        try:
            self.port = await self._server.start(self.host, self.port)
        except OSError as exc:
            raise UnavailableError(
                f"ingress {self.ingress_id}: {listen_error(self.host, self.port, exc)}"
            ) from exc
        log.info("ingress %s listening on %s", self.ingress_id, self.url)

    async def run(self, context: IngressContext) -> None:
        if self.wal is not None:
            await self._replay(context)
            self._context = context
            await self._write_groups(context)
        self._context = context
        await asyncio.Event().wait()  # requests arrive through the handlers

    async def close(self) -> None:
        # Requests still waiting for the WAL get a 503 first, so that stopping the server
        # does not wait for them.
        for _, future in self._group:
            if not future.done():
                future.set_exception(RequestRefused(unavailable("the job is stopping")))
        self._group.clear()
        if self._server is not None:
            await self._server.close(2.0)
            self._server = None
        if self.wal is not None:
            self.wal.close()
        self.keys.close()

    # -- durability: the write-ahead log -------------------------------------------------------

    def snapshot_position(self) -> Any:
        self._checkpointed = self.position
        keys = self.keys.snapshot()
        return {"seq": self.position} if keys is None else {"seq": self.position, "keys": keys}

    async def restore_position(self, position: Any) -> None:
        self.position = int(position["seq"])
        self.keys.restore(position.get("keys"))

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.wal is not None:
            wal, keys, covered = self.wal, self.keys, self._checkpointed
            records = keys.sealed_records()

            def write() -> None:  # keys first: trimmed segments may hold the only copy
                keys.write_log(records)
                wal.trim(covered)

            await asyncio.to_thread(write)

    async def _replay(self, context: IngressContext) -> None:
        assert self.wal is not None
        wal = self.wal
        records = await asyncio.to_thread(lambda: list(wal.read_after(self.position)))
        if records:
            log.info(
                "ingress %s: replaying %d message(s) from its WAL", self.ingress_id, len(records)
            )
        for seq, typename, id_, caller, v_typename, has_value, value, *_ in records:
            await context.room()
            context.emit(
                typename, id_, TypedValue(v_typename, value if has_value else None), _caller(caller)
            )
            self.position = seq

    async def _write_groups(self, context: IngressContext) -> None:
        """Group commit: append what arrived, fsync once, hand it to the runtime, ack."""
        assert self.wal is not None
        while True:
            await self._group_ready.wait()
            self._group_ready.clear()
            group, self._group = self._group, []
            if not group:
                continue
            last = await asyncio.to_thread(self.wal.append, [record for record, _ in group])
            await context.room()
            for record, _ in group:
                typename, id_, caller, v_typename, has_value, value, *key = record
                context.emit(
                    typename,
                    id_,
                    TypedValue(v_typename, value if has_value else None),
                    _caller(caller),
                )
                if key:
                    self.keys.emitted(key[0][0], None if caller is None else caller[2], key[0])
            self.position = last
            for _, future in group:
                if not future.done():
                    future.set_result(None)

    async def _deliver(
        self,
        typename: str,
        id_: str,
        value: TypedValue,
        caller: SdkAddress | None,
        durable: bool = True,
        key: Entry | None = None,
    ) -> None:
        """Hand a message to the runtime: durably first when there is a WAL."""
        context = self._admit()
        self._waiting += 1
        try:
            if self.wal is None or not durable:
                await context.submit(typename, id_, value, caller)
                if key is not None:  # in the loop step the message entered the runtime
                    self.keys.emitted(key.key, None if caller is None else caller.id)
                return
            record: list[Any] = [
                typename,
                id_,
                None if caller is None else [caller.namespace, caller.name, caller.id],
                value.typename,
                value.has_value,
                value.value,
            ]
            if key is not None:
                record.append(self.keys.wal_fields(key))
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._group.append((record, future))
            self._group_ready.set()
            await future
        finally:
            self._waiting -= 1

    @property
    def accepting(self) -> bool:
        """Requests are taken (the job runs); before that they get a 503 with Retry-After."""
        return self._context is not None

    @property
    def url(self) -> str:
        scheme = "https" if self.server_options.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    # -- requests (the built-in HTTP server's Application) ---------------------------------

    def too_large(self, length: int | None) -> Reply:
        size = f"{length} bytes" if length is not None else "the body"
        return plain(413, f"{size} is more than the limit of {self.max_body_bytes} bytes")

    def check(self, request: Request) -> Reply | None:
        """Refuse before the body: unknown paths and types, wrong methods, too large."""
        try:
            request.state = self._route(request)  # handle() takes it from there
        except RequestRefused as exc:
            return exc.reply
        return None  # the server refuses a body over max_body_bytes itself

    def _route(self, request: Request) -> tuple[str, str, str] | None:
        """(route, typename, id) of a message request; None for the health check."""
        path = request.path
        if path == "/health":
            if request.method not in ("GET", "HEAD"):
                raise RequestRefused(plain(405, "use GET on /health", (("Allow", "GET"),)))
            return None
        parts = path.split("/")
        if len(parts) != 5 or parts[0] or parts[1] not in _ROUTES or not all(parts[2:]):
            raise RequestRefused(
                plain(
                    404,
                    f"no such path {path!r}; POST to /messages/<namespace>/<type>/<id> "
                    "or /call/<namespace>/<type>/<id>",
                )
            )
        if request.method != "POST":
            raise RequestRefused(plain(405, f"use POST on {path}", (("Allow", "POST"),)))
        namespace, name, id_ = (unquote(part) for part in parts[2:])
        typename = f"{namespace}/{name}"
        context = self._context
        if context is None:
            raise RequestRefused(unavailable("the job is not running yet"))
        if not context.is_function_type(typename):
            try:  # not a type of the module; malformed (an encoded "/" in a part) or unknown
                validate_typename(typename, "function type")
            except ValueError as exc:
                raise RequestRefused(plain(400, str(exc))) from None
            raise RequestRefused(plain(404, f"no function type {typename!r} in the module"))
        return parts[1], typename, id_

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        route = request.state  # ``check`` parsed it and let the request through
        if route is None:
            health = json.dumps({"status": "ok", "ingress": self.ingress_id}).encode()
            return Reply(200, "application/json", health)
        kind, typename, id_ = route
        try:
            value = self._value(request, body)
        except RequestRefused as exc:
            return exc.reply
        idempotency_key = request.headers.get(HEADER_KEY)
        if idempotency_key is not None:
            return self._keyed(idempotency_key, kind, typename, id_, value)
        if kind == "messages":
            return self._send(typename, id_, value)
        return self._call(typename, id_, value)

    def _value(self, request: Request, body: bytes) -> TypedValue:
        query = parse_qs(request.query) if request.query else {}
        named = query.get("typename")
        value_typename = named[0] if named else request.headers.get(_TYPENAME_KEY)
        plain_text = media_type(request.content_type or "") == "text/plain"
        try:
            if value_typename:
                validate_typename(value_typename, "typename")
                if plain_text and value_typename in BUILTIN_TYPES:
                    return typed_value_from_text(body.decode("utf-8"), value_typename)
                return TypedValue(value_typename, body)
            if plain_text:
                text = body.decode("utf-8")
                return TypedValue(StringType.typename, StringType.serializer().serialize(text))
        except (RecordError, ValueError) as exc:
            raise RequestRefused(plain(400, str(exc))) from None
        raise RequestRefused(
            plain(
                415,
                "say the value's type: a 'typename' query parameter or an "
                f"{TYPENAME_HEADER} header (or send text/plain for a string)",
            )
        )

    def _admit(self) -> IngressContext:
        if self._waiting >= self.max_pending:
            raise RequestRefused(unavailable("too many requests waiting; try again later"))
        assert self._context is not None
        return self._context

    def _keyed(
        self, key: str, kind: str, typename: str, id_: str, value: TypedValue
    ) -> Coroutine[Any, Any, Reply]:
        """A request with an Idempotency-Key: processed once, its outcome answered again."""

        def run(entry: Entry) -> Coroutine[Any, Any, Reply]:
            if kind == "messages":
                return self._send(typename, id_, value, entry)
            return self._call(typename, id_, value, entry)

        unanswered = self.unanswered
        explain = (
            None if unanswered is None else lambda request_id: unanswered(request_id, typename)
        )
        return self.keys.answer(
            key, kind, typename, id_, value, run, call_reply, self.reply_timeout_s, explain
        )

    async def _send(
        self, typename: str, id_: str, value: TypedValue, key: Entry | None = None
    ) -> Reply:
        try:
            await self._deliver(typename, id_, value, None, key=key)
        except RequestRefused as exc:
            return exc.reply
        except UnavailableError as exc:  # the runtime could not keep it: not accepted
            return unavailable(str(exc))
        self.accepted += 1
        return plain(202, "accepted")

    async def _call(
        self, typename: str, id_: str, value: TypedValue, key: Entry | None = None
    ) -> Reply:
        request_id = f"{self._prefix}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + self.reply_timeout_s  # from the request, waits included
        self.replies[request_id] = future
        if key is not None:  # the reply is recorded for the key even if this caller leaves
            self.keys.calling(key, request_id, future)
        try:
            caller = SdkAddress(
                REPLY_NAMESPACE, REPLY_NAME, request_id, f"{REPLY_NAMESPACE}/{REPLY_NAME}"
            )
            await self._deliver(typename, id_, value, caller, durable=self.log_calls, key=key)
            self.accepted += 1
            try:
                left = max(0.0, deadline - loop.time())
                reply = await asyncio.wait_for(asyncio.shield(future), left)
            except TimeoutError:
                why = (
                    "" if self.unanswered is None else ": " + self.unanswered(request_id, typename)
                )
                return plain(
                    504, f"no reply from {typename}/{id_} within {self.reply_timeout_s:g} s{why}"
                )
            except UndeliverableError as exc:  # the message went to the dead letters
                return plain(422, f"{typename}/{id_}: {exc}")
        except RequestRefused as exc:
            return exc.reply
        except UnavailableError as exc:
            return unavailable(str(exc))
        finally:
            if key is None or not key.emitted:
                self.replies.pop(request_id, None)
        return call_reply(reply)


def unavailable(reason: str) -> Reply:
    """A 503: the request was not accepted and may be sent again (after ``Retry-After``)."""
    return plain(503, reason, ((RETRY_AFTER, RETRY_AFTER_S),))


def _caller(fields: list[str] | None) -> SdkAddress | None:
    if fields is None:
        return None
    namespace, name, id_ = fields
    return SdkAddress(namespace, name, id_, f"{namespace}/{name}")


def call_reply(reply: Any) -> Reply:
    """The HTTP answer of a /call from the function's reply (a typed value)."""
    typename = str(reply.typename)
    body = bytes(reply.value) if reply.has_value else b""
    headers = ((TYPENAME_HEADER, typename),)
    builtin = BUILTIN_TYPES.get(typename)
    if builtin is not None and reply.has_value:
        try:
            value = builtin.serializer().deserialize(body)
        except Exception:  # not a value of its type: the caller gets the bytes as they are
            return Reply(200, "application/octet-stream", body, headers)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return Reply(200, "text/plain; charset=utf-8", text.encode("utf-8"), headers)
    return Reply(200, "application/octet-stream", body, headers)
