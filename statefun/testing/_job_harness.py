"""``JobHarness``: a module.yaml run by the real runtime in this process, on a virtual clock.

The job is the runtime's own ``Job`` - router, dispatchers, timer service, state backend, and
with ``checkpoints=True`` the checkpoint coordinator writing to a temporary folder - on an event
loop whose clock is virtual (``_virtual_loop.py``): it moves only with ``advance``, and the job's
clock (delayed messages, state TTL) is that loop's. What the harness swaps in, by id:

* every ingress of the module (Kafka, HTTP, file) is an in-memory log (``ingress(id).send``);
* every egress (Kafka, file, stdout) is an in-memory reader's view (``egress(id).records``),
  exactly-once ones transactional as the real ones (``_standins.py``);
* remote endpoints call in-process ``StatefulFunctions`` through their request-reply handler,
  bytes in and bytes out (``functions=``); embedded endpoints load as the runtime loads them.

Nothing sleeps and nothing opens a socket: the admin server and the endpoint probe are off, and
the harness refuses a module whose remote endpoints have no in-process functions.

``crash_and_restore`` stops the job as if its process died (``Job.crash``): the sinks of that
run are cut off first (output no completed checkpoint committed is lost, as with exactly-once),
and a new job starts on the same stand-ins and checkpoint folder, restoring the newest
checkpoint: its state, timers and in-flight messages, and the ingresses' positions, from which
the input after it is delivered again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from statefun._addresses import REPLY_NAME, REPLY_NAMESPACE, REPLY_TYPENAME
from statefun._exceptions import (
    FunctionFailedError,
    FunctionInvocationError,
    JobFailedError,
    UnknownFunctionError,
)
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.module import FileIngressSpec, HttpEndpointSpec, ModuleSpec, load_module
from statefun.runtime import Job
from statefun.runtime._envelope import Envelope
from statefun.runtime._functions import EmbeddedFunction
from statefun.sdk._functions import StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import Type
from statefun.state._expiring import live_values
from statefun.testing._harness import DEFAULT_START
from statefun.testing._standins import EgressStandIn, IngressStandIn, InProcessClient
from statefun.testing._values import TypeTable
from statefun.testing._virtual_loop import VirtualLoop

__all__ = ["JobHarness"]

_ONE_MS = timedelta(milliseconds=1)
#: the id of the harness's own ingress, which ``send`` writes to
SEND_INGRESS = "pystatefun.testing/send"
#: the longest checkpoint interval the settings allow (~24.8 days): "only when asked"
_NO_INTERVAL_MS = 2**31 - 1

Functions = StatefulFunctions | RequestReplyHandler


class _Job(Job):
    """The runtime's job, remembering the failure that stopped it (to name its message)."""

    failure: tuple[str, list[Envelope], FunctionInvocationError, BaseException | None] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failure = None

    def on_failure(
        self,
        typename: str,
        batch: list[Envelope],
        error: FunctionInvocationError,
        cause: BaseException | None = None,
    ) -> list[Envelope]:
        again = super().on_failure(typename, batch, error, cause)
        if self.failed and self.failure is None:
            self.failure = (typename, list(batch), error, cause)
        return again


def _handler(functions: Any, where: str) -> RequestReplyHandler:
    if isinstance(functions, RequestReplyHandler):
        return functions
    if isinstance(functions, StatefulFunctions):
        return RequestReplyHandler(functions)
    raise TypeError(
        f"{where}: expected a statefun.StatefulFunctions (or a RequestReplyHandler), "
        f"got {type(functions).__name__}"
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return str(value // _ONE_MS)
    return str(value)


def _not_in_a_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "JobHarness runs the job on an event loop of its own: use it from a plain (def) test, "
        "not from inside a running event loop (an async test)"
    )


class JobHarness:
    """Runs a module.yaml with the real runtime in this process, on a virtual clock, with
    in-memory ingresses and egresses. See docs/guide/testing.md."""

    def __init__(
        self,
        module: str | Path | Sequence[str | Path] | ModuleSpec,
        *,
        overrides: Mapping[str, Any] | None = None,
        functions: Functions | Mapping[str, Functions] | None = None,
        checkpoints: bool = False,
        checkpoint_interval: timedelta | None = None,
        types: Iterable[Type] = (),
        start: datetime = DEFAULT_START,
    ) -> None:
        if isinstance(module, ModuleSpec):
            spec = module
        elif isinstance(module, str | Path):
            spec = load_module(module)
        else:
            spec = load_module(*module)
        if start.tzinfo is None:
            raise ValueError("start must be an aware datetime (e.g. tzinfo=datetime.UTC)")
        _not_in_a_loop()
        self.module = spec
        self._bindings = self._bind(spec, functions)
        self._workdir = Path(tempfile.mkdtemp(prefix="statefun-job-harness-"))
        self.checkpoints = checkpoints or checkpoint_interval is not None
        try:
            self.settings = self._settings(overrides or {}, checkpoint_interval)
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        self._types = TypeTable(types)
        for handler in {id(h): h for h in self._bindings.values()}.values():
            for function in handler.functions:
                self._add_types(function)

        def is_function_type(typename: str) -> bool:
            return spec.endpoint_for(typename) is not None

        self._ingresses = {
            i.id: IngressStandIn(i, self._types, is_function_type) for i in spec.ingresses
        }
        self._egresses = {e.id: EgressStandIn(e, self._types) for e in spec.egresses}
        #: where ``send`` puts messages: an ingress of the harness's own, unbounded, so the job
        #: runs until closed even when the module has no (or only bounded) ingresses
        self._sent = IngressStandIn(
            FileIngressSpec(SEND_INGRESS, Path()), self._types, is_function_type
        )
        self._loop = VirtualLoop(int(start.timestamp() * 1000))
        self._closed = False
        self._failed: BaseException | None = None
        self.restarts = 0
        self._calls = 0
        try:
            self._launch()
        except BaseException:
            self.close()
            raise

    # -- set-up ----------------------------------------------------------------------------

    @staticmethod
    def _bind(
        spec: ModuleSpec, functions: Functions | Mapping[str, Functions] | None
    ) -> dict[str, RequestReplyHandler]:
        remote = [e for e in spec.endpoints if isinstance(e, HttpEndpointSpec)]
        bindings: dict[str, RequestReplyHandler] = {}
        if isinstance(functions, Mapping):
            for pattern, bound in functions.items():
                if not any(e.functions.matches(pattern.replace("*", "x")) for e in remote):
                    served = ", ".join(str(e.functions) for e in remote) or "none"
                    raise ValueError(
                        f"functions={{{pattern!r}: ...}}: no remote endpoint of the module "
                        f"serves {pattern!r}; remote endpoints: {served}"
                    )
                bindings[pattern] = _handler(bound, f"functions[{pattern!r}]")
        elif functions is not None:
            handler = _handler(functions, "functions")
            for endpoint in remote:
                bindings[str(endpoint.functions)] = handler
        for endpoint in remote:
            target = str(endpoint.functions)
            if not any(endpoint.functions.matches(k.replace("*", "x")) for k in bindings):
                raise ValueError(
                    f"{endpoint.source or 'module'}: remote endpoint {target} "
                    f"({endpoint.url_path_template}) has no in-process functions: "
                    f"JobHarness(..., functions={{{target!r}: functions}})"
                )
        return bindings

    def _settings(self, overrides: Mapping[str, Any], interval: timedelta | None) -> Settings:
        given = {name.replace("-", "_"): _text(value) for name, value in overrides.items()}
        settings = Settings.load(given, environ={})
        work = self._workdir
        forced: dict[str, Any] = {
            "admin_port": 0,  # no sockets
            "remote_probe_timeout_ms": 0,
            # early checkpoints depend on the CPU time the last one took: not deterministic
            "idle_checkpoint_delay_ms": 0,
        }
        defaults: dict[str, Any] = {
            "dead_letter_path": str(work / "dead-letters.jsonl"),
            "state_dir": str(work / "state"),
        }
        if self.checkpoints:
            defaults["checkpoint_dir"] = str(work / "checkpoints")
            forced["checkpoint_interval_ms"] = (
                _NO_INTERVAL_MS if interval is None else interval // _ONE_MS
            )
        elif settings.checkpoint_dir:
            raise ValueError(
                "checkpoints in a JobHarness: JobHarness(..., checkpoints=True) (or "
                "checkpoint_interval=...), not the checkpoint_dir setting"
            )
        values = {k: v for k, v in defaults.items() if k not in given}
        return dataclasses.replace(settings, **values, **forced)

    def _add_types(self, function: Any) -> None:
        for value_spec in function.specs:
            self._types.add(value_spec.type)
        self._types.add_module_types(function.fun)

    def _launch(self) -> None:
        loop = self._loop
        self._job = job = _Job(
            self.module,
            self.settings,
            sources=[i.source() for i in (*self._ingresses.values(), self._sent)],
            sinks=[e.sink() for e in self._egresses.values()],
            clock=lambda: loop.now_ms,
            client=InProcessClient(self._bindings),
            poll_interval_s=None,
        )
        for function in job.functions.known():
            if isinstance(function, EmbeddedFunction):
                self._add_types(function.function)
        self._task = loop.create_task(job.run())
        self._drive(loop.now_ms)

    # -- the clock -------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The job's clock (UTC); it moves only with ``advance``."""
        return datetime.fromtimestamp(self._loop.now_ms / 1000, tz=UTC)

    def advance(self, duration: timedelta) -> None:
        """Move the clock by ``duration``, the job running all along: delayed messages fire at
        their deadlines, state expires, checkpoints come at their interval."""
        if not isinstance(duration, timedelta):
            raise TypeError(f"advance() takes a datetime.timedelta, got {type(duration).__name__}")
        if duration < timedelta(0):
            raise ValueError(f"advance() cannot go back in time ({duration})")
        self._drive(self._loop.now_ms + duration // _ONE_MS)

    def run_until_idle(self) -> None:
        """Let the job work off everything there is to do now (what the ingresses hold, and
        what that causes), without moving the clock."""
        self._drive(self._loop.now_ms)

    # -- connectors ------------------------------------------------------------------------

    def ingress(self, ingress_id: str) -> IngressStandIn:
        """The in-memory stand-in of the module's ingress ``ingress_id``."""
        found = self._ingresses.get(ingress_id)
        if found is None:
            known = ", ".join(self._ingresses) or "none"
            raise KeyError(f"the module has no ingress {ingress_id!r}; it has: {known}")
        return found

    def egress(self, egress_id: str) -> EgressStandIn:
        """The in-memory stand-in of the module's egress ``egress_id``."""
        found = self._egresses.get(egress_id)
        if found is None:
            known = ", ".join(self._egresses) or "none"
            raise KeyError(f"the module has no egress {egress_id!r}; it has: {known}")
        return found

    def send(self, target: str, id: str, value: Any, typename: str | None = None) -> None:
        """A message to ``target``/``id`` from none of the module's ingresses (as ``statefun
        send``; ``value`` as a file ingress record's), through an ingress of the harness's own:
        the job takes it at the next ``run_until_idle``/``advance``, and after a crash it comes
        again unless a checkpoint covered it, like any ingress record."""
        self._alive()
        if self.module.endpoint_for(target) is None:
            raise UnknownFunctionError(target, [str(e.functions) for e in self.module.endpoints])
        self._sent.send(id, value, target=target, typename=typename)

    def call(self, target: str, id: str, value: Any, typename: str | None = None) -> Any:
        """``send`` as an HTTP request-reply call (``statefun send --call``): the function's
        reply to its caller, decoded, once the job is idle (with checkpoints, the reply is
        released by the checkpoint that covers it, as ``reply_release=on-checkpoint`` does).
        Raises if no reply came, or the message became a dead letter."""
        self._alive()
        self._calls += 1
        request = f"harness-{self._calls}"
        future: asyncio.Future[Any] = self._loop.create_future()
        replies = self._job.replies
        replies[request] = future
        caller = SdkAddress(REPLY_NAMESPACE, REPLY_NAME, request, REPLY_TYPENAME)
        try:
            if self.module.endpoint_for(target) is None:
                known = [str(e.functions) for e in self.module.endpoints]
                raise UnknownFunctionError(target, known)
            self._sent.send(id, value, target=target, typename=typename, caller=caller)
            self.run_until_idle()
            if not future.done():
                raise RuntimeError(
                    f"{target}/{id} sent no reply to its caller (context.caller) by the time "
                    "the job was idle"
                )
            return self._types.decode(future.result())
        finally:
            replies.pop(request, None)
            if not future.done():
                future.cancel()

    @property
    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead letters written so far (one dict per record of the dead-letter file)."""
        path = Path(self.settings.dead_letter_path)
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    # -- state -----------------------------------------------------------------------------

    def state(self, typename: str, id: str) -> dict[str, Any]:
        """The state of ``typename``/``id`` in the job's state backend, decoded (expired TTL
        values are gone, as a function would find them)."""
        self._alive()
        job = self._job
        key_group = key_group_for(typename, id, self.settings.max_parallelism)
        values = live_values(job.state.get(key_group, (typename, id)), self._loop.now_ms)
        return self._types.decode_state(values, self._value_specs(typename))

    def _value_specs(self, typename: str) -> dict[str, Any]:
        function = self._job.functions.resolve(typename)
        if isinstance(function, EmbeddedFunction):
            return dict(function.function.storage_class._specs)
        handler = InProcessClient(self._bindings).handler_for(typename)
        if handler is not None and typename in handler.functions:
            return dict(handler.functions.for_typename(typename).storage_class._specs)
        return {}

    # -- checkpoints and crashes -----------------------------------------------------------

    def checkpoint(self) -> int:
        """Take a checkpoint now (the runtime's coordinator, files in a temporary folder) and
        commit it: exactly-once egress records sealed by it become visible. Its id."""
        self._alive()
        coordinator = self._job.checkpoints
        if coordinator is None:
            raise RuntimeError("no checkpoints: JobHarness(..., checkpoints=True)")
        taken = self._loop.create_task(coordinator.checkpoint())
        self._drive(self._loop.now_ms)
        if not taken.done():  # pragma: no cover - the loop only idles once it is done
            raise RuntimeError("the checkpoint did not complete")
        return taken.result().id

    def crash_and_restore(self) -> None:
        """Crash the job here, as if its process died, and start it again from the newest
        completed checkpoint: its state, delayed messages and messages in flight come back;
        ingress records after its positions are delivered again; output no completed
        checkpoint committed is lost (exactly-once egresses) or comes again (others). Also
        restarts a job that failed."""
        if self._closed:
            raise RuntimeError("the JobHarness is closed")
        if not self.checkpoints:
            raise RuntimeError(
                "crash_and_restore() needs checkpoints: JobHarness(..., checkpoints=True)"
            )
        for sink in self._job.sinks.values():
            sink.cut_off = True  # type: ignore[attr-defined]
        if not self._task.done():
            self._job.crash()
            while not self._task.done():
                self._loop.run_until(self._loop.now_ms)
        if not self._task.cancelled():
            self._task.exception()  # (retrieved: the crash is the point)
        self._failed = None
        self.restarts += 1
        self._launch()

    # -- running ---------------------------------------------------------------------------

    def _alive(self) -> None:
        if self._closed:
            raise RuntimeError("the JobHarness is closed")
        if self._failed is not None:
            raise RuntimeError(
                f"the job failed ({self._failed}); crash_and_restore() restarts it from its "
                "last checkpoint"
            )

    def _drive(self, target_ms: int) -> None:
        self._alive()
        _not_in_a_loop()
        self._loop.run_until(target_ms)
        if self._task.done():
            self._raise_failure()

    def _raise_failure(self) -> None:
        task = self._task
        error = task.exception() if not task.cancelled() else None
        failure = self._job.failure
        if failure is not None and isinstance(error, JobFailedError):
            typename, batch, invocation_error, cause = failure
            original = cause or invocation_error.__cause__ or invocation_error
            first = batch[0] if batch else None
            if first is not None and original is not invocation_error:
                value = self._types.decode(first.value)
                text = (
                    f"function {typename}/{first.id} raised {type(original).__name__}: "
                    f"{original} (message {value!r} of type {first.value.typename})"
                )
            else:
                text = str(invocation_error)
            self._failed = FunctionFailedError(text)
            raise self._failed from original
        self._failed = error or RuntimeError("the job stopped")
        if error is not None:
            raise error
        raise RuntimeError("the job stopped")

    def close(self) -> None:
        """Stop the job (as ``statefun run`` stops on SIGTERM), then delete its temporary
        folder. Also at the end of a ``with`` block."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        task = getattr(self, "_task", None)
        try:
            if task is not None and not task.done():
                self._job.stop()
                while not task.done():
                    loop.run_until(loop.now_ms + 60_000)
            if task is not None and not task.cancelled():
                task.exception()
        finally:
            loop.close()
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> JobHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
