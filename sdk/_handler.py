"""The request-reply protocol handler: bytes in, bytes out, no I/O.

``RequestReplyHandler(functions).handle_async(request)`` decodes a ToFunction, resolves the
state of the target address, runs the batch through the function in order, and returns the
encoded FromFunction. It is what an HTTP server (see ``serve``) wraps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from google.protobuf.message import DecodeError

from statefun._exceptions import MalformedRequestError
from statefun.sdk._context import InvocationContext
from statefun.sdk._functions import StatefulFunction, StatefulFunctions
from statefun.sdk._messages import Message
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._spec import SdkAddress
from statefun.sdk._storage import storage_mutations
from statefun.sdk._wire import encode_incomplete_context, encode_invocation_response

__all__ = ["RequestReplyHandler"]

_FromString = pb.ToFunction.FromString
#: makes a Message without a call of its ``__init__`` (a Python frame per invocation); the
#: target is checked once per batch in ``_prepare`` and upb never gives a None argument
_new_message = object.__new__


class _Batch:
    """A decoded batch, ready to run."""

    __slots__ = ("context", "fun", "id", "invocations", "is_async", "typename")

    def __init__(
        self,
        function: StatefulFunction,
        address: SdkAddress,
        context: InvocationContext,
        invocations: Any,
    ) -> None:
        self.fun = function.fun
        self.is_async = function.is_async
        self.typename = address.typename
        self.id = address.id
        self.context = context
        self.invocations = invocations


class RequestReplyHandler:
    """Serves the functions of a StatefulFunctions over StateFun's request-reply protocol v3."""

    __slots__ = ("functions",)

    def __init__(self, functions: StatefulFunctions) -> None:
        if functions is None:
            raise ValueError("functions must be provided")
        if not isinstance(functions, StatefulFunctions):
            raise TypeError(f"expected a StatefulFunctions, got {type(functions).__name__}")
        self.functions = functions

    def handle_sync(self, request_bytes: bytes | bytearray | memoryview) -> bytes:
        """Handle one request. Async functions are run to completion in a new event loop."""
        outcome = self.begin(request_bytes)
        return outcome if isinstance(outcome, bytes) else asyncio.run(outcome)

    async def handle_async(self, request_bytes: bytes | bytearray | memoryview) -> bytes:
        """Handle one request inside the running event loop."""
        outcome = self.begin(request_bytes)
        return outcome if isinstance(outcome, bytes) else await outcome

    def begin(
        self, request_bytes: bytes | bytearray | memoryview
    ) -> bytes | Coroutine[Any, Any, bytes]:
        """The reply at once when the target function is a ``def``; a coroutine to await when
        it is an ``async def``. For servers that run sync functions without a task each."""
        batch = self._prepare(request_bytes)
        if isinstance(batch, bytes):
            return batch
        if batch.is_async:
            return _run_async(batch)
        return _run_sync(batch)

    # -- the three steps -------------------------------------------------------------------

    def _prepare(self, request_bytes: bytes | bytearray | memoryview) -> _Batch | bytes:
        try:
            request = _FromString(bytes(request_bytes))
        except (DecodeError, TypeError) as exc:
            raise MalformedRequestError(f"the body is not a ToFunction message: {exc}") from None
        if not request.HasField("invocation"):
            raise MalformedRequestError("the ToFunction message holds no invocation batch")
        batch = request.invocation
        target = batch.target
        namespace, name, id_ = target.namespace, target.type, target.id
        if not namespace or not name:
            raise MalformedRequestError("the invocation batch has no target function type")
        typename = f"{namespace}/{name}"
        if not id_:
            raise MalformedRequestError(f"the invocation batch to {typename!r} has no id")
        function = self.functions.for_typename(typename)
        values: dict[str, Any] = {}
        for state in batch.state:  # a loop costs less than a comprehension's frame on 3.11
            values[state.state_name] = state.state_value
        for spec in function.specs:
            if spec.name not in values:
                return encode_incomplete_context(
                    [s for s in function.specs if s.name not in values]
                )
        address = SdkAddress(namespace, name, id_, typename)
        storage = function.storage_class(typename, values, own=True)  # (values: this batch's)
        context = InvocationContext(address, storage)
        return _Batch(function, address, context, batch.invocations)


def _run_sync(batch: _Batch) -> bytes:
    context = batch.context
    fun = batch.fun
    typename, id_ = batch.typename, batch.id
    set_caller = context.set_caller_from_pb
    for invocation in batch.invocations:
        set_caller(invocation)
        message = _new_message(Message)  # the fields __init__ would check are checked
        message.target_typename = typename
        message.target_id = id_
        message.typed_value = invocation.argument
        fun(context, message)
    return _finish(context)


async def _run_async(batch: _Batch) -> bytes:
    context = batch.context
    fun = batch.fun
    typename, id_ = batch.typename, batch.id
    set_caller = context.set_caller_from_pb
    for invocation in batch.invocations:
        set_caller(invocation)
        message = _new_message(Message)  # the fields __init__ would check are checked
        message.target_typename = typename
        message.target_id = id_
        message.typed_value = invocation.argument
        await fun(context, message)
    return _finish(context)


def _finish(context: InvocationContext) -> bytes:
    return encode_invocation_response(
        storage_mutations(context.storage), context.messages, context.delayed, context.egress
    )
