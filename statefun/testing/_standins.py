"""In-memory stand-ins for a module's connectors, and remote functions called in-process.

An ingress stand-in is a log of records, like a Kafka topic: ``send`` appends, the job's
source reads it from its position (a checkpoint stores the position; after a crash the job's
new source goes on from the restored one, so input a checkpoint did not cover comes again).
The log outlives the job, as a topic outlives a consumer.

An egress stand-in is what a reader of the egress sees. Behind it, each job has a sink: an
exactly-once egress (Kafka ``exactly-once``, a file with ``exactly-once``) is transactional:
its records become visible when the checkpoint that sealed them completes, or at once when the
job takes no checkpoints (the runtime commits them at every flush), and a crash drops the
records no completed checkpoint sealed. Other egresses (stdout, Kafka ``at-least-once``) show
records when the job flushes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from statefun._exceptions import TerminalFunctionError
from statefun.connectors import ConnectorSpec
from statefun.egress.base import Sink
from statefun.ingress.base import IngressContext, Source
from statefun.module._specs import (
    FileEgressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    TransportSpec,
)
from statefun.runtime._remote import RemoteClient
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue
from statefun.testing._values import TypeTable

__all__ = ["EgressStandIn", "InProcessClient", "IngressStandIn"]

#: the messages one ingress record becomes: (target typename, id, value, caller)
Record = list[tuple[str, str, TypedValue, SdkAddress | None]]


class IngressStandIn:
    """The ingress ``spec.id`` of the module, in memory: ``send`` records to it."""

    def __init__(
        self, spec: ConnectorSpec, types: TypeTable, is_function_type: Callable[[str], bool]
    ) -> None:
        self.id = spec.id
        self._spec = spec
        self._types = types
        self._is_function_type = is_function_type
        #: every record sent, in order (the sources read it from their position)
        self.log: list[Record] = []
        self._waiting: set[asyncio.Event] = set()

    def send(
        self,
        key: str,
        value: Any,
        *,
        topic: str | None = None,
        target: str | None = None,
        typename: str | None = None,
        caller: SdkAddress | None = None,
    ) -> None:
        """Append one record. A Kafka ingress routes it as the module says: ``key`` is the id,
        ``topic`` (needed when the ingress reads several) gives the targets and the value's
        type (bytes are the record's value as they are; anything else is encoded as that type:
        built-in types by their serializer, others as JSON). Other ingresses (file, HTTP) take
        the ``target`` function type, ``key`` is the id, ``value`` as a file ingress record's
        (``typename`` optional). The job reads it on the next ``run_until_idle``/``advance``."""
        if not isinstance(key, str) or not key:
            raise ValueError(
                f"ingress {self.id}: the key (the function id) must be a non-empty str"
            )
        spec = self._spec
        if isinstance(spec, KafkaIngressSpec):
            topics = {t.topic: t for t in spec.topics}
            if topic is None:
                if len(topics) != 1:
                    raise ValueError(
                        f"ingress {self.id} reads topics {', '.join(topics)}: say which (topic=)"
                    )
                topic = next(iter(topics))
            chosen = topics.get(topic)
            if chosen is None:
                raise ValueError(
                    f"ingress {self.id} reads no topic {topic!r}; it reads: {', '.join(topics)}"
                )
            if target is not None:
                raise ValueError(f"ingress {self.id}: a Kafka topic's targets are in module.yaml")
            targets = list(chosen.targets)
            typed = self._types.encode(value, typename or chosen.value_type, None)
        else:
            if target is None:
                raise ValueError(
                    f"ingress {self.id}: say which function type the record is for "
                    "(target='namespace/type')"
                )
            targets = [target]
            typed = self._types.encode(value, typename, None)
        for name in targets:
            if not self._is_function_type(name):
                raise ValueError(f"ingress {self.id}: no endpoint of the module serves {name!r}")
        self.log.append([(name, key, typed, caller) for name in targets])
        for event in self._waiting:
            event.set()

    def source(self) -> Source:
        """A source reading this log, for one run of a job."""
        return _Source(self)

    def _wait(self, event: asyncio.Event) -> None:
        self._waiting.add(event)

    def _done(self, event: asyncio.Event) -> None:
        self._waiting.discard(event)

    def __repr__(self) -> str:
        return f"IngressStandIn({self.id!r}, {len(self.log)} record(s))"


class _Source(Source):
    """One job's reader of an ``IngressStandIn`` (unbounded: it waits for more)."""

    def __init__(self, log: IngressStandIn) -> None:
        super().__init__(log.id)
        self._log = log
        self.position = 0  # records emitted
        self._event: asyncio.Event | None = None

    async def run(self, context: IngressContext) -> None:
        records = self._log.log
        self._event = event = asyncio.Event()
        self._log._wait(event)
        try:
            while True:
                while self.position < len(records):
                    await context.room()
                    # the messages and the position move together (no await in between)
                    for typename, id_, value, caller in records[self.position]:
                        context.emit(typename, id_, value, caller)
                    self.position += 1
                event.clear()
                await event.wait()
        finally:
            self._log._done(event)

    def snapshot_position(self) -> Any:
        return {"records": self.position}

    async def restore_position(self, position: Any) -> None:
        self.position = int(position["records"])

    def describe(self) -> str:
        return f"IngressStandIn({self.ingress_id})"


class EgressStandIn:
    """The egress ``spec.id`` of the module, in memory: ``records`` are what a reader sees."""

    def __init__(self, spec: ConnectorSpec, types: TypeTable) -> None:
        self.id = spec.id
        self._types = types
        if isinstance(spec, KafkaEgressSpec):
            self.transactional = spec.delivery_semantic == "exactly-once"
        else:
            self.transactional = isinstance(spec, FileEgressSpec) and spec.exactly_once
        #: the typed values visible to readers, in order
        self.visible: list[Any] = []
        #: sealed transactions not committed yet, by checkpoint id
        self._sealed: dict[int, list[Any]] = {}

    @property
    def records(self) -> list[Any]:
        """What a reader of the egress sees, decoded (Kafka records as ``KafkaRecord``)."""
        return [self._types.decode(value) for value in self.visible]

    def clear(self) -> None:
        """Forget the records seen so far (the next ``records`` holds only newer ones)."""
        self.visible.clear()

    def sink(self) -> Sink:
        """A sink writing here, for one run of a job."""
        return _Sink(self)

    def _seal(self, checkpoint_id: int, values: list[Any]) -> None:
        self._sealed[checkpoint_id] = values

    def _commit(self, checkpoint_id: int) -> None:
        self.visible.extend(self._sealed.pop(checkpoint_id, ()))

    def _recover(self, checkpoint_id: int) -> None:
        """After a restart from checkpoint ``checkpoint_id``: its transaction commits (if it
        did not), the later ones, which no completed checkpoint sealed, are aborted."""
        self._commit(checkpoint_id)
        self._sealed.clear()

    def __repr__(self) -> str:
        return f"EgressStandIn({self.id!r}, {len(self.visible)} record(s))"


class _Sink(Sink):
    """One job's writer to an ``EgressStandIn``; once ``cut_off`` (the job crashed) it
    writes nothing any more."""

    def __init__(self, egress: EgressStandIn) -> None:
        super().__init__(egress.id)
        self._egress = egress
        self.transactional = egress.transactional
        self._buffer: list[Any] = []
        self.cut_off = False

    def write(self, record: Any) -> None:
        self._buffer.append(record.value)

    def write_many(self, values: list[Any]) -> None:
        self._buffer.extend(values)

    async def flush(self) -> None:
        if not self.transactional and not self.cut_off:
            self._egress.visible.extend(self._buffer)
            self._buffer.clear()

    def backlog(self) -> int:
        return len(self._buffer)

    def unsealed(self) -> int:
        return len(self._buffer) if self.transactional else 0

    def pre_commit(self, checkpoint_id: int) -> Any:
        if not self.cut_off:
            self._egress._seal(checkpoint_id, self._buffer)
        self._buffer = []
        return {"transaction": checkpoint_id}

    async def commit(self, checkpoint_id: int) -> None:
        if not self.cut_off:
            self._egress._commit(checkpoint_id)

    async def recover(self, state: Any) -> None:
        self._egress._recover(int(state["transaction"]))


class InProcessClient(RemoteClient):
    """Calls remote functions in this process: the request's bytes to a ``StatefulFunctions``'
    request-reply handler, its response's bytes back (no HTTP). ``bindings`` maps function
    typenames or ``namespace/*`` patterns to handlers."""

    def __init__(self, bindings: Mapping[str, RequestReplyHandler]) -> None:
        super().__init__()
        self._bindings = dict(bindings)

    def handler_for(self, typename: str) -> RequestReplyHandler | None:
        exact = self._bindings.get(typename)
        if exact is not None:
            return exact
        return self._bindings.get(typename.rpartition("/")[0] + "/*")

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def trouble(self, url: str) -> str | None:
        return None

    async def call(
        self,
        url: str,
        body: bytes,
        transport: TransportSpec,
        typename: str,
        before_wait: Callable[[], None] | None = None,
    ) -> bytes:
        if before_wait is not None:
            before_wait()
        handler = self.handler_for(typename)
        if handler is None:
            raise TerminalFunctionError(
                f"function {typename} (remote, {url}) has no in-process functions: bind them "
                f"with JobHarness(..., functions={{'{typename.rpartition('/')[0]}/*': ...}})"
            )
        try:
            return await handler.handle_async(body)
        except Exception as exc:
            raise TerminalFunctionError(
                f"function {typename} raised {type(exc).__name__}: {exc}"
            ) from exc


def bound_functions(
    bindings: Mapping[str, RequestReplyHandler],
) -> Sequence[RequestReplyHandler]:
    """The distinct handlers of ``bindings``."""
    seen: dict[int, RequestReplyHandler] = {}
    for handler in bindings.values():
        seen.setdefault(id(handler), handler)
    return list(seen.values())
