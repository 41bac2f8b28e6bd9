"""Why a request-reply call over the HTTP ingress got no reply in time.

A /call's message has the caller ``pystatefun.http/reply:<request id>``. When its reply
timeout passes, the ingress asks ``UnansweredCalls.describe``, which looks for the message
inside the runtime (nothing is recorded on the hot path):

* still in a dispatcher's inbox or an address's mailbox: the function was not invoked with
  it yet; in a batch in flight: the function has not answered that batch yet (with the
  endpoint's recent failures, from the remote client);
* its reply produced but held until a checkpoint completes (``reply_release=on-checkpoint``);
* gone: the function was invoked with it and sent nothing to its caller.

Where each waiting call's message is comes from one pass over the messages inside the
runtime, kept for a short while, so that many calls timing out together cost one pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from statefun.runtime._functions import RemoteFunction

__all__ = ["UnansweredCalls"]

_FRESH_S = 0.5


class _Dispatcher(Protocol):
    def callers_waiting(self, reply_typename: str) -> dict[str, str]: ...


class _Client(Protocol):
    def trouble(self, url: str) -> Any: ...


class _Functions(Protocol):
    def resolve(self, typename: str) -> Any: ...


class UnansweredJob(Protocol):
    """What the explanation reads of the job."""

    @property
    def dispatchers(self) -> Sequence[_Dispatcher]: ...

    @property
    def functions(self) -> _Functions: ...

    @property
    def client(self) -> _Client: ...

    def held_replies(self) -> Iterable[tuple[str, Any]]: ...


class UnansweredCalls:
    """Explains, per request id, why a /call has no reply (see the module docstring)."""

    def __init__(self, job: UnansweredJob, reply_typename: str) -> None:
        self._job = job
        self._reply_typename = reply_typename
        self._where: dict[str, str] = {}
        self._held: set[str] = set()
        self._taken = float("-inf")

    def _look(self) -> None:
        now = time.monotonic()
        if now - self._taken < _FRESH_S:
            return
        self._taken = now
        self._where = {}
        for dispatcher in self._job.dispatchers:
            self._where.update(dispatcher.callers_waiting(self._reply_typename))
        self._held = {request_id for request_id, _ in self._job.held_replies()}

    def describe(self, request_id: str, typename: str) -> str:
        """Why the call ``request_id`` to a function of ``typename`` has no reply yet."""
        self._look()
        if request_id in self._held:
            return (
                "the function replied; the reply waits for the next checkpoint to complete "
                "(reply_release=on-checkpoint)"
            )
        where = self._where.get(request_id)
        if where is None:
            return (
                "the function was invoked with the message and sent no message to its caller "
                "(does it reply with context.send to context.caller?)"
            )
        if where != "in-flight":
            return (
                "the message is still waiting: the function was not invoked with it yet "
                f"(it waits in {where})"
            )
        function = self._job.functions.resolve(typename)
        if isinstance(function, RemoteFunction):
            trouble = self._job.client.trouble(function.url)
            if trouble is not None:
                return (
                    "the message is still waiting: its function's endpoint has not answered "
                    f"the batch that holds it ({trouble}; is its endpoint up?)"
                )
            return (
                "the message is still waiting: the function was called with it and has not "
                f"answered yet (a slow function? {function.url})"
            )
        return "the message is still waiting: the function is still running with it"
