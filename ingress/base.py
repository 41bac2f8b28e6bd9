"""The ingress (source) interface.

A source reads records from outside and submits them as messages to function addresses.
``submit`` waits while the runtime is full (backpressure), so a source never outruns the
dispatchers. Replayable sources will also report and restore their position for checkpoints.
"""

from __future__ import annotations

import abc
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

    def is_function_type(self, typename: str) -> bool:
        """Whether some endpoint of the module serves ``typename``."""
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

    def describe(self) -> str:
        return f"{type(self).__name__}({self.ingress_id})"
