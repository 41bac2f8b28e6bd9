"""The progress line ``statefun run`` prints for people: rates, messages in flight, the last
checkpoint, dead letters. ``Progress.take`` reads a job's counters; ``line`` is pure (two
readings and the time between them in, one line of text out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statefun.runtime._status import ObservedJob

__all__ = ["Reading", "line", "take"]


@dataclass(frozen=True)
class Reading:
    """A job's counters at one moment (``at``: monotonic seconds)."""

    at: float
    records_in: int  # records the ingresses handed over
    records_out: int  # records written to egresses
    in_flight: int
    dead_letters: int
    checkpoint_id: int | None  # the last completed checkpoint; None: none yet
    checkpoint_ago: float | None  # seconds since it completed
    checkpoint_ms: float  # how long it took
    checkpoints_on: bool


def take(job: ObservedJob) -> Reading:
    """The counters of ``job`` now."""
    checkpoints = job.checkpoints
    last = None if checkpoints is None else checkpoints.last
    ago = None
    if checkpoints is not None and checkpoints.last_completed_at:
        ago = max(0.0, time.time() - checkpoints.last_completed_at)
    return Reading(
        at=time.monotonic(),
        records_in=sum(stats.records for stats in job.ingress_stats.values()),
        records_out=sum(job.outputs.egress_records.values()),
        in_flight=job.pending,
        dead_letters=job.dead_letters,
        checkpoint_id=None if last is None else last.id,
        checkpoint_ago=ago,
        checkpoint_ms=0.0 if checkpoints is None else checkpoints.last_duration_ms,
        checkpoints_on=checkpoints is not None,
    )


def _rate(count: int) -> str:
    return f"{count:,.0f}"


def line(before: Reading, now: Reading) -> str:
    """One line about what happened between two readings."""
    seconds = max(now.at - before.at, 1e-9)
    rate_in = (now.records_in - before.records_in) / seconds
    rate_out = (now.records_out - before.records_out) / seconds
    if not now.checkpoints_on:
        checkpoint = "checkpoints off"
    elif now.checkpoint_id is None or now.checkpoint_ago is None:
        checkpoint = "no checkpoint yet"
    else:
        checkpoint = (
            f"checkpoint {now.checkpoint_id} {now.checkpoint_ago:.1f} s ago "
            f"({now.checkpoint_ms:.0f} ms)"
        )
    return (
        f"{_rate(round(rate_in))} in/s, {_rate(round(rate_out))} out/s, "
        f"{now.in_flight:,} in flight, {checkpoint}, {now.dead_letters:,} dead letters"
    )
