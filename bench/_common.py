"""Small helpers the benchmark scripts share: progress lines, percentiles, CPU time, ports."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["cpu_seconds", "free_port", "percentile", "progress"]


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
