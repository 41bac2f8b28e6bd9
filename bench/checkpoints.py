"""Checkpoints and exactly-once: what they cost in throughput, latency, stalls and recovery.

Four parts, all in one run (each measured in a fresh process, so that no run inherits the heap,
the GC generations or the page cache state of another):

1. **Throughput**: an embedded counter job (``bench/_function_server.py``: one IntType state
   per address, one egress record per message), 10,000 keys, a source that submits as fast as
   the runtime admits (backpressure), a transactional counting sink (two-phase commit, no
   I/O). Checkpoints every second (``checkpoint_interval_ms=1000``) against checkpoints off,
   same input, same process layout; memory and RocksDB backends; rounds alternate off/on.
   Goal: at most 10% fewer messages/s with checkpoints.
2. **Request-reply over the HTTP ingress with durable acknowledgement**: the runtime runs as
   its own process (``python -m statefun run <generated module.yaml> --set ...``) with
   ``checkpoint_dir`` set (so the HTTP ingress's write-ahead log is on: a request is handed
   to the runtime only once it is fsynced) and the embedded ``bench/call`` function, which
   increments a count and replies it to its caller. A separate load-generator process
   (``bench/_load_client.py``, aiohttp) keeps 64 calls in flight, over (a) 1,000 keys and
   (b) one hot key, with ``reply_release=immediate`` (checkpoints every 1,000 ms) and
   ``reply_release=on-checkpoint`` (checkpoints every ``--reply-interval-ms``, 20 ms by
   default). The client checks that each key's replies are exactly 1..n. Reference, measured
   elsewhere on this kind of machine: Restate 1.7 with a Python service, about 900
   requests/s with a p99 of about 130 ms. Goal: at least 3x its throughput, lower p99.
3. **Checkpoint duration and the longest processing stall** with 100,000 and 1,000,000 keys
   of state (loaded into the backend before the job starts), each backend, while a steady
   stream of ``--rate`` messages/s (20,000) goes through the counter over all keys. A ticker
   task sleeps 1 ms at a time and records how late it wakes up (event-loop lag); the
   coordinator's ``max_stall_ms`` is the synchronous cut. Also: message latency (submit to
   sink) and the longest cyclic-GC pause.
4. **Recovery** from the checkpoint of 1,000,000 keys that part 3 left (its final
   checkpoint): a new job in a new process restores it and processes one new message; the
   time from creating the job to that message at the sink, the ``restore()`` part of it, and
   from spawning the process (interpreter start and imports included).

    .venv/bin/python bench/checkpoints.py            # full run, about 5 minutes
    .venv/bin/python bench/checkpoints.py --quick    # a short run, about 2 minutes
    .venv/bin/python bench/checkpoints.py --only 2   # one part (repeatable)
    .venv/bin/python bench/checkpoints.py --only 1 --admin --set timeline_invocations=0
        # part 1 with an admin server running, and a runtime setting
    .venv/bin/python bench/checkpoints.py --smoke    # does it still run? (about 40 s)

Progress goes to stderr; Markdown tables and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    SMOKE_HELP,
    cpu_seconds,
    expect,
    free_port,
    percentile,
    progress,
    smoke_banner,
)
from bench._function_server import CALL, COUNTER, OUT  # noqa: E402
from statefun import IntType  # noqa: E402
from statefun._keygroups import key_group_for  # noqa: E402
from statefun._settings import Settings  # noqa: E402
from statefun.egress.base import EgressRecord, Sink  # noqa: E402
from statefun.ingress.base import IngressContext, Source  # noqa: E402
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec  # noqa: E402
from statefun.runtime import Job  # noqa: E402
from statefun.runtime._commands import _settings_overrides  # noqa: E402
from statefun.sdk import TypedValue  # noqa: E402

FUNCTIONS = "bench._function_server:functions"
FUNCTIONS_FILE = ROOT / "bench" / "_function_server.py"
LOAD_CLIENT = ROOT / "bench" / "_load_client.py"
THROUGHPUT_KEYS = 10_000
RESTATE_RPS = 900.0
RESTATE_P99_MS = 130.0
INT = IntType.typename
_serialize_int = IntType.serializer().serialize
_deserialize_int = IntType.serializer().deserialize
clock = time.perf_counter


# -- source and sink of the in-process jobs (parts 1, 3, 4) ------------------------------------


class CounterSource(Source):
    """Messages to ``bench/counter`` over ``keys`` ids in turn, carrying their sequence number.

    ``rate`` None: as fast as the runtime admits; otherwise a steady ``rate`` per second (it
    catches up after a stall). ``limit``: stop after that many messages (then idle). The
    position (the next sequence number) moves in the same loop step as the message enters.
    """

    def __init__(
        self, keys: int, rate: float | None = None, limit: int | None = None, keep: bool = False
    ) -> None:
        super().__init__("bench/source")
        self.ids = [f"k{i}" for i in range(keys)]
        self.rate = rate
        self.limit = limit
        self.seq = 0
        self.first_seq = 0
        #: time each message was admitted, indexed by seq - first_seq (when ``keep``)
        self.admitted: array[float] | None = array("d") if keep else None

    def snapshot_position(self) -> Any:
        return {"seq": self.seq}

    async def restore_position(self, position: Any) -> None:
        self.seq = self.first_seq = int(position["seq"])

    async def run(self, context: IngressContext) -> None:
        ids, n_ids = self.ids, len(self.ids)
        admitted = self.admitted
        sent = 0
        started = clock()
        while True:
            if self.limit is not None and sent >= self.limit:
                await asyncio.Event().wait()
            if self.rate is None:
                due = sent + 1
            else:
                due = int((clock() - started) * self.rate)
                if self.limit is not None:
                    due = min(due, self.limit)
            while sent < due:
                await context.room()
                seq = self.seq
                context.emit(COUNTER, ids[seq % n_ids], TypedValue(INT, _serialize_int(seq)))
                self.seq = seq + 1
                if admitted is not None:
                    admitted.append(clock())
                sent += 1
            if self.rate is not None:
                await asyncio.sleep(0.001)


class CountingSink(Sink):
    """A transactional sink without I/O: counts records; keeps their times if asked."""

    transactional = True

    def __init__(self, keep: bool = False) -> None:
        super().__init__(OUT)
        self.count = 0
        self.first_at: float | None = None
        self.first_wall: float | None = None
        self.keep = keep
        self.times: array[float] = array("d")
        self.seqs: array[int] = array("q")

    def write(self, record: EgressRecord) -> None:
        self.count += 1
        if self.first_at is None:
            self.first_at = clock()
            self.first_wall = time.time()
        if self.keep:
            self.times.append(clock())
            self.seqs.append(_deserialize_int(record.value.value))

    def pre_commit(self, checkpoint_id: int) -> Any:
        return {"records": self.count}


def make_job(
    backend: str,
    tmp: Path,
    checkpoints: bool,
    source: Source,
    sink: Sink,
    interval_ms: int = 1000,
    timeline: int = Settings.timeline_invocations,
    admin_port: int = 0,
    overrides: dict[str, Any] | None = None,
) -> Job:
    settings = Settings.load(
        {
            "state_backend": backend,
            "state_dir": str(tmp / "state"),
            "checkpoint_dir": str(tmp / "checkpoints") if checkpoints else "",
            "checkpoint_interval_ms": str(interval_ms),
            "dead_letter_path": str(tmp / "dead-letters.jsonl"),
            "timeline_invocations": str(timeline),
            "admin_port": str(admin_port),
            **(overrides or {}),
        },
        environ={},
    )
    endpoint = EmbeddedEndpointSpec(FunctionTarget("bench", None), FUNCTIONS)
    return Job(ModuleSpec(endpoints=(endpoint,)), settings, sources=[source], sinks=[sink])


class GcWatch:
    """Cyclic-GC pauses: the longest, the number of full (generation 2) collections, and
    when each pause of 1 ms or more happened (to tell GC stalls from checkpoint stalls)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.full = 0
        self.pauses: list[tuple[float, float]] = []
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = clock()
            return
        ended = clock()
        self.longest = max(self.longest, ended - self._started)
        if ended - self._started >= 0.001:
            self.pauses.append((self._started, ended))
        if info.get("generation") == 2:
            self.full += 1

    def reset(self) -> None:
        self.longest = 0.0
        self.full = 0

    def overlaps(self, began: float, ended: float) -> bool:
        k = bisect.bisect_right(self.pauses, (ended, float("inf"))) - 1
        return k >= 0 and self.pauses[k][1] >= began

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


async def _wait(
    seconds: float, running: asyncio.Task[None], label: str, sink: CountingSink
) -> None:
    end = clock() + seconds
    while (left := end - clock()) > 0:
        count, began = sink.count, clock()
        await asyncio.sleep(min(1.0, left))
        if running.done():
            await running
            raise RuntimeError(f"{label}: the job stopped by itself")
        progress(f"    {label}: {(sink.count - count) / (clock() - began):,.0f} messages/s")


# -- part 1: throughput, checkpoints on and off (child process) --------------------------------


async def child_throughput(spec: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(spec["tmp"])
    sink = CountingSink()
    source = CounterSource(spec["keys"])
    job = make_job(
        spec["backend"],
        tmp,
        spec["checkpoints"],
        source,
        sink,
        spec.get("interval_ms", 1000),
        spec.get("timeline", Settings.timeline_invocations),
        spec.get("admin_port", 0),
        spec.get("settings"),
    )
    label = f"{spec['backend']}, checkpoints {'on' if spec['checkpoints'] else 'off'}"
    cuts: dict[int, float] = {}
    durations: list[tuple[float, float]] = []  # (committed at, cut -> committed seconds)

    def hook(step: str, checkpoint_id: int) -> None:
        if step == "cut":
            cuts[checkpoint_id] = clock()
        elif step == "committed" and checkpoint_id in cuts:
            durations.append((clock(), clock() - cuts[checkpoint_id]))

    job.checkpoint_hook = hook
    running = asyncio.get_running_loop().create_task(job.run())
    await _wait(spec["warmup"], running, label + " (warm-up)", sink)
    coordinator = job.checkpoints
    completed0 = coordinator.completed if coordinator else 0
    if coordinator is not None:
        coordinator.max_stall_ms = 0.0
    cpu0, count0, t0 = cpu_seconds(), sink.count, clock()
    await _wait(spec["seconds"], running, label, sink)
    cpu1, count1, t1 = cpu_seconds(), sink.count, clock()
    measured = [d for at, d in durations if t0 <= at <= t1]
    result: dict[str, Any] = {
        "messages_per_s": (count1 - count0) / (t1 - t0),
        "messages_per_cpu_s": (count1 - count0) / max(1e-9, cpu1 - cpu0),
        "duration_mean_ms": 1000 * sum(measured) / len(measured) if measured else None,
        "cpu_percent": 100 * (cpu1 - cpu0) / (t1 - t0),
        "checkpoints": (coordinator.completed - completed0) if coordinator else 0,
        "max_stall_ms": coordinator.max_stall_ms if coordinator else None,
        "last_duration_ms": coordinator.last_duration_ms if coordinator else None,
    }
    job.stop()
    await running
    expect(count1 > count0, f"{label}: no message reached the sink while measuring")
    expect(
        not spec["checkpoints"] or result["checkpoints"] > 0,
        f"{label}: no checkpoint completed while measuring",
    )
    return result


# -- part 3: checkpoint duration and stalls under a steady stream (child process) -------------


def _fill(job: Job, keys: int) -> float:
    started = clock()
    state = job.state
    max_p = job.settings.max_parallelism
    for i in range(keys):
        id_ = f"k{i}"
        state.put(
            key_group_for(COUNTER, id_, max_p),
            (COUNTER, id_),
            {"count": TypedValue(INT, _serialize_int(i))},
        )
    return clock() - started


async def child_stall(spec: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(spec["tmp"])
    keys = spec["keys"]
    sink = CountingSink(keep=True)
    source = CounterSource(keys, rate=spec["rate"], keep=True)
    job = make_job(spec["backend"], tmp, True, source, sink, spec.get("interval_ms", 1000))
    label = f"{spec['backend']}, {keys:,} keys"
    progress(f"    {label}: loading the state")
    fill_s = _fill(job, keys)
    progress(f"    {label}: state loaded in {fill_s:.1f} s")
    cuts: dict[int, float] = {}
    commits: dict[int, float] = {}

    def hook(step: str, checkpoint_id: int) -> None:
        if step == "cut":
            cuts[checkpoint_id] = clock()
        elif step == "committed":
            commits[checkpoint_id] = clock()

    job.checkpoint_hook = hook
    lag_at: array[float] = array("d")
    lags: array[float] = array("d")

    async def ticker() -> None:
        while True:
            began = clock()
            await asyncio.sleep(0.001)
            now = clock()
            lag_at.append(now)
            lags.append(now - began - 0.001)

    gc_watch = GcWatch()
    loop = asyncio.get_running_loop()
    t_start = clock()
    running = loop.create_task(job.run())
    ticking = loop.create_task(ticker())
    try:
        await _wait(spec["warmup"], running, label + " (warm-up)", sink)
        coordinator = job.checkpoints
        assert coordinator is not None
        gc_watch.reset()
        t0 = clock()
        await _wait(spec["seconds"], running, label, sink)
        t1 = clock()
        max_stall_ms = coordinator.max_stall_ms
        gc_longest, gc_full = gc_watch.longest, gc_watch.full
    finally:
        ticking.cancel()
        gc_watch.close()
    progress(f"    {label}: stopping (a final checkpoint)")
    stop_started = clock()
    job.stop()
    await running
    final_ms = (clock() - stop_started) * 1000

    # Every checkpoint of the run before the stop (warm-up included): cut -> committed; one
    # still running at t1 counts as running until t1.
    done = [commits[i] - cuts[i] for i in sorted(cuts) if i in commits and commits[i] <= t1]
    running_at_end = [t1 - cuts[i] for i in cuts if cuts[i] <= t1 and commits.get(i, t1 + 1) > t1]
    windows = [(cuts[i], min(commits.get(i, t1), t1)) for i in sorted(cuts) if cuts[i] <= t1]
    lo, hi = bisect.bisect_left(lag_at, t0), bisect.bisect_right(lag_at, t1)
    during: list[float] = []
    outside: list[float] = []
    without_gc: list[float] = []
    starts = [w[0] for w in windows]
    for i in range(lo, hi):
        at, lag = lag_at[i], lags[i]
        # the tick that ended at ``at`` began about lag + 1 ms earlier
        began = at - lag - 0.001
        k = bisect.bisect_right(starts, at) - 1
        if k >= 0 and began <= windows[k][1]:
            during.append(lag)
        else:
            outside.append(lag)
        if not gc_watch.overlaps(began, at):
            without_gc.append(lag)
    all_lags = sorted(lags[lo:hi])
    times, seqs, admitted = sink.times, sink.seqs, source.admitted
    assert admitted is not None
    expect(len(set(seqs)) == len(seqs), f"{label}: a message reached the sink twice")
    expect(bool(done), f"{label}: no checkpoint completed while running")
    a, b = bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)
    latencies = sorted(times[i] - admitted[seqs[i] - source.first_seq] for i in range(a, b))
    return {
        "fill_s": fill_s,
        "window_s": t1 - t0,
        "rate": (b - a) / (t1 - t0),
        "run_s": t1 - t_start,
        "checkpoints": len(done),
        "duration_mean_ms": 1000 * sum(done) / len(done) if done else None,
        "duration_max_ms": 1000 * max(done) if done else None,
        "running_at_end_s": running_at_end[0] if running_at_end else None,
        "max_stall_ms": max_stall_ms,
        "lag_max_ms": 1000 * all_lags[-1] if all_lags else None,
        "lag_p99_ms": 1000 * percentile(all_lags, 0.99),
        "lag_max_during_ms": 1000 * max(during) if during else None,
        "lag_max_outside_ms": 1000 * max(outside) if outside else None,
        "lag_max_without_gc_ms": 1000 * max(without_gc) if without_gc else None,
        "latency_p50_ms": 1000 * percentile(latencies, 0.50),
        "latency_p99_ms": 1000 * percentile(latencies, 0.99),
        "latency_max_ms": 1000 * latencies[-1] if latencies else None,
        "gc_longest_ms": 1000 * gc_longest,
        "gc_full": gc_full,
        "final_checkpoint_ms": final_ms,
    }


# -- part 4: recovery (child process) ----------------------------------------------------------


async def child_recover(spec: dict[str, Any]) -> dict[str, Any]:
    tmp = Path(spec["tmp"])
    keys = spec["keys"]
    shutil.rmtree(tmp / "state", ignore_errors=True)  # a new machine: only the checkpoint
    started = clock()
    sink = CountingSink()
    source = CounterSource(keys, limit=1)
    job = make_job(spec["backend"], tmp, True, source, sink)
    restore_s: list[float] = []
    restore = job.state.restore

    def timed_restore(*args: Any, **kwargs: Any) -> None:
        began = clock()
        restore(*args, **kwargs)
        restore_s.append(clock() - began)

    job.state.restore = timed_restore  # type: ignore[method-assign]
    # The check for state of lost function types, part of recovery: timed on its own.
    from statefun.checkpoint import recovery

    check_s: list[float] = []
    check = recovery._check_function_types

    def timed_check(*args: Any, **kwargs: Any) -> None:
        began = clock()
        check(*args, **kwargs)
        check_s.append(clock() - began)

    recovery._check_function_types = timed_check
    running = asyncio.get_running_loop().create_task(job.run())
    while sink.first_at is None:
        if running.done():
            await running
            raise RuntimeError("recovery: the job stopped before processing a message")
        await asyncio.sleep(0.0005)
    first_s = sink.first_at - started
    first_wall = sink.first_wall
    # The state is there: the last key's count is at least the value it was loaded with.
    last = job.state.get(
        key_group_for(COUNTER, f"k{keys - 1}", job.settings.max_parallelism),
        (COUNTER, f"k{keys - 1}"),
    )
    if last is None or _deserialize_int(last["count"].value) < keys - 1:
        raise RuntimeError(f"recovery: the state of k{keys - 1} is missing or wrong: {last!r}")
    job.stop()
    await running
    return {
        "restore_s": sum(restore_s),
        "check_s": sum(check_s),
        "first_message_s": first_s,
        "first_wall": first_wall,
        "checkpoint": str(job.checkpoints.last.path)
        if job.checkpoints and job.checkpoints.last
        else None,
    }


CHILDREN = {"throughput": child_throughput, "stall": child_stall, "recover": child_recover}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one child spec in a new process; its last stdout line is the JSON result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    spawned = time.time()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"child {spec['kind']} failed with exit code {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["spawned_wall"] = spawned
    return dict(result)


def child_main(raw: str) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = json.loads(raw)
    result = asyncio.run(CHILDREN[spec["kind"]](spec))
    print(json.dumps(result), flush=True)
    return 0


# -- part 2: request-reply over the HTTP ingress, runtime and client in processes --------------


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def runtime_process(
    tmp: Path, settings: dict[str, str], ingress_port: int, checkout: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """``statefun run`` of this checkout, or of another one (``checkout``: in its own
    virtualenv ``checkout/.venv`` if it has one, else its ``statefun`` package comes first on
    the path and the top-level ingress/, egress/ and sdk/ folders still come from the installed
    one)."""
    module = tmp / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\n"
        "spec:\n"
        "  functions: bench/*\n"
        f"  module: {FUNCTIONS_FILE}:functions\n"
        "---\n"
        "kind: io.pystatefun.http.v1/ingress\n"
        "spec:\n"
        "  id: bench/http\n"
        f"  port: {ingress_port}\n"
    )
    # Another checkout with a virtualenv of its own (``make lint`` there) runs in it.
    python = checkout / ".venv" / "bin" / "python"
    own_venv = checkout != ROOT and python.is_file()
    executable = str(python) if own_venv else sys.executable
    command = [executable, "-m", "statefun", "run", str(module), "--log-level", "warning"]
    for name, value in settings.items():
        command += ["--set", f"{name}={value}"]
    progress(f"    runtime: {' '.join(command[1:])}")
    log_path = tmp / "runtime.log"
    with log_path.open("wb") as log_file:
        env = {**os.environ, "PYTHONPATH": str(checkout)} if checkout != ROOT else None
        if own_venv:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        process = subprocess.Popen(
            command, cwd=checkout, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the runtime exited with {process.returncode}:\n{log_path.read_text()}"
                )
            try:
                _get_json(f"http://127.0.0.1:{ingress_port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the runtime did not answer /health within 30 s") from None
                time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        errors = [
            line
            for line in log_path.read_text(errors="replace").splitlines()
            if "ERROR" in line or "Traceback" in line
        ]
        if errors:
            progress("    runtime log has errors:\n      " + "\n      ".join(errors[:10]))


def http_scenario(
    keys: int, release: str, interval_ms: int, backend: str, args: argparse.Namespace
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-http-"))
    ingress_port, admin_port = free_port(), free_port()
    settings = {
        "checkpoint_dir": str(tmp / "checkpoints"),
        "checkpoint_interval_ms": str(interval_ms),
        "reply_release": release,
        "state_backend": backend,
        "state_dir": str(tmp / "state"),
        "admin_port": str(admin_port),
        "dead_letter_path": str(tmp / "dead-letters.jsonl"),
        **_settings_overrides(args.set),
    }
    try:
        with runtime_process(tmp, settings, ingress_port) as runtime:
            started = time.monotonic()
            cpu0 = cpu_seconds(runtime.pid)
            client = subprocess.run(
                [
                    sys.executable,
                    str(LOAD_CLIENT),
                    "--url",
                    f"http://127.0.0.1:{ingress_port}",
                    "--typename",
                    CALL,
                    "--concurrency",
                    str(args.concurrency),
                    "--keys",
                    str(keys),
                    "--warmup",
                    str(args.warmup),
                    "--seconds",
                    str(args.seconds),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                timeout=args.warmup + args.seconds + 120,
            )
            elapsed = time.monotonic() - started
            cpu1 = cpu_seconds(runtime.pid)
            if client.returncode != 0:
                raise RuntimeError(f"the load client failed with exit code {client.returncode}")
            result: dict[str, Any] = json.loads(client.stdout.strip().splitlines()[-1])
            status = _get_json(f"http://127.0.0.1:{admin_port}/status")
        expect(
            result["exact"] and result["ok"] > 0,
            f"{keys} key(s), {release}, {backend}: the replies are not exactly 1..n per key "
            f"({result['ok']} ok, {result['failed']} failed, "
            f"{result['duplicate_replies']} duplicates)",
        )
        wal = tmp / "http-wal"
        result.update(
            keys=keys,
            backend=backend,
            release=release,
            interval_ms=interval_ms,
            runtime_cpu_percent=100 * (cpu1 - cpu0) / elapsed,
            checkpoints_per_s=status["checkpoints"]["completed"] / elapsed,
            checkpoint_last_ms=status["checkpoints"]["last_duration_ms"],
            checkpoint_max_stall_ms=status["checkpoints"]["max_stall_ms"],
            wal_exists=wal.is_dir(),
        )
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the parent: parts 1 to 4 ------------------------------------------------------------------


@dataclass
class Report:
    throughput: list[dict[str, Any]] = field(default_factory=list)
    http: list[dict[str, Any]] = field(default_factory=list)
    stall: list[dict[str, Any]] = field(default_factory=list)
    recover: list[dict[str, Any]] = field(default_factory=list)


def part_throughput(args: argparse.Namespace, report: Report) -> None:
    progress(f"1. throughput, embedded counter, {THROUGHPUT_KEYS:,} keys, {args.rounds} round(s)")
    for backend in args.backends:
        for round_ in range(args.rounds):
            for on in (False, True):
                tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-tp-"))
                try:
                    spec = {
                        "kind": "throughput",
                        "tmp": str(tmp),
                        "backend": backend,
                        "checkpoints": on,
                        "keys": THROUGHPUT_KEYS,
                        "warmup": args.warmup,
                        "seconds": args.seconds,
                        "interval_ms": args.interval_ms,
                        "admin_port": free_port() if args.admin else 0,
                        "settings": _settings_overrides(args.set),
                    }
                    progress(
                        f"  {backend}, checkpoints {'on' if on else 'off'}, round {round_ + 1}"
                    )
                    result = run_child(spec)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                result.update(backend=backend, on=on, round=round_ + 1)
                report.throughput.append(result)


def part_http(args: argparse.Namespace, report: Report) -> None:
    progress(f"2. request-reply over the HTTP ingress, WAL on, {args.concurrency} callers")
    scenarios = [("immediate", 1000, "memory")] if "immediate" in args.releases else []
    if "on-checkpoint" in args.releases:
        scenarios += [
            ("on-checkpoint", args.reply_interval_ms, backend) for backend in args.backends
        ]
    for keys in args.keys:
        for release, interval, backend in scenarios:
            progress(
                f"  {keys:,} key(s), reply_release={release}, checkpoints every {interval} ms, "
                f"{backend}"
            )
            report.http.append(http_scenario(keys, release, interval, backend, args))


def part_stall_and_recover(args: argparse.Namespace, report: Report) -> None:
    progress(f"3./4. checkpoints under a steady stream of {args.rate:,.0f} messages/s; recovery")
    for backend in args.backends:
        for keys in args.state_keys:
            tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-stall-"))
            try:
                seconds = args.seconds if keys < 1_000_000 else args.seconds * 1.5
                spec = {
                    "kind": "stall",
                    "tmp": str(tmp),
                    "backend": backend,
                    "keys": keys,
                    "rate": args.rate,
                    "warmup": min(args.warmup, 2.0),
                    "seconds": seconds,
                    "interval_ms": args.interval_ms,
                }
                progress(f"  {backend}, {keys:,} keys of state")
                result = run_child(spec)
                result.update(backend=backend, keys=keys)
                report.stall.append(result)
                if keys == max(args.state_keys) and 4 in args.only:
                    progress(f"  recovery: {backend}, {keys:,} keys, new process")
                    recovered = run_child(
                        {"kind": "recover", "tmp": str(tmp), "backend": backend, "keys": keys}
                    )
                    recovered.update(
                        backend=backend,
                        keys=keys,
                        process_s=recovered["first_wall"] - recovered["spawned_wall"],
                    )
                    report.recover.append(recovered)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


# -- output ------------------------------------------------------------------------------------


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def machine_note() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model or platform.processor()}, {os.cpu_count()} cores; load average {load}"


def versions() -> str:
    parts = [f"Python {platform.python_version()}"]
    for name in ("aiohttp", "rocksdict", "msgpack", "protobuf"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            parts.append(f"{name} {metadata.version(name)}")
    commit = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    if commit:
        parts.append(f"pystatefun at {commit} (+ working tree)")
    return ", ".join(parts)


def print_report(report: Report, args: argparse.Namespace) -> list[str]:
    verdicts: list[str] = []
    if report.throughput:
        print(f"\n### 1. Throughput, embedded counter, {THROUGHPUT_KEYS:,} keys\n")
        print(
            "| backend | checkpoints | messages/s per round | best | CPU % "
            "| messages per CPU-second, best | checkpoints done | mean duration | longest cut |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        best: dict[tuple[str, bool], float] = {}
        best_cpu: dict[tuple[str, bool], float] = {}
        for backend in args.backends:
            for on in (False, True):
                rows = [r for r in report.throughput if r["backend"] == backend and r["on"] == on]
                if not rows:
                    continue
                rates = [r["messages_per_s"] for r in rows]
                best[backend, on] = max(rates)
                best_cpu[backend, on] = max(r["messages_per_cpu_s"] for r in rows)
                cpu = sum(r["cpu_percent"] for r in rows) / len(rows)
                done = "-" if not on else " / ".join(str(r["checkpoints"]) for r in rows)
                stall = "-" if not on else f"{max(r['max_stall_ms'] for r in rows):.2f} ms"
                means = [r["duration_mean_ms"] for r in rows if r.get("duration_mean_ms")]
                mean = f"{sum(means) / len(means):,.0f} ms" if means else "-"
                print(
                    f"| {backend} | {f'every {args.interval_ms} ms' if on else 'off'} "
                    f"| {' / '.join(f'{x:,.0f}' for x in rates)} | {max(rates):,.0f} "
                    f"| {cpu:.0f} | {best_cpu[backend, on]:,.0f} | {done} | {mean} | {stall} |"
                )
        for backend in args.backends:
            if (backend, False) in best and (backend, True) in best:
                ratio = best[backend, True] / best[backend, False]
                cpu_ratio = best_cpu[backend, True] / best_cpu[backend, False]
                met = "met" if ratio >= 0.9 else "MISSED"
                verdicts.append(
                    f"- 1. {backend}: checkpoints every {args.interval_ms} ms keep {ratio:.1%} "
                    f"of the throughput without ({best[backend, True]:,.0f} / "
                    f"{best[backend, False]:,.0f} messages/s, best rounds; goal >= 90%: {met}); "
                    f"per CPU-second of the runtime process {cpu_ratio:.1%}"
                )
    if report.http:
        print(
            f"\n### 2. Request-reply over the HTTP ingress, WAL on, {args.concurrency} concurrent "
            "callers in a separate process\n"
        )
        print(
            "| keys | reply_release | checkpoint interval | backend | requests/s | p50 ms | p90 ms "
            "| p99 ms | max ms | x Restate (900/s) | CPU % runtime / client | checkpoints/s "
            "| replies exact |"
        )
        print("| ---: | --- | ---: | --- |" + " ---: |" * 7 + " --- | ---: | --- |")
        for r in report.http:
            print(
                f"| {r['keys']:,} | {r['release']} | {r['interval_ms']} ms | {r['backend']} "
                f"| {r['requests_per_s']:,.0f} "
                f"| {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
                f"| {r['requests_per_s'] / RESTATE_RPS:.2f}x "
                f"| {r['runtime_cpu_percent']:.0f} / {r['client_cpu_percent']:.0f} "
                f"| {r['checkpoints_per_s']:.1f} | {'yes' if r['exact'] else 'NO'} "
                f"({r['ok']:,} ok, {r['failed']} failed, {r['duplicate_replies']} dup) |"
            )
        for r in report.http:
            ratio = r["requests_per_s"] / RESTATE_RPS
            met = "met" if ratio >= 3 and r["p99_ms"] < RESTATE_P99_MS else "MISSED"
            verdicts.append(
                f"- 2. {r['keys']:,} key(s), {r['release']} ({r['interval_ms']} ms, "
                f"{r['backend']}): "
                f"{ratio:.2f}x Restate's 900 requests/s, p99 {r['p99_ms']:.0f} ms against 130 ms "
                f"(goal >= 3x and lower p99: {met})"
            )
    if report.stall:
        print(
            f"\n### 3. Checkpoints every {args.interval_ms} ms under a steady stream of "
            f"{args.rate:,.0f} messages/s\n"
        )
        print(
            "| backend | keys | checkpoints done (run) | duration mean / max | one still running "
            "| final, stream stopped | longest cut | loop lag max during / outside checkpoints "
            "| lag max, ticks without GC | lag p99 | message latency p50 / p99 / max "
            "| longest GC pause (full GCs) | rate kept |"
        )
        print("| --- |" + " ---: |" * 12)
        for r in report.stall:
            still = r["running_at_end_s"]
            print(
                f"| {r['backend']} | {r['keys']:,} | {r['checkpoints']} ({r['run_s']:.0f} s) "
                f"| {_f(r['duration_mean_ms'], ',.0f')} / {_f(r['duration_max_ms'], ',.0f')} ms "
                f"| {'-' if still is None else f'for {still:.1f} s'} "
                f"| {r['final_checkpoint_ms']:,.0f} ms | {r['max_stall_ms']:.2f} ms "
                f"| {_f(r['lag_max_during_ms'], ',.1f')} "
                f"/ {_f(r['lag_max_outside_ms'], ',.1f')} ms "
                f"| {_f(r['lag_max_without_gc_ms'], ',.1f')} ms | {r['lag_p99_ms']:,.1f} ms "
                f"| {r['latency_p50_ms']:,.1f} / {r['latency_p99_ms']:,.1f} "
                f"/ {_f(r['latency_max_ms'], ',.0f')} ms "
                f"| {r['gc_longest_ms']:,.0f} ms ({r['gc_full']}) | {r['rate']:,.0f}/s |"
            )
    if report.recover:
        print("\n### 4. Recovery from a checkpoint (new process, restore + first message)\n")
        print(
            "| backend | keys | state restore() | lost-type check | job created -> first message "
            "| process spawned -> first message |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in report.recover:
            print(
                f"| {r['backend']} | {r['keys']:,} | {r['restore_s']:.2f} s | {r['check_s']:.2f} s "
                f"| {r['first_message_s']:.2f} s | {r['process_s']:.2f} s |"
            )
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (about 2 minutes)")
    parser.add_argument("--only", type=int, action="append", choices=[1, 2, 3, 4])
    parser.add_argument(
        "--seconds", type=float, help="measured seconds per run (default 8; quick 3)"
    )
    parser.add_argument("--warmup", type=float, help="warm-up seconds per run (default 3; quick 2)")
    parser.add_argument("--rounds", type=int, help="rounds of part 1 (default 3; quick 1)")
    parser.add_argument("--backends", nargs="+", default=["memory", "rocksdb"])
    parser.add_argument("--state-keys", type=int, nargs="+", help="part 3 (default 1e5 1e6)")
    parser.add_argument("--rate", type=float, default=20_000, help="part 3 messages/s")
    parser.add_argument("--concurrency", type=int, default=64, help="part 2 concurrent callers")
    parser.add_argument(
        "--reply-interval-ms",
        type=int,
        default=20,
        help="part 2: checkpoint interval with reply_release=on-checkpoint (default 20)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="parts 1 and 2: a runtime setting, as with statefun run --set",
    )
    parser.add_argument(
        "--keys", type=int, nargs="+", default=[1000, 1], help="part 2: keys (default 1000 1)"
    )
    parser.add_argument(
        "--releases",
        nargs="+",
        choices=["immediate", "on-checkpoint"],
        default=["immediate", "on-checkpoint"],
        help="part 2: reply_release values (default both)",
    )
    parser.add_argument(
        "--admin",
        action="store_true",
        help="part 1: run the admin server (its metrics and, unless timeline_invocations=0, "
        "the timeline)",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args.child)
    # Parts 1 and 3 checkpoint every second; the smoke run more often, to see a few.
    args.interval_ms = 1000
    if args.smoke:
        args.seconds, args.warmup, args.rounds, args.interval_ms = 1.0, 0.5, 1, 200
        args.state_keys, args.rate, args.concurrency, args.keys = [2_000], 2_000.0, 8, [50, 1]
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 8.0
    if args.warmup is None:
        args.warmup = 2.0 if args.quick else 3.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.state_keys is None:
        args.state_keys = [100_000, 1_000_000]
    args.only = set(args.only or [1, 2, 3, 4])

    before = machine_note()
    progress(f"machine: {before}")
    began = time.monotonic()
    report = Report()
    loads: list[str] = []

    def note_load(part: str) -> None:
        loads.append(f"{part}: {os.getloadavg()[0]:.1f}")

    if 1 in args.only:
        note_load("1")
        part_throughput(args, report)
    if 2 in args.only:
        note_load("2")
        part_http(args, report)
    if 3 in args.only or 4 in args.only:
        note_load("3/4")
        part_stall_and_recover(args, report)
    note_load("end")

    if args.smoke:
        smoke_banner()
    else:
        print()
    print(
        f"Machine: {before}; after the run: load average "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}; run took "
        f"{time.monotonic() - began:.0f} s"
    )
    print(f"1-minute load average at the start of each part: {', '.join(loads)}")
    print(f"Versions: {versions()}")
    print(
        f"Measured {args.seconds:g} s per run after {args.warmup:g} s of warm-up "
        f"(part 3: 1.5x as long with 1,000,000 keys)."
    )
    verdicts = print_report(report, args)
    if verdicts:
        print()
        print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
