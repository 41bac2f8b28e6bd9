"""When ``statefun run`` restarts a failed job, and after how long (Flink's restart strategies).

* ``failure-rate`` (the default): a failure is restarted unless more than
  ``restart_failure_rate_max_failures`` failures (this one included) fall within the last
  ``restart_failure_rate_interval_ms``; then the process ends. Unrelated failures spread over
  a long life never add up.
* ``exponential``: at most ``restart_attempts`` restarts in a row; a run that lasted
  ``restart_backoff_reset_ms`` before failing starts the count again.
* ``fixed-delay``: at most ``restart_attempts`` restarts in the process's life, each after
  ``restart_delay_ms`` (as Flink's).
* ``none``: never.

The delay (all but ``fixed-delay``) starts at ``restart_delay_ms`` and doubles with each
restart, up to 60 s, and starts again from ``restart_delay_ms`` after a run that lasted
``restart_backoff_reset_ms``. The clock is injectable so the rules can be tested without
waiting.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_DELAY_S", "RestartPolicy"]

MAX_DELAY_S = 60.0


class RestartPolicy:
    """Decides, at each failure of a job, whether to restart it and after what delay."""

    def __init__(self, settings: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.strategy: str = settings.restart_strategy
        self.attempts_allowed: int = settings.restart_attempts
        self.base_delay_s = settings.restart_delay_ms / 1000.0
        self.max_failures: int = settings.restart_failure_rate_max_failures
        self.interval_s = settings.restart_failure_rate_interval_ms / 1000.0
        self.reset_s = settings.restart_backoff_reset_ms / 1000.0
        self._clock = clock
        self._started = clock()
        self._failures: deque[float] = deque()  # failure times within the interval
        #: restarts counted by the strategy (in a row, or in the process's life)
        self.restarts = 0
        self._backoff = 0  # restarts since the delay last started again

    def started(self) -> None:
        """A run of the job starts now."""
        self._started = self._clock()

    def failed(self) -> tuple[float | None, str]:
        """The job failed now: the delay before restarting it (None: do not restart) and a
        short description for the log (``restart 2 (2 failures in 60 s)``)."""
        now = self._clock()
        healthy = self.reset_s > 0 and now - self._started >= self.reset_s
        if healthy:
            self._backoff = 0
            if self.strategy == "exponential":
                self.restarts = 0
        if self.strategy == "none":
            return None, "restart_strategy is none"
        if self.strategy == "failure-rate":
            self._failures.append(now)
            while self._failures and now - self._failures[0] > self.interval_s:
                self._failures.popleft()
            if len(self._failures) > self.max_failures:
                return None, (
                    f"{len(self._failures)} failures within "
                    f"{self.interval_s:g} s, more than restart_failure_rate_max_failures="
                    f"{self.max_failures}"
                )
            what = (
                f"{len(self._failures)} of at most {self.max_failures} failures "
                f"in {self.interval_s:g} s"
            )
        else:
            if self.restarts >= self.attempts_allowed:
                return None, f"{self.restarts} restarts already (restart_attempts)"
            what = f"{self.restarts + 1} of {self.attempts_allowed}"
        self.restarts += 1
        self._backoff += 1
        if self.strategy == "fixed-delay":
            delay = self.base_delay_s
        else:
            delay = min(MAX_DELAY_S, self.base_delay_s * 2 ** (self._backoff - 1))
        return delay, what
