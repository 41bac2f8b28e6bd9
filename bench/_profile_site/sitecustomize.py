"""Profiling for ``bench/cluster.py --profile DIR``: on this folder's path (``PYTHONPATH``) with
``BENCH_PROFILE_DIR`` set, every Python process of the runtime's tree profiles each of its
threads (cProfile, one profile per thread) and at exit writes ``<pid>-<thread>.pstats`` and
``<pid>-threads.txt`` (each thread's CPU seconds from /proc) into that folder."""

from __future__ import annotations

import atexit
import contextlib
import cProfile
import os
import sys
import threading
import time
from pathlib import Path

_FOLDER = os.environ.get("BENCH_PROFILE_DIR", "")


def _install(folder: Path) -> None:
    profiles: list[tuple[str, cProfile.Profile]] = []
    ended: list[str] = []  # CPU seconds of each thread that ended
    main = cProfile.Profile()
    profiles.append(("main", main))
    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append((self.name, profile))
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()
            ended.append(f"{time.thread_time():8.2f} s  {self.name} (ended)")

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    clock = os.sysconf("SC_CLK_TCK")

    def thread_cpu() -> list[str]:
        lines = []
        for thread in threading.enumerate():
            stat = Path(f"/proc/self/task/{thread.native_id}/stat")
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seconds = (int(fields[11]) + int(fields[12])) / clock
            lines.append(f"{seconds:8.2f} s  {thread.name}")
        return lines

    def dump() -> None:
        main.disable()
        pid = os.getpid()
        argv = " ".join(sys.argv)
        folder.mkdir(parents=True, exist_ok=True)
        times = os.times()
        text = [f"# {argv}", f"{times.user + times.system:8.2f} s  process", *thread_cpu(), *ended]
        (folder / f"{pid}-threads.txt").write_text("\n".join(text) + "\n")
        for index, (name, profile) in enumerate(profiles):
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            with contextlib.suppress(TypeError, ValueError):
                profile.dump_stats(str(folder / f"{pid}-{index:02d}-{safe}.pstats"))

    atexit.register(dump)
    main.enable()


if _FOLDER:
    _install(Path(_FOLDER))
