"""An asyncio event loop on a virtual clock, for running the real runtime in a test.

``loop.time()`` is virtual: it moves only when the loop has nothing to do now. Then, instead of
sleeping until its next timer, the loop jumps to it, as long as that timer falls before the
target the caller gave (``run_until``); past the target the loop stops, with the clock at the
target. So a job waits for its delayed messages, checkpoint intervals and timeouts without any
real time passing, and ``run_until`` returns once the job is idle up to the target.

Work handed to threads (``run_in_executor``, ``asyncio.to_thread``: a checkpoint's files) takes
no virtual time: while any is out, the loop waits for it in real time and the clock stands
still. File descriptors (the loop's own wake-up pipe) are watched as usual.

The clock counts whole milliseconds: ``now_ms`` is what the job's clock (wall time, ms since
the epoch) reads; ``time()`` is seconds since the start, small numbers that a float holds
exactly enough for the loop's arithmetic.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple

__all__ = ["VirtualLoop"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")
#: a timer this close (ms) past a whole millisecond counts as due at that millisecond (float
#: arithmetic on the loop's times)
_SLACK_MS = 1e-4
#: how long (s, real) one wait for a thread's work lasts before the loop looks again
_THREAD_WAIT_S = 0.05


class _VirtualSelector(selectors.BaseSelector):
    """The loop's selector: real for file descriptors, and where virtual time moves."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        if loop is None or loop.real_time or (timeout is not None and timeout <= 0):
            return self._real.select(timeout)
        if loop.threads_busy:
            return self._real.select(_THREAD_WAIT_S)
        events = self._real.select(0)
        if events:
            return events
        loop.idle_until(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock is virtual (see the module's docstring)."""

    def __init__(self, start_ms: int) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._start_ms = start_ms
        #: the virtual wall clock, ms since the epoch
        self.now_ms = start_ms
        self._target_ms = start_ms
        #: work handed to threads and not yet back
        self.threads_busy = 0
        #: wait in real time (shutting down: the executor's threads are joined)
        self.real_time = False
        # timers within a microsecond of now are due (the clock moves in whole ms)
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return (self.now_ms - self._start_ms) / 1000.0

    def run_until(self, target_ms: int) -> None:
        """Run until nothing is left to do before ``target_ms`` (virtual), then stop with the
        clock there (never back)."""
        self._target_ms = max(target_ms, self.now_ms)
        self.run_forever()

    def idle_until(self, timeout: float | None) -> None:
        """Nothing is ready: jump to the next timer (``timeout`` s away; None: there is none)
        if it falls by the target, else to the target and stop."""
        if timeout is not None:
            step = max(0, math.ceil(timeout * 1000 - _SLACK_MS))
            if self.now_ms + step <= self._target_ms:
                self.now_ms += step
                return
        self.now_ms = max(self.now_ms, self._target_ms)
        self.stop()

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_busy += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self.threads_busy -= 1

    def close(self) -> None:
        if not self.is_closed():
            self.real_time = True
            self.run_until_complete(self.shutdown_default_executor())
        super().close()
