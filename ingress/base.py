"""The ingress (source) interface.

A source reads records from outside and submits them as messages to function addresses.
``submit`` waits while the runtime is full (backpressure), so a source never outruns the
dispatchers.

Replayable sources take part in checkpoints. A checkpoint is taken between two event-loop
steps, so a source's position must move in the same step as the message it describes enters
the runtime: ``await context.room()``, then ``context.emit(...)`` and the position update
with no ``await`` in between. ``snapshot_position`` is called at the cut; after a restart
``restore_position`` gets it back before ``run``; ``notify_checkpoint_complete`` says that
a checkpoint holding some position is durable (commit offsets, trim a write-ahead log).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, Protocol

from statefun.sdk._spec import SdkAddress

__all__ = ["IngressContext", "Source"]


class IngressContext(Protocol):
    """What the runtime offers a source."""

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        """Send a typed value to the address (typename, id_); waits while the runtime is full."""
        ...

    async def room(self) -> None:
        """Wait until the runtime accepts messages."""
        ...

    def has_room(self) -> bool:
        """Whether the runtime accepts messages now (then ``room()`` would not wait)."""
        ...

    def emit(self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None) -> None:
        """Send now, without waiting (call right after ``room()`` or ``has_room()`` said so, in
        the same loop step)."""
        ...

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        """Send ``messages[start:]``, ``(id, value)`` pairs, to ``typename`` in order, each as
        ``emit`` would, while ``has_room()``: the index of the first one not sent
        (``len(messages)`` once all are)."""
        ...

    def is_function_type(self, typename: str) -> bool:
        """Whether some endpoint of the module serves ``typename``."""
        ...

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        """A record that cannot become a message goes to the runtime's dead letters: ``fields``
        say what it was and why (``reason``; ``target`` and ``id`` when known, so that it can
        be replayed), ``value`` is a typed value (``typename``, ``value`` bytes)."""
        ...


class Source(abc.ABC):
    """An ingress. ``run`` returns when a bounded source is exhausted."""

    #: A bounded source ends (a file); an unbounded one runs until the job stops (HTTP, Kafka).
    bounded: bool = False

    def __init__(self, ingress_id: str) -> None:
        self.ingress_id = ingress_id

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Bind sockets, open files: fail here, before the job runs, if that is impossible."""

    @abc.abstractmethod
    async def run(self, context: IngressContext) -> None:
        """Read records and submit them until exhausted or cancelled."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

    # -- checkpoints -------------------------------------------------------------------------

    def snapshot_position(self) -> Any:
        """The position to resume from (msgpack-able), taken at the checkpoint's cut."""
        return None

    async def restore_position(self, position: Any) -> None:  # noqa: B027 - optional hook
        """Resume from ``position`` (from ``snapshot_position``); called before ``run``."""

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027
        """Checkpoint ``checkpoint_id`` is durable."""

    def describe(self) -> str:
        return f"{type(self).__name__}({self.ingress_id})"
