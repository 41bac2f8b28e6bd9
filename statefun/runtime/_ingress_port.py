"""The ``IngressContext`` one source is given: the job's, counting that source's records and
the time it waits for room (backpressure): it is that source's ``IngressStats``.

Each method does what the job's does with the count added inline (``emit`` builds the
envelope and routes it itself, as the router's ``emit`` would: no extra call per record).
Anything else a source asks of its context is the job's (``__getattr__``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from statefun.runtime._envelope import Envelope
from statefun.runtime._stats import IngressStats

if TYPE_CHECKING:
    from statefun.runtime._router import Router
    from statefun.sdk._spec import SdkAddress

__all__ = ["IngressPort"]


class IngressPort(IngressStats):
    """The job as one source sees it, and that source's counts."""

    __slots__ = ("_emit_many", "_job", "_room", "_send")

    def __init__(self, job: object, router: Router) -> None:
        super().__init__()
        self._job = job
        self._send = router.send
        self._emit_many = router.emit_many
        self._room = router.room

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        if not self._room.is_set():
            await self.room()
        self.records += 1
        self._send(Envelope(typename, id_, value, caller))

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
        return self._room.is_set()

    def emit(self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None) -> None:
        self.records += 1
        self._send(Envelope(typename, id_, value, caller))

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        sent = self._emit_many(typename, messages, start)
        self.records += sent - start
        return sent
