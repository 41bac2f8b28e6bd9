"""Functions called through StateFun's request-reply protocol, bytes in and bytes out: a
``RequestReplyHandler``'s ``handle_sync``, or a registry served by another Python over pipes
(``SdkProcess``, for functions written with Apache StateFun's own SDK, which cannot be imported
next to this package).

The request is the runtime's (``encode_to_function``: every registered state, absent ones
without a value), a reply of ``IncompleteInvocationContext`` registers the missing specs and
the request is sent again (at most 3 rounds), as the dispatcher does.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from statefun._exceptions import (
    FunctionFailedError,
    MalformedResponseError,
    StateWriteRejectedError,
    TerminalFunctionError,
)
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import StateSpec
from statefun.runtime._remote import decode_from_function, encode_to_function
from statefun.sdk._context import DelayedMessage
from statefun.sdk._messages import Message
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.sdk._types import TypedValue

__all__ = ["Effects", "SdkProcess", "call_remote"]

_MODIFY = pb.FromFunction.PersistedValueMutation.MODIFY
_MAX_SPEC_ROUNDS = 3
_HEADER = struct.Struct(">BI")  # status (0 ok, 1 error), length

RemoteCall = Callable[[bytes], bytes]


class Effects(NamedTuple):
    """What one invocation did: state written (None: deleted), messages, delayed messages and
    cancellations, egress records (egress id, typed value)."""

    mutations: list[tuple[str, Any]]
    messages: list[Message]
    delayed: list[DelayedMessage]
    egress: list[tuple[str, Any]]


def _full(target: Any) -> bool:
    return bool(target.namespace and target.type and target.id)


def _effects(typename: str, specs: dict[str, StateSpec], result: Any) -> Effects:
    """A FromFunction's invocation result, checked whole (as the dispatcher checks it)."""
    messages: list[Message] = []
    for out in result.outgoing_messages:
        if not _full(out.target):
            raise MalformedResponseError(
                f"function {typename} sent a message without a full target address"
            )
        messages.append(
            Message(f"{out.target.namespace}/{out.target.type}", out.target.id, out.argument)
        )
    delayed: list[DelayedMessage] = []
    for d in result.delayed_invocations:
        if d.is_cancellation_request:
            if not d.cancellation_token:
                raise MalformedResponseError(
                    f"function {typename} sent a cancellation without a token"
                )
            delayed.append(DelayedMessage(0, None, d.cancellation_token))
            continue
        if not _full(d.target):
            raise MalformedResponseError(
                f"function {typename} sent a delayed message without a full target address"
            )
        if d.delay_in_ms < 0:
            raise MalformedResponseError(f"function {typename} sent a negative delay")
        value = TypedValue(d.argument.typename, d.argument.value if d.argument.has_value else None)
        target = Message(f"{d.target.namespace}/{d.target.type}", d.target.id, value)
        delayed.append(DelayedMessage(d.delay_in_ms, target, d.cancellation_token))
    egress: list[tuple[str, Any]] = []
    for e in result.outgoing_egresses:
        if not e.egress_namespace or not e.egress_type:
            raise MalformedResponseError(f"function {typename} sent egress without an id")
        egress.append((f"{e.egress_namespace}/{e.egress_type}", e.argument))
    mutations: list[tuple[str, Any]] = []
    for mutation in result.state_mutations:
        name = mutation.state_name
        spec = specs.get(name)
        if spec is None:
            raise MalformedResponseError(
                f"function {typename} changed state {name!r}, which it never registered"
            )
        if mutation.mutation_type != _MODIFY:
            mutations.append((name, None))
            continue
        tv = mutation.state_value
        if tv.typename != spec.typename:
            raise StateWriteRejectedError(
                f"function {typename} wrote state {name!r} with type {tv.typename or '(none)'}, "
                f"but its spec says {spec.typename}"
            )
        mutations.append((name, TypedValue(tv.typename, tv.value if tv.has_value else None)))
    return Effects(mutations, messages, delayed, egress)


def call_remote(
    call: RemoteCall,
    envelope: Envelope,
    specs: dict[str, StateSpec],
    values: dict[str, Any],
) -> Effects:
    """Invoke ``envelope``'s address through ``call`` with the state ``values``; ``specs``
    gains the specs the function asks for."""
    typename, id_ = envelope.typename, envelope.id
    for _ in range(_MAX_SPEC_ROUNDS):
        states = [(name, spec.typename, values.get(name)) for name, spec in specs.items()]
        response = decode_from_function(
            call(encode_to_function(typename, id_, states, [envelope])), typename
        )
        if response.HasField("incomplete_invocation_context"):
            for missing in response.incomplete_invocation_context.missing_values:
                if not missing.state_name or not missing.type_typename:
                    raise MalformedResponseError(
                        f"function {typename} asked for a state without a name or type"
                    )
                expiration = missing.expiration_spec
                specs[missing.state_name] = StateSpec(
                    missing.state_name,
                    missing.type_typename,
                    int(expiration.mode),
                    int(expiration.expire_after_millis),
                )
            continue
        return _effects(typename, specs, response.invocation_result)
    raise TerminalFunctionError(
        f"function {typename} still reports missing state after {_MAX_SPEC_ROUNDS} rounds"
    )


# -- another Python serving a registry over pipes ---------------------------------------------

# Runs in the other Python: imports nothing of this package (there, ``statefun`` may be Apache
# StateFun's SDK). Frames both ways: status byte, 4-byte length, payload.
_CHILD = r"""
import importlib, importlib.util, json, os, struct, sys, traceback
# The working directory goes last: a checkout of this package there must not hide the SDK
# installed in this Python (both are named statefun).
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]
sys.path.append(os.getcwd())
target = sys.argv[1]
where, _, attr = target.rpartition(":")
if where.endswith(".py"):
    spec = importlib.util.spec_from_file_location("sdk_process_functions", where)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
else:
    module = importlib.import_module(where)
functions = getattr(module, attr)
from statefun import RequestReplyHandler
handler = RequestReplyHandler(functions)
listing = getattr(functions, "typenames", None)
names = list(listing()) if callable(listing) else list(getattr(functions, "_functions", {}))
stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # print() in a function must not break the frames
def send(status, payload):
    stdout.write(struct.pack(">BI", status, len(payload)) + payload)
    stdout.flush()
send(0, json.dumps(names).encode())
while True:
    head = stdin.read(4)
    if len(head) < 4:
        break
    request = stdin.read(struct.unpack(">I", head)[0])
    try:
        send(0, handler.handle_sync(request))
    except Exception as exc:
        send(1, "".join(traceback.format_exception_only(type(exc), exc)).strip().encode())
"""


class SdkProcess:
    """A ``StatefulFunctions`` served by another Python (a virtualenv with Apache StateFun's
    SDK, say), called bytes in, bytes out over pipes: no sockets.

    ``target`` names the registry as ``path/to/file.py:attribute`` or ``module:attribute``.
    Use as a context manager, or ``close()`` it. ``typenames`` lists its functions.
    """

    def __init__(
        self,
        python: str | os.PathLike[str],
        target: str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if ":" not in target:
            raise ValueError(
                f"target {target!r}: expected 'file.py:attribute' or 'module:attribute'"
            )
        self.target = target
        self.timeout = timeout
        self._process = subprocess.Popen(
            [str(python), "-c", _CHILD, target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(cwd) if cwd is not None else None,
        )
        try:
            _status, payload = self._read()
            self.typenames: list[str] = json.loads(payload)
        except Exception:
            self.close()
            raise

    def __call__(self, request: bytes) -> bytes:
        stdin = self._process.stdin
        assert stdin is not None
        stdin.write(struct.pack(">I", len(request)) + request)
        stdin.flush()
        status, payload = self._read()
        if status:
            raise FunctionFailedError(
                f"the handler of {self.target} raised {payload.decode(errors='replace')}"
            )
        return payload

    def _read_exactly(self, size: int) -> bytes:
        stdout = self._process.stdout
        assert stdout is not None
        data = b""
        while len(data) < size:
            ready, _, _ = select.select([stdout], [], [], self.timeout)
            if not ready:
                raise TimeoutError(f"{self.target} gave no answer within {self.timeout} s")
            chunk = os.read(stdout.fileno(), size - len(data))
            if not chunk:
                try:
                    code: int | None = self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                raise RuntimeError(
                    f"the process serving {self.target} ended (exit code {code}); its stderr "
                    "says why"
                )
            data += chunk
        return data

    def _read(self) -> tuple[int, bytes]:
        status, length = _HEADER.unpack(self._read_exactly(_HEADER.size))
        return status, self._read_exactly(length)

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> SdkProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
