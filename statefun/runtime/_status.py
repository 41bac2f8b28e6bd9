"""What a running job did, gathered from its counters: the admin server's ``/status`` details
and the figures ``/metrics`` (``_metrics.py``) and the progress line read.

Every figure is read when asked for, from plain counters the runtime keeps as it works
(``_stats.py``, the dispatchers, the outputs, the checkpoint coordinator): nothing here runs
on the hot path. ``ObservedJob`` is what is read of the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from statefun.checkpoint.coordinator import CheckpointCoordinator
    from statefun.egress.base import Sink
    from statefun.ingress.base import Source
    from statefun.runtime._functions import FunctionRegistry
    from statefun.runtime._outputs import Outputs
    from statefun.runtime._remote import RemoteClient
    from statefun.runtime._stats import FunctionStats, IngressStats, LoopLag
    from statefun.runtime._timers import TimerService

__all__ = [
    "CumulativeStatus",
    "ObservedJob",
    "ObservedSubtask",
    "function_stats",
    "mailboxes",
    "status_details",
]


class ObservedSubtask(Protocol):
    """A dispatcher subtask, as read here."""

    @property
    def busy(self) -> Mapping[tuple[str, str], Sequence[Any]]: ...
    @property
    def mailbox_max(self) -> Mapping[str, int]: ...
    @property
    def waiting_for_slot(self) -> int: ...


class ObservedJob(Protocol):
    """What is read of a running job (``runtime/_job.py``'s ``Job``)."""

    @property
    def functions(self) -> FunctionRegistry: ...
    @property
    def dispatchers(self) -> Sequence[ObservedSubtask]: ...
    @property
    def client(self) -> RemoteClient: ...
    @property
    def outputs(self) -> Outputs: ...
    @property
    def sources(self) -> Sequence[Source]: ...
    @property
    def sinks(self) -> Mapping[str, Sink]: ...
    @property
    def timers(self) -> TimerService: ...
    @property
    def ingress_stats(self) -> Mapping[str, IngressStats]: ...
    @property
    def loop_lag(self) -> LoopLag: ...
    @property
    def checkpoints(self) -> CheckpointCoordinator | None: ...
    @property
    def pending(self) -> int: ...
    @property
    def pending_remote(self) -> int: ...
    @property
    def dead_letters(self) -> int: ...


def function_stats(job: ObservedJob) -> Iterable[tuple[str, FunctionStats]]:
    """(typename, its counts) of every function type known so far, sorted by typename."""
    return sorted(((f.typename, f.stats) for f in job.functions.known()), key=lambda p: p[0])


def mailboxes(job: ObservedJob) -> tuple[dict[str, int], dict[str, int]]:
    """Per function type: messages waiting in its addresses' mailboxes now (behind a batch in
    flight), and the longest mailbox one of its addresses had."""
    current: dict[str, int] = {}
    longest: dict[str, int] = {}
    for dispatcher in job.dispatchers:
        for (typename, _), mailbox in list(dispatcher.busy.items()):
            current[typename] = current.get(typename, 0) + len(mailbox)
        for typename, size in dispatcher.mailbox_max.items():
            longest[typename] = max(longest.get(typename, 0), size)
    return current, longest


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def status_details(job: ObservedJob) -> dict[str, Any]:
    """The per-part figures of ``GET /status`` (beside the job-wide counters)."""
    current, _ = mailboxes(job)
    checkpoints = job.checkpoints
    return {
        "functions": {
            typename: {
                "invocations": stats.invocations,
                "messages_in": stats.messages_in,
                "messages_out": stats.messages_out,
                "failures": stats.failures,
                "mailbox": current.get(typename, 0),
            }
            for typename, stats in function_stats(job)
        },
        "ingresses": {
            ingress_id: {
                "records": stats.records,
                "blocked_seconds": round(stats.blocked_seconds, 3),
            }
            for ingress_id, stats in sorted(job.ingress_stats.items())
        },
        "egresses": {
            egress_id: {"records": job.outputs.egress_records.get(egress_id, 0)}
            for egress_id in sorted(job.sinks)
        },
        "endpoints": {
            origin: {
                "calls": stats.calls,
                "errors": stats.errors,
                "retries": stats.retries,
                "latency_p99_ms": _ms(stats.latency.quantile(0.99)),
            }
            for origin, stats in sorted(job.client.endpoints.items())
        },
        "checkpoint_history": [] if checkpoints is None else list(checkpoints.history),
        "dead_letters": job.dead_letters,
    }


#: The counters of ``GET /status`` (the rest are gauges, text or history): a name maps to True
#: (a counter) or to the counters under it, ``"*"`` standing for any key.
_COUNTERS: dict[str, Any] = {
    "invocations": True,
    "dead_letters": True,
    "checkpoints": {"completed": True},
    "functions": {
        "*": {n: True for n in ("invocations", "messages_in", "messages_out", "failures")}
    },
    "ingresses": {"*": {"records": True, "blocked_seconds": True}},
    "egresses": {"*": {"records": True}},
    "endpoints": {"*": {"calls": True, "errors": True, "retries": True}},
}


class CumulativeStatus:
    """The counters of ``GET /status`` across the jobs one process runs in turn (a cluster
    worker's, one per assignment): each the current job's plus the finished jobs' totals, as
    ``CumulativeMetrics`` does for ``/metrics``."""

    def __init__(self) -> None:
        self._carried: dict[str, Any] = {}

    def fold(self, status: Mapping[str, Any]) -> None:
        """Carry the counters of a job's last ``status``."""
        self._carried = _added(self._carried, status, _COUNTERS, keep_other=False)

    def added(self, status: Mapping[str, Any]) -> dict[str, Any]:
        """``status`` with the carried totals added to its counters."""
        return _added(status, self._carried, _COUNTERS, keep_other=True)


def _added(
    status: Mapping[str, Any],
    carried: Mapping[str, Any],
    pattern: Mapping[str, Any],
    keep_other: bool,
) -> dict[str, Any]:
    """The counters of ``status`` plus those of ``carried`` (both shaped as /status) where
    ``pattern`` names them; the other entries of ``status`` as they are (``keep_other``)."""
    out: dict[str, Any] = {}
    for name in [*status, *(name for name in carried if name not in status)]:
        rule = pattern.get(name, pattern.get("*"))
        value, base = status.get(name), carried.get(name)
        if rule is True:
            if isinstance(value, (int, float)) or isinstance(base, (int, float)):
                out[name] = (value or 0) + (base or 0)
        elif isinstance(rule, dict) and (isinstance(value, Mapping) or isinstance(base, Mapping)):
            out[name] = _added(
                value if isinstance(value, Mapping) else {},
                base if isinstance(base, Mapping) else {},
                rule,
                keep_other,
            )
        elif keep_other and name in status:
            out[name] = value
    return out
