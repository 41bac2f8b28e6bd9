"""The ``IngressContext`` one source is given: the job's, counting that source's records and
the time it waits for room (backpressure): it is that source's ``IngressStats``.

Each method does what the job's does with the count added inline (``emit`` builds the
envelope and routes it itself, as the router's ``emit`` would: no extra call per record).
There is no ``__getattr__`` passing other names on to the job: a class with one makes every
attribute lookup on its instances slower, on the path of every record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from statefun.runtime._envelope import Envelope
from statefun.runtime._stats import IngressStats

if TYPE_CHECKING:
    from statefun.runtime._router import Router
    from statefun.sdk._spec import SdkAddress

__all__ = ["IngressJob", "IngressPort"]

_new_object = object.__new__


class IngressJob(Protocol):
    """What a source's context takes from the job besides routing."""

    def is_function_type(self, typename: str) -> bool: ...
    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None: ...


class IngressPort(IngressStats):
    """The job as one source sees it, and that source's counts."""

    __slots__ = ("_emit_many", "_room", "_send", "dead_letter_record", "is_function_type")

    def __init__(self, job: IngressJob, router: Router) -> None:
        super().__init__()
        self._send = router.send
        self._emit_many = router.emit_many
        self._room = router.room
        self.is_function_type = job.is_function_type
        self.dead_letter_record = job.dead_letter_record

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        if not self._room.open:
            await self.room()
        self.records += 1
        # Envelope(typename, id_, value, caller) without the call of its __init__
        envelope = _new_object(Envelope)
        envelope.typename = typename
        envelope.id = id_
        envelope.value = value
        envelope.caller = caller
        envelope.wire = None
        self._send(envelope)

    async def room(self) -> None:
        room = self._room
        if room.is_set():
            return
        began = time.monotonic()
        try:
            while not room.is_set():
                await room.wait()
        finally:
            self.blocked_seconds += time.monotonic() - began

    def has_room(self) -> bool:
        return self._room.open

    def emit(self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None) -> None:
        self.records += 1
        self._send(Envelope(typename, id_, value, caller))

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        sent = self._emit_many(typename, messages, start)
        self.records += sent - start
        return sent
