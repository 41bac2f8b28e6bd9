"""``io.pystatefun.http.v1/ingress``: messages to function addresses over HTTP.

* ``POST /messages/{namespace}/{type}/{id}`` sends the body to the address: 202 Accepted.
* ``POST /call/{namespace}/{type}/{id}`` sends it and waits for the function's reply: the
  message's caller is ``pystatefun.http/reply:<request id>``, and whatever the function sends
  to its caller (``context.send(message_builder(context.caller.typename, context.caller.id,
  ...))``) is the response body, typed by the ``X-Statefun-Typename`` header. 504 after the
  reply timeout.
* ``GET /health``.

The value's type: a ``typename`` query parameter or an ``X-Statefun-Typename`` header names
it and the body is its encoded bytes - except that a ``text/plain`` body for a built-in type
is parsed from text (``42``, ``true``). Without a typename a ``text/plain`` body is a
io.statefun.types/string. Everything else is a 4xx with a one-line reason.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from statefun.ingress._records import BUILTIN_TYPES, RecordError, typed_value_from_text
from statefun.ingress._wal import WriteAheadLog
from statefun.ingress.base import IngressContext, Source
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import StringType, TypedValue, validate_typename

__all__ = ["HttpSource"]

log = logging.getLogger(__name__)

REPLY_NAMESPACE, REPLY_NAME = "pystatefun.http", "reply"
TYPENAME_HEADER = "X-Statefun-Typename"


def _plain(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


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
    ) -> None:
        super().__init__(ingress_id)
        self.wal = WriteAheadLog(wal_dir) if wal_dir is not None else None
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
        self._context: IngressContext | None = None
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count()
        self._prefix = os.urandom(4).hex()
        self._waiting = 0
        self.accepted = 0

    async def start(self) -> None:
        if self.wal is not None:
            await asyncio.to_thread(self.wal.open)
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/messages/{namespace}/{type}/{id}", self._send)
        app.router.add_post("/call/{namespace}/{type}/{id}", self._call)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0 and self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        log.info("ingress %s listening on http://%s:%d", self.ingress_id, self.host, self.port)

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
                future.set_exception(web.HTTPServiceUnavailable(text="the job is stopping"))
        self._group.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.wal is not None:
            self.wal.close()

    # -- durability: the write-ahead log -------------------------------------------------------

    def snapshot_position(self) -> Any:
        self._checkpointed = self.position
        return {"seq": self.position}

    async def restore_position(self, position: Any) -> None:
        self.position = int(position["seq"])

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.wal is not None:
            await asyncio.to_thread(self.wal.trim, self._checkpointed)

    async def _replay(self, context: IngressContext) -> None:
        assert self.wal is not None
        wal = self.wal
        records = await asyncio.to_thread(lambda: list(wal.read_after(self.position)))
        if records:
            log.info(
                "ingress %s: replaying %d message(s) from its WAL", self.ingress_id, len(records)
            )
        for seq, typename, id_, caller, v_typename, has_value, value in records:
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
                typename, id_, caller, v_typename, has_value, value = record
                context.emit(
                    typename,
                    id_,
                    TypedValue(v_typename, value if has_value else None),
                    _caller(caller),
                )
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
    ) -> None:
        """Hand a message to the runtime: durably first when there is a WAL."""
        context = await self._admit()
        self._waiting += 1
        try:
            if self.wal is None or not durable:
                await context.submit(typename, id_, value, caller)
                return
            record = [
                typename,
                id_,
                None if caller is None else [caller.namespace, caller.name, caller.id],
                value.typename,
                value.has_value,
                value.value,
            ]
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._group.append((record, future))
            self._group_ready.set()
            await future
        finally:
            self._waiting -= 1

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- handlers -------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "ingress": self.ingress_id})

    async def _parse(self, request: web.Request) -> tuple[str, str, TypedValue]:
        namespace, name, id_ = (request.match_info[k] for k in ("namespace", "type", "id"))
        typename = f"{namespace}/{name}"
        try:
            validate_typename(typename, "function type")
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        context = self._context
        if context is None:
            raise web.HTTPServiceUnavailable(text="the job is not running yet")
        if not context.is_function_type(typename):
            raise web.HTTPNotFound(text=f"no function type {typename!r} in the module")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(
                max_size=self.max_body_bytes, actual_size=request.content_length
            )
        body = await request.read()
        value_typename = request.query.get("typename") or request.headers.get(TYPENAME_HEADER)
        plain = request.content_type == "text/plain"
        try:
            if value_typename:
                validate_typename(value_typename, "typename")
                if plain and value_typename in BUILTIN_TYPES:
                    value = typed_value_from_text(body.decode("utf-8"), value_typename)
                else:
                    value = TypedValue(value_typename, body)
            elif plain:
                text = body.decode("utf-8")
                value = TypedValue(StringType.typename, StringType.serializer().serialize(text))
            else:
                raise web.HTTPUnsupportedMediaType(
                    text="say the value's type: a 'typename' query parameter or an "
                    f"{TYPENAME_HEADER} header (or send text/plain for a string)"
                )
        except (RecordError, ValueError) as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        return typename, id_, value

    async def _admit(self) -> IngressContext:
        if self._waiting >= self.max_pending:
            raise web.HTTPServiceUnavailable(text="too many requests waiting; try again later")
        assert self._context is not None
        return self._context

    async def _send(self, request: web.Request) -> web.Response:
        typename, id_, value = await self._parse(request)
        await self._deliver(typename, id_, value, None)
        self.accepted += 1
        return _plain(202, "accepted")

    async def _call(self, request: web.Request) -> web.Response:
        typename, id_, value = await self._parse(request)
        request_id = f"{self._prefix}-{next(self._ids)}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.replies[request_id] = future
        try:
            caller = SdkAddress(
                REPLY_NAMESPACE, REPLY_NAME, request_id, f"{REPLY_NAMESPACE}/{REPLY_NAME}"
            )
            await self._deliver(typename, id_, value, caller, durable=self.log_calls)
            self.accepted += 1
            try:
                reply = await asyncio.wait_for(future, self.reply_timeout_s)
            except TimeoutError:
                return _plain(504, f"no reply from {typename}/{id_} within {self.reply_timeout_s}s")
        finally:
            self.replies.pop(request_id, None)
        return _reply_response(reply)


def _caller(fields: list[str] | None) -> SdkAddress | None:
    if fields is None:
        return None
    namespace, name, id_ = fields
    return SdkAddress(namespace, name, id_, f"{namespace}/{name}")


def _reply_response(reply: Any) -> web.Response:
    typename = str(reply.typename)
    body = bytes(reply.value) if reply.has_value else b""
    headers = {TYPENAME_HEADER: typename}
    builtin = BUILTIN_TYPES.get(typename)
    if builtin is not None and reply.has_value:
        value = builtin.serializer().deserialize(body)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return web.Response(status=200, text=text, content_type="text/plain", headers=headers)
    return web.Response(
        status=200, body=body, content_type="application/octet-stream", headers=headers
    )
