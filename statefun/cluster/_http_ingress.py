"""The HTTP ingress of a clustered job: every worker serves it, Kafka carries the rest.

``WorkerHttp`` lives as long as the worker process, across assignments (as its admin port
does): one ``ClusteredHttpSource`` per HTTP ingress of the module, on the ingress's port plus
``cluster_port_offset`` (``statefun run --workers N`` gives worker *i* the offset *i*), and
one ``RepliesReader``. Each assignment's ``Epoch`` attaches an ``EpochHttp`` to it:

* **Routing.** An accepted request's message is sent into the epoch's job like any message:
  to its dispatcher when this worker owns the target's key group, else to the exchange in the
  open transaction. No write-ahead log: the job's checkpoint is a Kafka transaction.
* **Acknowledgement.** A ``/messages`` request is answered 202 only after the checkpoint whose
  cut follows its message committed (the message, or its effects, are then in Kafka). A
  checkpoint that fails, or an epoch dropped before its cut, answers 503 (not accepted: retry).
  A ``/call`` waits for its reply instead, which comes after that commit; the same failures
  answer it 503 through its reply's future.
* **Bounded waits.** Between two epochs (the group rebalancing) and while the job has no room,
  a request waits to be handed to a job at most ``cluster_http_wait_ms`` (a ``/call`` at most
  its ``replyTimeout``, which bounds the whole call), then it is answered 503 with
  ``Retry-After``: it was not sent, so sending it again is safe. At most ``maxPending``
  requests of an ingress wait to be handed in; more are answered 503 at once.
  A worker that dies first drops the connection; the client retries, as after any broken
  connection (the message was not committed, or - past the commit - may be there twice: the
  single-process ingress after its WAL's fsync is the same).
* **Replies.** A ``/call``'s caller names this worker process (``_replies.request_prefix``).
  The job holds each reply until its next cut (``Outputs.hold_replies``); at the cut a reply
  for another instance becomes a record of the replies topic in the checkpoint's transaction,
  one for this instance is kept; both are released only after the commit, the latter in
  memory, the former by the reader of the connection's worker (``read_committed``).
* **Idempotency keys.** A request with an ``Idempotency-Key`` is not sent to its target but
  to its key's address, ``pystatefun.http/idempotency:<ingress id>:<key>`` (caller: the
  request's reply address), carrying the request's fingerprint, route and message; the key's
  function, on the worker owning the key's key group, decides (``_keys.py``, run by
  ``_http_keys.py``) and forwards the message once. The request is answered from the outcome
  the key sends back through the replies like a call's reply (202, the reply, either again
  with ``Idempotent-Replayed``, or 422), so never before the key's worker committed the
  record; a failed cut or a dropped epoch answers 503 as for a call. ``serve_keys`` adds the
  key function to each epoch's job and the hook telling a key when its forwarded message went
  to the dead letters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from statefun._addresses import REPLY_NAME, REPLY_NAMESPACE, REPLY_TYPENAME
from statefun._exceptions import UnavailableError, UndeliverableError
from statefun._http.server import Reply, Request, plain
from statefun._settings import Settings
from statefun.cluster._config import ClusterConfig
from statefun.cluster._http_keys import answer, dead_letter_to_key, key_functions, request_value
from statefun.cluster._key_retention import KeyRetention, KeySweep
from statefun.cluster._keys import KEY_TYPENAME, KeyMessageError, key_id
from statefun.cluster._replies import (
    RateLimitedLog,
    RepliesReader,
    ReplyRecordError,
    instance_of,
    new_instance,
    reply_row,
    request_prefix,
)
from statefun.egress.kafka import Row
from statefun.ingress._http_kind import server_options
from statefun.ingress._idempotency import HEADER, HEADER_KEY
from statefun.ingress._keystore import check_key, fingerprint
from statefun.ingress.http import HttpSource, RequestRefused, call_reply, unavailable
from statefun.module._specs import HttpIngressSpec, ModuleSpec
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import FunctionRegistry
from statefun.runtime._timers import now_ms
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue
from statefun.state.base import StateBackend

__all__ = [
    "ClusteredHttpSource",
    "EpochHttp",
    "HttpCut",
    "HttpJob",
    "WorkerHttp",
    "http_ingresses",
]

log = logging.getLogger(__name__)


class _HoldsReplies(Protocol):
    def hold_replies(self, request_checkpoint: Callable[[], None]) -> None: ...
    def on_undeliverable_call(self, tell: Callable[[str, str], None]) -> None: ...


class HttpJob(Protocol):
    """What the ingress takes from an epoch's job (``runtime/_job.py``)."""

    @property
    def outputs(self) -> _HoldsReplies: ...
    def seal_replies(self) -> list[tuple[str, Any]]: ...
    def send(self, envelope: Envelope) -> None: ...
    def has_room(self) -> bool: ...
    async def room(self) -> None: ...
    def emit_many(
        self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0
    ) -> int: ...
    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None: ...


class _ServesKeys(Protocol):
    def on_dead_letter_from(
        self, caller_typename: str, tell: Callable[[str, Envelope, str], None]
    ) -> None: ...


class KeyedJob(Protocol):
    """What ``WorkerHttp.serve_keys`` takes from an epoch's job."""

    @property
    def functions(self) -> FunctionRegistry: ...
    @property
    def outputs(self) -> _ServesKeys: ...
    @property
    def clock(self) -> Callable[[], int]: ...
    @property
    def state(self) -> StateBackend: ...
    def send(self, envelope: Envelope) -> None: ...


class RowWriter(Protocol):
    """The worker's open transaction (``WorkerTransactions``)."""

    def write_rows(self, rows: list[Row]) -> None: ...


def http_ingresses(module: ModuleSpec) -> list[HttpIngressSpec]:
    return [i for i in module.ingresses if isinstance(i, HttpIngressSpec)]


class ClusteredHttpSource(HttpSource):
    """The HTTP ingress's server and routes, without a WAL; a request with an
    ``Idempotency-Key`` goes to its key's address (``_http_keys.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: keyed requests answered from a recorded outcome (``Idempotent-Replayed``)
        self.replayed = 0

    def handle(self, request: Request, body: bytes) -> Reply | Coroutine[Any, Any, Reply]:
        key = request.headers.get(HEADER_KEY) if request.state is not None else None
        if key is None:
            return super().handle(request, body)
        kind, typename, id_ = request.state
        try:
            value = self._value(request, body)
        except RequestRefused as exc:
            return exc.reply
        problem = check_key(key)
        if problem is not None:
            return plain(400, f"bad {HEADER} header: {problem}")
        return self._keyed_request(key, kind, typename, id_, value)

    async def _keyed_request(
        self, key: str, kind: str, typename: str, id_: str, value: TypedValue
    ) -> Reply:
        """Send the request to its key's address and answer what the key sends back."""
        request_id = f"{self._prefix}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + self.reply_timeout_s
        until_ms = now_ms() + int(self.reply_timeout_s * 1000)
        message = request_value(
            fingerprint(kind, typename, id_, value), kind, typename, id_, value, until_ms
        )
        caller = SdkAddress(REPLY_NAMESPACE, REPLY_NAME, request_id, REPLY_TYPENAME)
        self.replies[request_id] = future
        try:
            await self._deliver(
                KEY_TYPENAME, key_id(self.ingress_id, key), message, caller, durable=False
            )
            outcome = await asyncio.wait_for(
                asyncio.shield(future), max(0.0, deadline - loop.time())
            )
            reply = answer(outcome, key, f"{typename}/{id_}", call_reply)
        except TimeoutError:
            return plain(
                504,
                f"no outcome for {HEADER} {key!r} within {self.reply_timeout_s:g} s: the request "
                "is still in progress (or its key's worker is away); a retry with the same key "
                "gets its outcome",
            )
        except UndeliverableError as exc:  # the message to the key went to the dead letters
            return plain(422, f"{HEADER} {key!r}: {exc}")
        except RequestRefused as exc:
            return exc.reply
        except UnavailableError as exc:
            return unavailable(str(exc))
        except KeyMessageError as exc:
            return plain(500, f"{HEADER} {key!r}: {exc}")
        finally:
            self.replies.pop(request_id, None)
        if reply.status < 300:
            self.accepted += 1
        if any(name == "Idempotent-Replayed" for name, _ in reply.headers):
            self.replayed += 1
        return reply


@dataclass
class HttpCut:
    """What one checkpoint's cut took: acknowledgements and this instance's replies, settled
    when the checkpoint committed or failed."""

    owner: WorkerHttp
    acks: list[asyncio.Future[None]] = field(default_factory=list)
    local: list[tuple[str, Any]] = field(default_factory=list)
    #: request ids of the calls whose messages the cut took (refused if it fails)
    calls: list[str] = field(default_factory=list)

    def committed(self) -> None:
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)
        for request_id, value in self.local:
            self.owner.complete(request_id, value)

    def aborted(self, error: BaseException) -> None:
        refusal = UnavailableError(f"not accepted: the worker's checkpoint failed ({error})")
        for ack in self.acks:
            if not ack.done():
                ack.set_exception(refusal)
        self.owner.refuse_calls(self.calls, refusal)


class EpochHttp:
    """The HTTP ingress's link to one epoch's job and transactions (see the module)."""

    def __init__(self, owner: WorkerHttp, job: HttpJob, transactions: RowWriter) -> None:
        self._owner = owner
        self.job = job
        self._transactions = transactions
        self._acks: list[asyncio.Future[None]] = []
        #: request ids of calls sent since the last cut (their replies' futures wait)
        self._calls: list[str] = []
        self._held = False
        #: calls dead-lettered here whose callers wait elsewhere: (request id, reason)
        self._undeliverable: list[tuple[str, Any]] = []
        self.attached = True
        self._detached = asyncio.Event()
        job.outputs.hold_replies(self._reply_held)
        job.outputs.on_undeliverable_call(self._undeliverable_call)

    def _reply_held(self) -> None:
        self._held = True

    def _undeliverable_call(self, request_id: str, reason: str) -> None:
        self._undeliverable.append((request_id, UndeliverableError(reason)))
        self._held = True

    def wants_checkpoint(self) -> bool:
        """Whether requests wait for a commit (a checkpoint should come soon)."""
        return self._held or bool(self._acks) or bool(self._calls)

    async def submit(self, envelope: Envelope, deadline: float | None = None) -> bool:
        """Send ``envelope`` into the job; a message waits for the commit that holds it, a
        call (its caller a reply address) returns at once: its reply's future hears a failure.
        False: this epoch was detached while waiting for room (send it to the next one).
        ``deadline`` (the loop's clock) bounds the wait for room: then UnavailableError."""
        job = self.job
        loop = asyncio.get_running_loop()
        while self.attached and not job.has_room():  # (another request may take the room)
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise UnavailableError(
                    f"not accepted: worker {self._owner.config.worker_id}'s job had no room for "
                    "it in time (cluster_http_wait_ms); retry"
                )
            room = asyncio.ensure_future(job.room())
            gone = asyncio.ensure_future(self._detached.wait())
            try:
                await asyncio.wait((room, gone), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                room.cancel()
                gone.cancel()
        if not self.attached:
            return False
        job.send(envelope)
        caller = envelope.caller
        if caller is not None and caller.typename == REPLY_TYPENAME:
            self._calls.append(caller.id)
            return True
        ack: asyncio.Future[None] = loop.create_future()
        self._acks.append(ack)
        await ack
        return True

    def cut(self, config: ClusterConfig) -> HttpCut:
        """At the checkpoint's cut (synchronously): take the acknowledgements waiting, write
        the held replies for other instances into the transaction, keep this instance's."""
        cut = HttpCut(self._owner, self._acks, calls=self._calls)
        self._acks, self._calls, self._held = [], [], False
        rows: list[Row] = []
        own = self._owner.instance
        held, self._undeliverable = [*self.job.seal_replies(), *self._undeliverable], []
        for request_id, value in held:
            if instance_of(request_id) == own:
                cut.local.append((request_id, value))
                continue
            try:
                rows.append(reply_row(config, request_id, value))
            except ReplyRecordError as exc:
                self._owner.dropped(f"{exc}; dropped")
        if rows:
            self._transactions.write_rows(rows)
        return cut

    def detach(self) -> None:
        """New requests go to the next epoch; those waiting for room here go there too."""
        self.attached = False
        self._detached.set()

    def close(self) -> None:
        """The epoch is gone: requests no cut took are not accepted."""
        self.detach()
        refusal = UnavailableError("not accepted: the worker gave its key groups up; retry")
        acks, self._acks = self._acks, []
        for ack in acks:
            if not ack.done():
                ack.set_exception(refusal)
        calls, self._calls = self._calls, []
        self._owner.refuse_calls(calls, refusal)


class _WorkerContext:
    """The ``IngressContext`` the worker's HTTP sources see: the current epoch's job."""

    def __init__(self, owner: WorkerHttp, wait_s: float, reply_timeout_s: float) -> None:
        self._owner = owner
        self._wait_s = wait_s
        self._call_wait_s = min(wait_s, reply_timeout_s)

    def is_function_type(self, typename: str) -> bool:
        return self._owner.functions.resolve(typename) is not None

    async def submit(
        self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None
    ) -> None:
        envelope = Envelope(typename, id_, value, caller)
        bound = self._wait_s if caller is None else self._call_wait_s
        deadline = asyncio.get_running_loop().time() + bound
        while not await (await self._owner.epoch(deadline, bound)).submit(envelope, deadline):
            pass

    async def room(self) -> None:
        await (await self._owner.epoch()).job.room()

    def has_room(self) -> bool:
        link = self._owner.current
        return link is not None and link.job.has_room()

    def emit(self, typename: str, id_: str, value: Any, caller: SdkAddress | None = None) -> None:
        link = self._owner.current
        if link is None:
            raise UnavailableError("no assignment: the worker is rebalancing")
        link.job.send(Envelope(typename, id_, value, caller))

    def emit_many(self, typename: str, messages: Sequence[tuple[str, Any]], start: int = 0) -> int:
        link = self._owner.current
        return start if link is None else link.job.emit_many(typename, messages, start)

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        link = self._owner.current
        if link is not None:
            link.job.dead_letter_record(fields, value)


class WorkerHttp:
    """A worker's HTTP ingresses and its replies reader (see the module)."""

    def __init__(self, module: ModuleSpec, settings: Settings, config: ClusterConfig) -> None:
        self.config = config
        self.instance = new_instance()
        self.functions = FunctionRegistry(module)
        #: request id -> the future its /call waits on (shared by the worker's sources)
        self.replies: dict[str, asyncio.Future[Any]] = {}
        self.current: EpochHttp | None = None
        self._attached = asyncio.Event()
        self._limited = RateLimitedLog("HTTP ingress")
        offset = settings.cluster_port_offset
        wait_s = settings.cluster_http_wait_ms / 1000
        self.sources = [
            ClusteredHttpSource(
                spec.id,
                spec.host,
                spec.port + offset if spec.port else 0,
                spec.max_body_bytes,
                spec.reply_timeout.total_seconds(),
                spec.max_pending,
                replies=self.replies,
                server_options=server_options(settings, spec),
                unanswered=self._unanswered,
                request_prefix=request_prefix(self.instance, index),
            )
            for index, spec in enumerate(http_ingresses(module))
        ]
        #: how long a request waits to be handed to a job (``cluster_http_wait_ms``)
        self.wait_s = wait_s
        self.reader = RepliesReader(config, self.instance, self._from_reader)
        self._settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.completed = 0

    async def start(self) -> None:
        """Read the replies topic from its end, then open the ports."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.reader.start)
        for source in self.sources:
            await source.start()
            self._tasks.append(self._loop.create_task(source.run(self.context(source))))

    def context(self, source: ClusteredHttpSource) -> _WorkerContext:
        """What ``source`` sends its requests' messages through: the current epoch's job."""
        return _WorkerContext(self, self.wait_s, source.reply_timeout_s)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for future in self.replies.values():
            if not future.done():
                future.cancel()
        for source in self.sources:
            await source.close()
        await asyncio.to_thread(self.reader.close)

    # -- epochs -------------------------------------------------------------------------------

    def serve_keys(self, job: KeyedJob, key_groups: Sequence[int]) -> KeySweep:
        """``job`` serves the idempotency keys' function, and a key hears when the message it
        forwarded goes to the dead letters (``_http_keys.py``); the sweep deleting the expired
        keys of ``key_groups`` (the epoch's) is for the epoch to run (``_key_retention.py``)."""
        retention = KeyRetention(
            job.state,
            self._settings.max_parallelism,
            self._settings.http_idempotency_retention_s * 1000,
            self._settings.http_idempotency_max_keys,
            self._settings.http_idempotency_max_reply_bytes,
            key_groups,
        )
        job.functions.add(key_functions(retention, job.clock))
        job.outputs.on_dead_letter_from(KEY_TYPENAME, dead_letter_to_key(job.send))
        return KeySweep(retention, job.clock)

    def attach(self, job: HttpJob, transactions: RowWriter) -> EpochHttp:
        """A new epoch's job serves the requests from now on."""
        self.current = link = EpochHttp(self, job, transactions)
        self._attached.set()
        return link

    def detach(self, link: EpochHttp) -> None:
        """``link``'s epoch stops: new requests wait for the next one."""
        link.detach()
        if self.current is link:
            self.current = None
            self._attached.clear()

    async def epoch(self, deadline: float | None = None, bound: float = 0.0) -> EpochHttp:
        """The current epoch's link, once there is one; UnavailableError past ``deadline``
        (the loop's clock; ``bound`` is how long that was, for the message)."""
        loop = asyncio.get_running_loop()
        while self.current is None:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise UnavailableError(
                    f"not accepted: worker {self.config.worker_id} had no assignment for "
                    f"{bound:g} s (the job's group is rebalancing); retry"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._attached.wait(), left)
        return self.current

    # -- replies ------------------------------------------------------------------------------

    def _from_reader(self, request_id: str, value: Any) -> None:
        """On the reader's thread: a committed reply for this instance."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.complete, request_id, value)

    def complete(self, request_id: str, value: Any) -> None:
        """A committed reply: to its waiting /call, or dropped (logged, rate-limited)."""
        future = self.replies.pop(request_id, None)
        if future is None or future.done():
            self.dropped(f"reply for request {request_id} arrived after its caller left; dropped")
            return
        self.completed += 1
        if isinstance(value, UndeliverableError):  # the call's message is a dead letter: 422
            future.set_exception(value)
        else:
            future.set_result(value)

    def refuse_calls(self, request_ids: list[str], refusal: UnavailableError) -> None:
        """Calls whose messages were not committed: their waiting requests answer 503."""
        for request_id in request_ids:
            future = self.replies.get(request_id)
            if future is not None and not future.done():
                future.set_exception(refusal)

    def dropped(self, text: str) -> None:
        self._limited.warn(text)

    def _unanswered(self, _request_id: str, _typename: str) -> str:
        return (
            f"its function runs on the worker that owns its key group, which sent no committed "
            f"reply in time (see that worker's log and dead letters; worker {self.config.worker_id}"
            " holds this connection)"
        )
