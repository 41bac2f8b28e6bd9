"""Runtime end to end: messages per second and latency through one runtime process.

A source submits messages as fast as the runtime admits them (``IngressContext.submit``
waits while the runtime is full: backpressure); the function is a counter (one IntType
state, incremented; one egress record per message, bench/_function_server.py); a sink
takes the time of every record. Each message carries its sequence number, which the
function copies to its egress record, so latency = time at the sink - time the message was
admitted by ``submit``. Scenarios, one after another in one run:

  a   embedded: the counter runs inside the runtime process, 10,000 keys
  b1  remote: the same counter served by ``python -m statefun serve`` in a separate process
      (its own core) over HTTP on 127.0.0.1, 10,000 keys
  b2  remote, one hot key: one batch in flight at a time, maxNumBatchRequests 1000
  c1  ceiling of b1: an aiohttp server in a separate process (bench/_echo_server.py) that
      answers every request with a fixed, valid FromFunction (a real reply of the counter
      for a batch of b1's average size), driven by the runtime's own RemoteClient with as
      many concurrent calls as b1 had in flight on average and requests of b1's size
  c2  ceiling of b2: the same, with b2's concurrency and request size
  c1x, c2x  stricter ceilings: the same echo on the built-in server of ``statefun serve``
      (faster than aiohttp's, so b1 and b2 use a faster server than c1 and c2 do; these
      compare the runtime with the same server minus the SDK's work)

Every scenario's messages/s include the source's and the sink's own work, on the same event
loop as the runtime: per message, one int encoded and one ``submit`` call at the source, one
clock reading and one int decoded at the sink (which takes the runtime's ``write_many``
batches without making a record object per value).

The ceiling's messages/s are its requests/s times the messages per request of the remote
scenario it bounds. Goals: embedded >= 100k messages/s; remote >= 70% of
the (aiohttp) ceiling.

    .venv/bin/python bench/runtime_e2e.py            # full run, about 2 minutes
    .venv/bin/python bench/runtime_e2e.py --quick    # a short run
    .venv/bin/python bench/runtime_e2e.py --only b1 --profile   # pyinstrument, one scenario
    .venv/bin/python bench/runtime_e2e.py --smoke    # does it still run? (about 20 s)

Progress goes to stderr; a Markdown table and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gc
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
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
from bench._function_server import COUNTER, OUT, functions  # noqa: E402
from statefun import IntType, RequestReplyHandler  # noqa: E402
from statefun._settings import Settings  # noqa: E402
from statefun.egress.base import EgressRecord, Sink  # noqa: E402
from statefun.ingress.base import IngressContext, Source  # noqa: E402
from statefun.module._specs import (  # noqa: E402
    EmbeddedEndpointSpec,
    FunctionTarget,
    HttpEndpointSpec,
    ModuleSpec,
    TransportSpec,
)
from statefun.runtime import Job  # noqa: E402
from statefun.runtime._commands import _settings_overrides  # noqa: E402
from statefun.runtime._envelope import Envelope  # noqa: E402
from statefun.runtime._remote import RemoteClient, encode_to_function  # noqa: E402
from statefun.sdk import TypedValue  # noqa: E402

FUNCTION_TARGET = "bench._function_server:functions"
ECHO_SERVER = ROOT / "bench" / "_echo_server.py"
MANY_KEYS = 10_000
INT_TYPENAME = IntType.typename
_serialize_int = IntType.serializer().serialize
_deserialize_int = IntType.serializer().deserialize
clock = time.perf_counter


# -- source and sink ---------------------------------------------------------------------------


class SequenceSource(Source):
    """Submits counter messages round-robin over ``keys`` ids, as fast as admitted.

    Message ``n`` carries ``n`` (IntType); ``admitted[n]`` is the time ``submit`` returned.
    """

    def __init__(self, keys: int, admitted: array[float]) -> None:
        super().__init__("bench/source")
        self.ids = [f"key-{i}" for i in range(keys)] if keys > 1 else ["hot"]
        self.admitted = admitted

    async def run(self, context: IngressContext) -> None:
        submit = context.submit
        ids = self.ids
        n_ids = len(ids)
        append = self.admitted.append
        seq = 0
        while True:
            await submit(COUNTER, ids[seq % n_ids], TypedValue(INT_TYPENAME, _serialize_int(seq)))
            append(clock())
            seq += 1


class TimingSink(Sink):
    """Keeps the time of arrival and the sequence number of every record.

    Both go to arrays, not lists of objects, so that the sink adds nothing to the work of
    Python's cyclic garbage collector (which would otherwise walk millions of list items).
    """

    def __init__(self) -> None:
        super().__init__(OUT)
        self.times: array[float] = array("d")
        self.seqs: array[int] = array("q")

    def write(self, record: EgressRecord) -> None:
        self.write_many([record.value])

    def write_many(self, values: list[Any]) -> None:
        # what the runtime calls: no EgressRecord per value; each value still timed on its own
        times = self.times.append
        seqs = self.seqs.append
        for value in values:
            times(clock())
            seqs(_deserialize_int(value.value))


# -- measuring the remote calls ----------------------------------------------------------------


@dataclass
class CallStats:
    """Remote calls as the runtime makes them: count, bytes, average number in flight.

    A call is in flight from the moment the dispatcher calls ``RemoteClient.call`` (so the
    time it waits for a free pooled connection counts) until the reply is read.
    """

    calls: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    in_flight: int = 0
    area: float = 0.0  # integral of in_flight over time (seconds)
    peak: int = 0
    last: float = field(default_factory=clock)

    def _tick(self) -> None:
        now = clock()
        self.area += self.in_flight * (now - self.last)
        self.last = now

    def wrap(self, call: Callable[..., Awaitable[bytes]]) -> Callable[..., Awaitable[bytes]]:
        async def counted(
            url: str, body: bytes, transport: TransportSpec, typename: str, *rest: Any
        ) -> bytes:
            self._tick()
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                raw = await call(url, body, transport, typename, *rest)
            finally:
                self._tick()
                self.in_flight -= 1
            # Counted when they complete, as the messages are (at the sink).
            self.calls += 1
            self.request_bytes += len(body)
            self.response_bytes += len(raw)
            return raw

        return counted

    def snapshot(self) -> tuple[int, int, int, float]:
        self._tick()
        return self.calls, self.request_bytes, self.response_bytes, self.area


# -- results -----------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    what: str
    seconds: float
    messages: int
    p50_ms: float | None = None
    p99_ms: float | None = None
    requests: int | None = None
    in_flight: float | None = None  # average concurrent remote calls
    request_bytes: float | None = None  # average per request
    response_bytes: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # process -> % of one core
    note: str = ""

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def requests_per_s(self) -> float | None:
        return None if self.requests is None else self.requests / self.seconds

    @property
    def per_request(self) -> float | None:
        return self.messages / self.requests if self.requests else None


def _machine_busy_seconds() -> float:
    """CPU seconds all cores spent on anything but idle and iowait, since boot."""
    try:
        fields_ = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(x) for x in fields_[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU time of processes over a span, as % of one core; and this process's time in GC.

    ``other`` is what the rest of the machine used meanwhile (other work on a shared
    machine, and the kernel's network processing that no process is charged for).
    """

    def __init__(self, processes: dict[str, int | None]) -> None:
        self.processes = processes
        self.start = {name: cpu_seconds(pid) for name, pid in processes.items()}
        self.machine_start = _machine_busy_seconds()
        self.gc_seconds = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self.t0 = clock()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = clock()
        else:
            self.gc_seconds += clock() - self._gc_started

    def percent(self) -> dict[str, float]:
        """{"runtime": %, "server": %, ..., "gc": % of the span this process spent in GC}."""
        elapsed = clock() - self.t0
        gc.callbacks.remove(self._on_gc)
        result = {
            name: 100 * (cpu_seconds(pid) - self.start[name]) / elapsed
            for name, pid in self.processes.items()
        }
        machine = 100 * (_machine_busy_seconds() - self.machine_start) / elapsed
        result["other"] = max(0.0, machine - sum(result.values()))
        result["gc"] = 100 * self.gc_seconds / elapsed
        return result


# -- servers in processes of their own ---------------------------------------------------------


@contextlib.contextmanager
def server_process(command: list[str], port: int, what: str) -> Iterator[subprocess.Popen[bytes]]:
    progress(f"  starting {what}: {' '.join(command)}")
    process = subprocess.Popen(command, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited with {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not answer /health within 30 s") from None
                time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the runtime scenarios (a, b1, b2) ---------------------------------------------------------


async def _watch(
    name: str, phase: str, seconds: float, times: array[float], running: asyncio.Task[None]
) -> None:
    """Sleep ``seconds``, printing the sink's rate every second; stop if the job ended."""
    end = clock() + seconds
    while (left := end - clock()) > 0:
        start, count = clock(), len(times)
        await asyncio.sleep(min(1.0, left))
        if running.done():
            await running
            raise RuntimeError(f"{name}: the job stopped by itself")
        rate = (len(times) - count) / (clock() - start)
        progress(f"  {name} {phase}: {rate:,.0f} messages/s")


async def run_job_scenario(
    name: str,
    what: str,
    endpoint: EmbeddedEndpointSpec | HttpEndpointSpec,
    keys: int,
    warmup: float,
    measure: float,
    settings: Settings,
    server_pid: int | None = None,
) -> Result:
    admitted: array[float] = array("d")
    sink = TimingSink()
    job = Job(
        ModuleSpec(endpoints=(endpoint,)),
        settings,
        sources=[SequenceSource(keys, admitted)],
        sinks=[sink],
    )
    stats = CallStats()
    job.client.call = stats.wrap(job.client.call)  # type: ignore[method-assign,assignment]
    running = asyncio.get_running_loop().create_task(job.run())
    await _watch(name, "warm-up", warmup, sink.times, running)
    processes: dict[str, int | None] = {"runtime": None}
    if server_pid is not None:
        processes["server"] = server_pid
    cpu = CpuMeter(processes)
    t0 = clock()
    calls0, req0, resp0, area0 = stats.snapshot()
    retries0 = job.client.retried_attempts
    await _watch(name, "measuring", measure, sink.times, running)
    t1 = clock()
    calls1, req1, resp1, area1 = stats.snapshot()
    retried = job.client.retried_attempts - retries0
    cpu_percent = cpu.percent()
    job.stop()
    await running
    seconds = t1 - t0

    times = sink.times
    lo, hi = bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)
    seqs = sink.seqs
    latencies = sorted(times[i] - admitted[seqs[i]] for i in range(lo, hi))
    expect(bool(latencies), f"{name}: no record reached the sink while measuring")
    # Every message the sink saw was counted exactly once in state, and no seq twice.
    expect(len(set(seqs)) == len(seqs), f"{name}: a message reached the sink twice")
    counted = sum(
        _deserialize_int(values["count"].value)
        for kg in job.state.key_groups()
        for _, values in job.state.items(kg)
    )
    expect(
        counted == len(seqs), f"{name}: state counts {counted} messages, the sink saw {len(seqs)}"
    )
    calls = calls1 - calls0
    result = Result(
        name,
        what,
        seconds,
        hi - lo,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        cpu=cpu_percent,
    )
    if isinstance(endpoint, HttpEndpointSpec):
        result.requests = calls
        result.in_flight = (area1 - area0) / seconds
        result.request_bytes = (req1 - req0) / max(1, calls)
        result.response_bytes = (resp1 - resp0) / max(1, calls)
        result.note = f"peak {stats.peak} calls in flight; {retried} calls retried while measuring"
    return result


async def scenario_embedded(args: argparse.Namespace, settings: Settings) -> Result:
    endpoint = EmbeddedEndpointSpec(FunctionTarget("bench", "counter"), FUNCTION_TARGET)
    return await run_job_scenario(
        "a",
        f"embedded, {args.keys:,} keys",
        endpoint,
        args.keys,
        args.warmup,
        args.seconds,
        settings,
    )


def run_remote(
    name: str, what: str, keys: int, args: argparse.Namespace, settings: Settings
) -> Result:
    port = free_port()
    command = [sys.executable, "-m", "statefun", "serve", FUNCTION_TARGET, "--port", str(port)]
    with server_process(command, port, "function server") as process:
        endpoint = HttpEndpointSpec(
            FunctionTarget("bench", "counter"),
            f"http://127.0.0.1:{port}/statefun",
            max_num_batch_requests=1000,
        )
        return asyncio.run(
            _profiled(
                args,
                name,
                run_job_scenario(
                    name, what, endpoint, keys, args.warmup, args.seconds, settings, process.pid
                ),
            )
        )


# -- the ceiling (c): the runtime's RemoteClient against an echo server ------------------------


def counter_request(batch: int) -> bytes:
    """A ToFunction as the runtime sends it: the counter's state and ``batch`` messages."""
    states = [("count", INT_TYPENAME, TypedValue(INT_TYPENAME, _serialize_int(12345)))]
    envelopes = [
        Envelope(COUNTER, "key-1", TypedValue(INT_TYPENAME, _serialize_int(1_000_000 + i)), None)
        for i in range(batch)
    ]
    return encode_to_function(COUNTER, "key-1", states, envelopes)


async def drive_echo(
    url: str,
    body: bytes,
    concurrency: int,
    warmup: float,
    measure: float,
    settings: Settings,
    server_pid: int,
) -> tuple[int, float, dict[str, float]]:
    """(requests, seconds, cpu) of ``concurrency`` callers looping on RemoteClient.call."""
    client = RemoteClient(
        max_connections=settings.remote_max_connections,
        initial_backoff_ms=settings.remote_retry_initial_backoff_ms,
        max_backoff_ms=settings.remote_retry_max_backoff_ms,
        max_response_bytes=settings.max_response_bytes,
    )
    await client.start()
    # The callers here re-issue a call the moment theirs returns, and aiohttp hands a freed
    # pooled connection to a new request before a queued one: queued calls can wait longer
    # than the default connect timeout (10 s, which counts the wait for a pooled connection)
    # and be retried. A longer connect timeout keeps those retries out of the ceiling.
    transport = TransportSpec(connect=TransportSpec().call)
    done = 0
    stopping = False

    async def caller() -> None:
        nonlocal done
        while not stopping:
            await client.call(url, body, transport, COUNTER)
            done += 1

    tasks = [asyncio.create_task(caller()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(warmup)
        cpu = CpuMeter({"runtime": None, "server": server_pid})
        t0, n0 = clock(), done
        await asyncio.sleep(measure)
        t1, n1 = clock(), done
        cpu_percent = cpu.percent()
        stopping = True
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for task in tasks:
            task.cancel()
        await client.close()
    return n1 - n0, t1 - t0, cpu_percent


def run_ceiling(
    name: str, bound: Result, args: argparse.Namespace, settings: Settings, server: str
) -> Result:
    assert bound.in_flight is not None and bound.per_request is not None
    concurrency = max(1, round(bound.in_flight))
    batch = max(1, round(bound.per_request))
    body = counter_request(batch)
    reply = RequestReplyHandler(functions).handle_sync(body)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        reply_file = Path(tmp) / "reply.bin"
        reply_file.write_bytes(reply)
        command = [
            sys.executable,
            str(ECHO_SERVER),
            "--port",
            str(port),
            "--reply",
            str(reply_file),
            "--server",
            server,
        ]
        with server_process(command, port, "echo server") as process:
            requests, seconds, cpu = asyncio.run(
                drive_echo(
                    f"http://127.0.0.1:{port}/statefun",
                    body,
                    concurrency,
                    args.warmup,
                    args.seconds,
                    settings,
                    process.pid,
                )
            )
    # The ceiling's messages are its requests times the messages per request of the remote run.
    return Result(
        name,
        f"ceiling of {bound.name}: {server} echo server, {concurrency} concurrent calls",
        seconds,
        round(requests * bound.per_request),
        requests=requests,
        in_flight=float(concurrency),
        request_bytes=float(len(body)),
        response_bytes=float(len(reply)),
        cpu=cpu,
        note=f"batch of {batch} in each request",
    )


# -- profiling ---------------------------------------------------------------------------------


async def _profiled(args: argparse.Namespace, name: str, work: Awaitable[Result]) -> Result:
    if not args.profile:
        return await work
    from pyinstrument import Profiler  # .venv/bin/pip install pyinstrument

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    try:
        return await work
    finally:
        profiler.stop()
        out = Path(tempfile.gettempdir()) / f"runtime_e2e_{name}.txt"
        out.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
        progress(f"  profile of {name} written to {out}")


# -- main --------------------------------------------------------------------------------------


def machine_note() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{model or platform.processor()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; load average {load}"
    )


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_table(results: list[Result]) -> None:
    print(
        "| scenario | what | messages/s | requests/s | msgs/request | in flight | "
        "request B | p50 ms | p99 ms | CPU % (runtime / server) | GC % (runtime) | other CPU % |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for r in results:
        cpu = " / ".join(f"{r.cpu[k]:.0f}" for k in ("runtime", "server") if k in r.cpu)
        print(
            f"| {r.name} | {r.what} | {r.messages_per_s:,.0f} | {_fmt(r.requests_per_s, ',.0f')} "
            f"| {_fmt(r.per_request, '.1f')} | {_fmt(r.in_flight, '.0f')} "
            f"| {_fmt(r.request_bytes, ',.0f')} | {_fmt(r.p50_ms, '.1f')} "
            f"| {_fmt(r.p99_ms, '.1f')} | {cpu} | {_fmt(r.cpu.get('gc'), '.0f')} "
            f"| {_fmt(r.cpu.get('other'), '.0f')} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="short run (3 s warm-up, 3 s measured)"
    )
    parser.add_argument("--seconds", type=float, help="measured seconds per scenario (default 10)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per scenario (default 10)")
    parser.add_argument(
        "--only", action="append", choices=["a", "b1", "b2"], help="run only these scenarios"
    )
    parser.add_argument("--no-ceiling", action="store_true", help="skip the echo ceilings (c1, c2)")
    parser.add_argument(
        "--keys", type=int, default=MANY_KEYS, help=f"keys of a and b1 (default {MANY_KEYS:,})"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the runtime scenarios with pyinstrument (slower; implies --no-ceiling)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a runtime setting, as with statefun run --set",
    )
    args = parser.parse_args()
    if args.smoke:
        # Every scenario, ceilings included; few keys, so that b1 settles in its warm-up.
        args.seconds, args.warmup, args.keys = 1.0, 0.5, 200
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    if args.warmup is None:
        # b1 needs a while to settle: its first batch to each of the 10,000 keys comes back
        # as IncompleteInvocationContext, and its batches grow as its queue fills.
        args.warmup = 3.0 if args.quick else 10.0
    settings = Settings.load(_settings_overrides(args.set), environ={})
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    only = set(args.only or ["a", "b1", "b2"])

    note_before = machine_note()
    progress(f"machine: {note_before}")
    results: list[Result] = []
    remote: list[Result] = []
    if "a" in only:
        progress(f"a: embedded counter, {args.keys:,} keys ({args.warmup:g}+{args.seconds:g} s)")
        results.append(asyncio.run(_profiled(args, "a", scenario_embedded(args, settings))))
    if "b1" in only:
        progress(f"b1: remote counter, {args.keys:,} keys")
        remote.append(run_remote("b1", f"remote, {args.keys:,} keys", args.keys, args, settings))
    if "b2" in only:
        progress("b2: remote counter, one hot key (maxNumBatchRequests 1000)")
        remote.append(run_remote("b2", "remote, 1 hot key", 1, args, settings))
    results.extend(remote)
    ceilings: list[tuple[Result, Result, str]] = []  # (bound, its echo ceiling, the server)
    if not (args.profile or args.no_ceiling):
        for bound in remote:
            for server, suffix in (("aiohttp", ""), ("builtin", "x")):
                name = "c" + bound.name[1:] + suffix
                progress(f"{name}: echo ceiling of {bound.name} ({server} server)")
                ceiling = run_ceiling(name, bound, args, settings, server)
                ceilings.append((bound, ceiling, server))
                results.append(ceiling)

    if args.smoke:
        smoke_banner()
    else:
        print()
    print(
        f"Machine: {note_before}; after the run: load average "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"Measured {args.seconds:g} s per scenario after {args.warmup:g} s of warm-up.")
    print()
    print_table(results)
    print()
    embedded = next((r for r in results if r.name == "a"), None)
    if embedded is not None:
        met = "met" if embedded.messages_per_s >= 200_000 else "MISSED"
        print(f"- embedded: {embedded.messages_per_s:,.0f} messages/s (goal >= 200,000: {met})")
    for bound, ceiling, server in ceilings:
        ratio = bound.messages_per_s / ceiling.messages_per_s
        met = "met" if ratio >= 0.7 else "MISSED"
        if server == "builtin":
            met = "the goal is against the aiohttp echo; for information"
        print(
            f"- {bound.name}/{ceiling.name}: {ratio:.0%} of the ceiling in messages/s "
            f"({bound.messages_per_s:,.0f} / {ceiling.messages_per_s:,.0f}; "
            f"{bound.per_request:.1f} messages per request; requests/s "
            f"{bound.requests_per_s:,.0f} / {ceiling.requests_per_s:,.0f}) (goal >= 70%: {met})"
        )
    for r in results:
        if r.note:
            print(f"- {r.name}: {r.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
