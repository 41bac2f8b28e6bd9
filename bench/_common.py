"""Small helpers the benchmark scripts share: progress lines, percentiles, CPU time, ports, and
the smoke mode (``--smoke``) that every benchmark has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from statefun._testing.ports import free_port as free_port

__all__ = [
    "SMOKE_HELP",
    "BenchmarkCheckError",
    "cpu_seconds",
    "expect",
    "free_port",
    "percentile",
    "progress",
    "smoke_banner",
    "terminate",
]


SMOKE_HELP = (
    "a check that the benchmark still runs: every scenario at tiny sizes for a few seconds; "
    "exits non-zero if anything fails (the figures mean nothing)"
)


class BenchmarkCheckError(RuntimeError):
    """A benchmark's own correctness check failed (a count off, a record twice, ...)."""


def expect(condition: bool, message: str) -> None:
    """Fail the run with ``message`` unless ``condition`` holds."""
    if not condition:
        raise BenchmarkCheckError(message)


def smoke_banner() -> None:
    """The first line of a smoke run's results on stdout."""
    print("SMOKE RUN (--smoke): tiny sizes to check that the benchmark runs; figures meaningless")
    print()


def progress(text: str) -> None:
    """A progress line on stderr (stdout is for the results)."""
    print(text, file=sys.stderr, flush=True)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of already sorted values; NaN if there are none."""
    if not len(sorted_values):
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one when ``pid`` is None)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def terminate(process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it after ``timeout`` seconds."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
