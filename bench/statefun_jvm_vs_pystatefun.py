"""Side by side with Apache StateFun's JVM runtime: Kafka -> remote counter -> Kafka.

The same module (bench/peers/statefun-jvm/bench-counter-module.yaml: a Kafka ingress, the
remote function ``bench/counter`` over HTTP, a Kafka egress) runs once on Apache StateFun 3.3.0
(Flink 1.16.2 MiniCluster, bench/peers/statefun-jvm/run.sh) and once on pystatefun
(``statefun run``), against the same Kafka broker, with the function served by the same
``statefun serve bench/_jvm_counter.py:functions`` process. The counter keeps one IntType
state per key and writes one egress record per input (bench/_jvm_counter.py).

Delivery semantics, the same for both runtimes: checkpoints every 1 s (StateFun: Flink's
exactly-once checkpoints in JobManager memory; pystatefun: ``checkpoint_dir`` on local disk) and

* exactly-once: the Kafka egress writes in transactions committed by each checkpoint; records
  are read with isolation.level=read_committed, so they become visible once per checkpoint;
* at-least-once: the egress produces at once and waits for the broker's acks at checkpoints
  (StateFun) or every 50 ms (pystatefun).

pystatefun runs with its default settings, so exactly-once output is also committed by an early
checkpoint when the job goes idle (idle_checkpoint_delay_ms); PYSTATEFUN_IDLE_CHECKPOINT_DELAY_MS=0
in the environment turns that off (StateFun's schedule).

For each runtime and semantic, one runtime process runs these phases in turn, each writing to
a topic of its own (named in the record):

  warm-up      records to many keys until the output flows and a checkpoint completed
  many keys    N records, keys k0..k9999, produced as fast as a producer process can:
               records/s = N / (last output read - first record produced)
  one hot key  N records to one key, the same way
  latency      a fixed rate (records/s) for some seconds, to many keys, then to the hot key:
               end-to-end latency = time the output was read - produce time in the record
  backlog      the runtime process is paused (SIGSTOP, its whole process group), B records
               (--backlog-records, 5 N by default) are produced to many keys, then to the hot
               key, and it is resumed: records/s = B / (last output read - resume). The
               throughput phases above share two cores with the producer, which can become
               the limit for both runtimes; this one measures how fast each runtime works off
               a backlog on its own (latency: output read - the later of produce time and
               resume). B is larger than N so that a phase lasts seconds: a backlog of 60,000
               records is gone in under a second, and the time to the first output after the
               resume (26 to 158 ms, varying from run to run) weighs too much in so short a
               phase

Producers run in another process; the reader (read_committed) in this one. Each phase's CPU
(cores busy on average) is shown for the runtime, the function server, the broker (when this
run started it) and this process: on two cores they share, the others' CPU is time the
runtime and the function server wait for a core. The function server's is shown to three
decimals: in a backlog phase its busy share is the part of each cycle the runtime leaves it,
which judges a change of one runtime without the machine's speed (0.477-0.500 over 13 runs
of the same code: a change needs interleaved pairs).

With the backlog phases, each repeat also drives the function server alone (no runtime, no
Kafka: bench/_server_alone.py) with the hot key's batches back to back: the ceiling of the
hot-key backlog on this machine. The runtimes' records/s are printed as shares of it, and the
ceiling over StateFun's records/s is the most that any runtime could show against StateFun
there. The hot-key backlog is also shown repeat by repeat, with the machine's speed taken out
of each ratio: both runtimes hand the function server the same full batches there, so its CPU
per record in a phase measures how fast the machine ran in those seconds.

    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py             # about 6 minutes
    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --quick     # about 3 minutes
    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --repeat 3  # medians of 3 runs each
    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --phases backlog --runtimes pystatefun
    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --smoke     # does it run? (1-2 minutes)

What the metrics cost: ``--runtimes pystatefun,pystatefun-no-metrics`` runs pystatefun as by
default and with ``metrics=false``, turn about, and prints each phase's figures on against off.
What the compiled hot loops give: ``pystatefun-python-loops`` runs them as Python instead
(``PYSTATEFUN_NO_EXTENSIONS=1``), the same way:

    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --quick --repeat 6 \
        --runtimes pystatefun,pystatefun-no-metrics
    .venv/bin/python bench/statefun_jvm_vs_pystatefun.py --phases backlog --repeat 3 \
        --semantics at-least-once --runtimes pystatefun,pystatefun-python-loops

A run exits non-zero if a phase failed; a smoke run also if a phase's outputs are not exactly
its records (hot key: counts consecutive), or a runtime reported dead letters or job failures.

Progress goes to stderr; a Markdown table and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, cpu_seconds, expect, percentile, smoke_banner  # noqa: E402
from bench._common import progress as say  # noqa: E402
from bench._jvm_processes import (  # noqa: E402
    PEER_DIR,
    Proc,
    Reader,
    create_topics,
    free_port,
    java_version,
    missing_jvm_tools,
    pystatefun_checkpoints,
    pystatefun_status,
    start_pystatefun,
    start_serve,
    start_statefun_jvm,
    wait_checkpoints,
)
from bench._server_alone import Alone, drive  # noqa: E402
from statefun._kafka_local.broker import KafkaBroker, kafka_version  # noqa: E402

TEMPLATE = PEER_DIR / "bench-counter-module.yaml"
FUNCTION = "bench/_jvm_counter.py:functions"
HOT_BACKLOG = "one hot key, backlog"  # the phase whose ceiling and machine speed are shown
MANY_KEYS = 10_000
HOT_KEY = "hot"
RUNTIMES = ("pystatefun", "statefun-jvm")
# pystatefun with ``metrics=false``: no /metrics, no invocation timing, no event-loop lag probe.
# Not run by default; ``--runtimes pystatefun,pystatefun-no-metrics`` prints what the metrics
# cost, run against run.
NO_METRICS = "pystatefun-no-metrics"
# pystatefun with its hot loops as Python (``PYSTATEFUN_NO_EXTENSIONS=1``), not compiled;
# ``--runtimes pystatefun,pystatefun-python-loops`` prints what the compiled loops give.
PYTHON_LOOPS = "pystatefun-python-loops"
#: each variant of pystatefun: what it changes, how its figures are named against the default's
VARIANTS = {
    NO_METRICS: ("metrics on against off", "on", "off"),
    PYTHON_LOOPS: ("compiled hot loops against Python ones", "compiled", "Python"),
}
KNOWN_RUNTIMES = (*RUNTIMES, *VARIANTS)
SEMANTICS = ("exactly-once", "at-least-once")


# -- the producer process ------------------------------------------------------------------------


def _produce(
    bootstrap: str,
    topic: str,
    out_topic: str,
    keys: int,
    count: int,
    rate: float | None,
    result: Any,
) -> None:
    """Write ``count`` records (as fast as possible, or at ``rate`` per second); put
    (first send time, last send time) on ``result``."""
    from bench._jvm_processes import producer

    fast = rate is None
    out = producer(bootstrap, linger_ms=5 if fast else 0, batch_size=256 * 1024)
    prefix = out_topic.encode() + b" "
    key_bytes = [HOT_KEY.encode()] if keys == 1 else [b"k%d" % i for i in range(keys)]
    send = out.send
    started = time.time()
    tick = 0.005
    per_tick = 1 if rate is None else max(1, round(rate * tick))
    next_tick = time.perf_counter()
    i = 0
    while i < count:
        for _ in range(min(per_tick if not fast else 1000, count - i)):
            send(topic, key=key_bytes[i % len(key_bytes)], value=prefix + b"%d" % time.time_ns())
            i += 1
        if not fast:
            out.flush()
            next_tick += tick
            pause = next_tick - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    out.flush(timeout=120)
    finished = time.time()
    out.close()
    result.put((started, finished))


def produce_in_process(
    bootstrap: str, topic: str, out_topic: str, keys: int, count: int, rate: float | None
) -> tuple[multiprocessing.process.BaseProcess, Any]:
    context = multiprocessing.get_context("spawn")
    result = context.Queue()
    process = context.Process(
        target=_produce,
        args=(bootstrap, topic, out_topic, keys, count, rate, result),
        daemon=True,
    )
    process.start()
    return process, result


# -- one runtime process, all phases -------------------------------------------------------------


@dataclass
class Phase:
    name: str
    keys: int
    count: int
    rate: float | None  # None: as fast as possible
    backlog: bool = False  # produced while the runtime is paused, then worked off
    topic: str = ""
    started: float = 0.0  # first record produced
    produced_until: float = 0.0
    records_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    outputs: int = 0
    cpu_s: float = 0.0  # CPU time of the runtime process during the phase
    server_cpu_s: float = 0.0  # CPU time of the function server during the phase
    broker_cpu_s: float | None = None  # CPU time of the Kafka broker (None: not started here)
    reader_cpu_s: float = 0.0  # CPU time of this process (the output's reader) in the phase
    rss_mb: float = 0.0  # resident memory of the runtime process at the end of the phase
    failed: bool = False
    # with --repeat: the values of every repeat, for the spread shown next to the median
    all_rates: list[float] = field(default_factory=list)
    all_p99: list[float] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class Run:
    runtime: str
    semantic: str
    phases: list[Phase] = field(default_factory=list)
    note: str = ""


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def fill_module(semantic: str, bootstrap: str, function_port: int, topic: str, group: str) -> str:
    text = TEMPLATE.read_text()
    text = (
        text.replace("127.0.0.1:9092", bootstrap)
        .replace("127.0.0.1:8000/", f"127.0.0.1:{function_port}/")
        .replace("topic: bench-in\n", f"topic: {topic}\n")
        .replace("consumerGroupId: bench-counter", f"consumerGroupId: {group}")
    )
    if semantic == "at-least-once":
        text = text.replace(
            "type: exactly-once\n    transactionTimeout: 5min", "type: at-least-once"
        )
    assert f"type: {semantic}" in text
    return text


def run_one(
    runtime: str,
    semantic: str,
    bootstrap: str,
    server: Proc,
    function_port: int,
    phases: list[Phase],
    work: Path,
    heap: str,
    strict: bool = False,
    broker_pid: int | None = None,
) -> Run:
    """One runtime process through ``phases``; ``broker_pid``: the broker's process, if this
    run started it (its CPU is measured per phase)."""
    tag = f"{runtime}-{semantic}-{uuid.uuid4().hex[:6]}"
    in_topic = f"bench-in-{tag}"
    for number, phase in enumerate(phases):
        phase.topic = f"bench-out-{tag}-{number}"
    create_topics(bootstrap, [in_topic, *(p.topic for p in phases)])
    folder = work / tag
    folder.mkdir(parents=True)
    module = folder / "module.yaml"
    module.write_text(fill_module(semantic, bootstrap, function_port, in_topic, f"group-{tag}"))
    say(f"[{runtime} {semantic}] starting")
    started = time.monotonic()
    if runtime == "statefun-jvm":
        peer = start_statefun_jvm(module, folder / "runtime.log", heap=heap)
        proc: Proc = peer.proc

        def checkpoints() -> int:
            return peer.checkpoints()

        failures = peer.failures
    else:
        settings: dict[str, object] = {"checkpoint_dir": folder / "checkpoints"}
        if runtime == NO_METRICS:
            settings["metrics"] = "false"
        env = {"PYSTATEFUN_NO_EXTENSIONS": "1"} if runtime == PYTHON_LOOPS else None
        proc, admin_port = start_pystatefun(
            module, folder / "runtime.log", settings=settings, env=env
        )

        def checkpoints() -> int:
            return pystatefun_checkpoints(admin_port)

        def failures() -> list[str]:
            return []

    say(f"[{runtime} {semantic}] running after {time.monotonic() - started:.1f} s")
    run = Run(runtime, semantic, phases)
    try:
        with Reader(bootstrap, [p.topic for p in phases]) as reader:
            for phase in phases:
                try:
                    run_phase(
                        phase,
                        proc,
                        reader,
                        bootstrap,
                        in_topic,
                        server,
                        failures,
                        strict,
                        broker_pid,
                    )
                    if phase.name == "warm-up":
                        wait_checkpoints(proc, checkpoints, 1, 120)
                except (RuntimeError, TimeoutError) as exc:
                    phase.failed = True
                    run.note = f"failed in phase {phase.name}: {str(exc).splitlines()[0]}"
                    say(f"[{runtime} {semantic}] {run.note}\n{exc}")
                    return run
                say(
                    f"[{runtime} {semantic}] {phase.name}: {phase.outputs} outputs, "
                    f"{phase.records_per_s:,.0f} records/s, p50 {phase.p50_ms:.0f} ms, "
                    f"p99 {phase.p99_ms:.0f} ms, CPU s runtime {phase.cpu_s:.1f} "
                    f"function server {phase.server_cpu_s:.1f} "
                    f"broker {_seconds(phase.broker_cpu_s)} reader {phase.reader_cpu_s:.1f} "
                    f"in {phase.wall_s:.1f} s"
                )
        if runtime == "statefun-jvm":
            failed = peer.failures()
            if failed:
                run.note = f"job failed and restarted {len(failed)}x: {failed[:3]}"
        else:
            dead = pystatefun_status(admin_port)["dead_letters"]
            if dead:
                run.note = f"{dead} dead letters"
        if run.note:
            say(f"[{runtime} {semantic}] WARNING: {run.note}")
    finally:
        proc.stop()
    return run


def run_phase(
    phase: Phase,
    proc: Proc,
    reader: Reader,
    bootstrap: str,
    in_topic: str,
    server: Proc,
    failures: Callable[[], list[str]],
    strict: bool = False,
    broker_pid: int | None = None,
) -> None:
    """Run one phase; ``strict``: its outputs must be exactly its records (hot key: counts
    consecutive), else it fails. ``broker_pid``: the broker's process, whose CPU is measured."""
    # A backlog is produced while the runtime is paused; the phase starts at the resume.
    if phase.backlog:
        os.killpg(proc.process.pid, signal.SIGSTOP)
    try:
        process, result = produce_in_process(
            bootstrap, in_topic, phase.topic, phase.keys, phase.count, phase.rate
        )
        if phase.backlog:
            phase.produced_until = result.get(timeout=120)[1]
    finally:
        if phase.backlog:
            os.killpg(proc.process.pid, signal.SIGCONT)
            phase.started = time.time()
    cpu_before = cpu_seconds(proc.process.pid)
    server_before = cpu_seconds(server.process.pid)
    broker_before = None if broker_pid is None else cpu_seconds(broker_pid)
    reader_before = time.process_time()
    wall_before = time.monotonic()
    expected_s = phase.count / (phase.rate or 2_000)
    reader.wait_for(
        lambda r: r.count(phase.topic) >= phase.count,
        timeout=max(120.0, expected_s * 4),
        what=f"{phase.count} outputs of phase {phase.name}",
        watch=proc,
        failures=failures,
    )
    phase.wall_s = time.monotonic() - wall_before
    phase.cpu_s = cpu_seconds(proc.process.pid) - cpu_before
    phase.server_cpu_s = cpu_seconds(server.process.pid) - server_before
    if broker_pid is not None and broker_before is not None:
        phase.broker_cpu_s = cpu_seconds(broker_pid) - broker_before
    phase.reader_cpu_s = time.process_time() - reader_before
    phase.rss_mb = rss_mb(proc.process.pid)
    if not phase.backlog:
        phase.started, phase.produced_until = result.get(timeout=60)
    process.join(30)
    time.sleep(0.2)
    records = reader.snapshot()[phase.topic]
    phase.outputs = len(records)
    # a backlog's records wait for the resume: their latency counts from there
    since = phase.started if phase.backlog else 0.0
    latencies = sorted(r.at - max(since, int(r.value.split(b" ")[1]) / 1e9) for r in records)
    last = max(r.at for r in records)
    phase.records_per_s = phase.count / (last - phase.started)
    phase.p50_ms = percentile(latencies, 0.50) * 1000
    phase.p99_ms = percentile(latencies, 0.99) * 1000
    phase.max_ms = latencies[-1] * 1000
    counts = [int(r.value.split(b" ")[2]) for r in records]
    if phase.keys == 1 and sorted(counts) != list(range(counts[0], counts[0] + len(counts))):
        expect(not strict, f"hot-key counts are not consecutive in {phase.name}")
        say(f"  NOTE: hot-key counts are not consecutive in {phase.name} (duplicates or gaps)")
    expect(
        not strict or phase.outputs == phase.count,
        f"{phase.outputs} outputs in {phase.name}, expected {phase.count}",
    )


# -- reporting -----------------------------------------------------------------------------------


def merge(runs: list[Run]) -> list[Run]:
    """One Run per (runtime, semantic): the median of every figure over the repeats."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.runtime, run.semantic), []).append(run)
    merged = []
    for (runtime, semantic), repeats in groups.items():
        phases = []
        for index, first in enumerate(repeats[0].phases):
            done = [r.phases[index] for r in repeats if not r.phases[index].failed]
            done = [p for p in done if p.outputs]
            phase = Phase(first.name, first.keys, first.count, first.rate)
            phase.failed = not done
            if done:
                for name in ("records_per_s", "p50_ms", "p99_ms", "max_ms", "outputs", "rss_mb"):
                    setattr(phase, name, statistics.median(getattr(p, name) for p in done))
                phase.cpu_s = statistics.median(p.cpu_s / p.wall_s for p in done)
                phase.server_cpu_s = statistics.median(p.server_cpu_s / p.wall_s for p in done)
                broker = [p.broker_cpu_s / p.wall_s for p in done if p.broker_cpu_s is not None]
                phase.broker_cpu_s = statistics.median(broker) if broker else None
                phase.reader_cpu_s = statistics.median(p.reader_cpu_s / p.wall_s for p in done)
                phase.wall_s = 1.0  # the CPU figures above are already per second
                phase.all_rates = [p.records_per_s for p in done]
                phase.all_p99 = [p.p99_ms for p in done]
            phases.append(phase)
        notes = "; ".join(r.note for r in repeats if r.note)
        merged.append(Run(runtime, semantic, phases, notes))
    return merged


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f" ({min(values):,.0f}-{max(values):,.0f})"


def table(runs: list[Run]) -> str:
    lines = [
        "| semantic | runtime | phase | records/s | p50 ms | p99 ms | max ms "
        "| CPU: runtime | CPU: function server | CPU: broker | CPU: reader | runtime RSS |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for phase in run.phases:
            if phase.name == "warm-up":
                continue
            if phase.failed or not phase.outputs:
                lines.append(f"| {run.semantic} | {run.runtime} | {phase.name} | failed |||||||||")
                continue
            rate = "-"
            if phase.rate is None:
                rate = f"{phase.records_per_s:,.0f}{_spread(phase.all_rates)}"
            cpu = f"{phase.cpu_s / phase.wall_s:.2f}" if phase.wall_s else "-"
            server_cpu = f"{phase.server_cpu_s / phase.wall_s:.3f}" if phase.wall_s else "-"
            broker_cpu = "-"  # (not known for a broker this run did not start)
            if phase.wall_s and phase.broker_cpu_s is not None:
                broker_cpu = f"{phase.broker_cpu_s / phase.wall_s:.2f}"
            reader_cpu = f"{phase.reader_cpu_s / phase.wall_s:.2f}" if phase.wall_s else "-"
            lines.append(
                f"| {run.semantic} | {run.runtime} | {phase.name} | "
                f"{rate} | {phase.p50_ms:,.0f} | {phase.p99_ms:,.0f}{_spread(phase.all_p99)} | "
                f"{phase.max_ms:,.0f} | {cpu} | {server_cpu} | {broker_cpu} | {reader_cpu} | "
                f"{phase.rss_mb:,.0f} MB |"
            )
    return "\n".join(lines)


def ratios(runs: list[Run]) -> str:
    """pystatefun against StateFun, phase by phase, and whether the goal is met: at least
    StateFun's throughput, and a lower p99."""
    by = {(r.runtime, r.semantic): r for r in runs}
    lines = []
    for semantic in SEMANTICS:
        ours, theirs = by.get(("pystatefun", semantic)), by.get(("statefun-jvm", semantic))
        if ours is None or theirs is None:
            continue
        for mine, other in zip(ours.phases, theirs.phases, strict=True):
            if mine.name == "warm-up" or not (mine.outputs and other.outputs):
                continue
            if mine.rate is None:
                ratio = mine.records_per_s / other.records_per_s
                goal = "met" if ratio >= 1.0 else "NOT met"
                lines.append(
                    f"- {semantic}, {mine.name}: throughput pystatefun / StateFun = "
                    f"{ratio:.2f}x (goal >= 1: {goal})"
                )
            else:
                ratio = other.p99_ms / mine.p99_ms
                goal = "met" if ratio > 1.0 else "NOT met"
                lines.append(
                    f"- {semantic}, {mine.name}: p99 StateFun / pystatefun = {ratio:.2f}x "
                    f"(goal > 1: {goal}), p50 {other.p50_ms / mine.p50_ms:.2f}x"
                )
    return "\n".join(lines)


def ceiling(runs: list[Run], alone: list[Alone]) -> str:
    """The hot-key backlog's ceiling (bench/_server_alone.py) and each runtime's share of it."""
    rates = [a.records_per_s for a in alone]
    bound = statistics.median(rates)
    cpu = statistics.median(a.server_cpu_s / a.wall_s for a in alone if a.wall_s)
    lines = [
        f"- one hot key, backlog: the function server alone (no runtime, one batch of up to "
        f"1,000 in flight) {bound:,.0f} records/s{_spread(rates)}, CPU: function server {cpu:.2f}"
    ]
    reached: dict[tuple[str, str], float] = {}
    for run in runs:
        for phase in run.phases:
            if phase.name == HOT_BACKLOG and phase.outputs:
                reached[run.runtime, run.semantic] = phase.records_per_s
                lines.append(
                    f"- {run.semantic}, {run.runtime}: {phase.records_per_s / bound:.0%} of it"
                )
    for semantic in SEMANTICS:
        theirs = reached.get(("statefun-jvm", semantic))
        if theirs:
            lines.append(
                f"- {semantic}: no runtime could reach more than {bound / theirs:.2f}x StateFun's "
                f"records/s in this phase here"
            )
    return "\n".join(lines)


def hot_backlog_by_repeat(runs: list[Run]) -> str:
    """The one-hot-key backlog repeat by repeat: pystatefun's records/s over StateFun's, and
    the same ratio with the machine's speed taken out.

    The phases of a repeat run minutes apart, and this machine's speed moves by tens of
    percent in minutes. Both runtimes send the function server the same work here (full
    batches of 1,000 for one address), so the server's CPU per record in a phase tells how
    fast the machine ran then; the ratio of records/s times the ratio of those CPU figures
    (pystatefun's phase over StateFun's) is the ratio at one machine speed. It is about the
    ratio of the function server's busy shares (the table's "CPU: function server"): one
    batch in flight keeps the server busy for its part of each cycle, and the runtime for the
    rest. It holds while the batches stay full: smaller ones cost the server more per record,
    which this would take for a slower machine and credit to the runtime."""
    series: dict[tuple[str, str], list[Phase]] = {}
    for run in runs:
        for phase in run.phases:
            if phase.name == HOT_BACKLOG:
                series.setdefault((run.runtime, run.semantic), []).append(phase)
    lines = []
    for semantic in SEMANTICS:
        ours = series.get(("pystatefun", semantic), [])
        theirs = series.get(("statefun-jvm", semantic), [])
        plain: list[float] = []
        adjusted: list[float] = []
        cells: list[str] = []
        for mine, other in zip(ours, theirs, strict=False):  # (repeat by repeat)
            measured = (
                not p.failed and p.records_per_s and p.outputs and p.server_cpu_s
                for p in (mine, other)
            )
            if not all(measured):
                continue
            ratio = mine.records_per_s / other.records_per_s
            per_record = (mine.server_cpu_s / mine.outputs, other.server_cpu_s / other.outputs)
            plain.append(ratio)
            adjusted.append(ratio * per_record[0] / per_record[1])
            cells.append(
                f"{ratio:.2f}x at {per_record[0] * 1e6:.1f} / {per_record[1] * 1e6:.1f} us -> "
                f"{adjusted[-1]:.2f}x"
            )
        if not cells:
            continue
        lines.append(
            f"- {semantic}, {HOT_BACKLOG}, repeat by repeat: records/s pystatefun / StateFun at "
            "the function server's CPU per record in each phase (pystatefun's / StateFun's) -> "
            f"at one machine speed: {'; '.join(cells)}; the repeats' medians "
            f"{statistics.median(plain):.2f}x and {statistics.median(adjusted):.2f}x"
        )
    return "\n".join(lines)


def variant_cost(runs: list[Run], variant: str) -> str:
    """pystatefun as by default against one of its ``VARIANTS``, pair by pair: the runs of one
    repeat and semantic, one after the other. Records per runtime CPU-second is the figure to
    judge by: records/s also moves with the producer and the function server, which share the
    machine's cores."""
    title, default_name, variant_name = VARIANTS[variant]
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    default_runs = [r for r in runs if r.runtime == "pystatefun"]
    variant_runs = [r for r in runs if r.runtime == variant]
    for on, off in zip(default_runs, variant_runs, strict=False):
        for a, b in zip(on.phases, off.phases, strict=True):
            if a.name == "warm-up" or a.rate is not None or a.failed or b.failed:
                continue
            if not (a.outputs and b.outputs and a.cpu_s and b.cpu_s):
                continue
            per_cpu = (a.count / a.cpu_s) / (b.count / b.cpu_s) - 1
            rate = a.records_per_s / b.records_per_s - 1
            pairs.setdefault((on.semantic, a.name), []).append((per_cpu, rate))
    if not pairs:
        return ""
    lines = [
        f"{title} ({default_name} / {variant_name} - 1; median of the pairs, min to max):",
        "",
        "| semantic | phase | pairs | records per runtime CPU-second | records/s |",
        "|---|---|---:|---:|---:|",
    ]
    medians = []
    for (semantic, name), values in pairs.items():
        cpu = [v[0] for v in values]
        rate = [v[1] for v in values]
        medians.append(statistics.median(cpu))
        lines.append(f"| {semantic} | {name} | {len(values)} | {_signed(cpu)} | {_signed(rate)} |")
    lines.append("")
    lines.append(
        f"median over the phases, records per runtime CPU-second: "
        f"{statistics.median(medians) * 100:+.1f}%"
    )
    return "\n".join(lines)


def _signed(values: list[float]) -> str:
    median = statistics.median(values) * 100
    return f"{median:+.1f}% ({min(values) * 100:+.1f} to {max(values) * 100:+.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records, shorter phases")
    parser.add_argument("--records", type=int, help="records per throughput phase")
    parser.add_argument(
        "--backlog-records", type=int, help="records per backlog phase (default: 5x --records)"
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="records/s, latency phases")
    parser.add_argument("--latency-seconds", type=float, help="length of each latency phase")
    parser.add_argument(
        "--semantics", default=",".join(SEMANTICS), help="exactly-once,at-least-once"
    )
    parser.add_argument(
        "--runtimes",
        default=",".join(RUNTIMES),
        help=f"of {','.join(KNOWN_RUNTIMES)} (default: {','.join(RUNTIMES)})",
    )
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--heap", default="512m", help="StateFun JVM -Xmx (default: 512m)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per runtime and semantic; medians are shown"
    )
    parser.add_argument(
        "--phases",
        default="all",
        choices=("all", "throughput", "latency", "backlog"),
        help="which phases run after the warm-up (default: all)",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        # Every phase of both runtimes and semantics, a few hundred records each: most of the
        # time goes to starting StateFun's JVM runtime and its first checkpoints.
        args.records = args.backlog_records = 300
        args.rate, args.latency_seconds, args.repeat = 300.0, 1.0, 1
    missing = missing_jvm_tools()
    if missing:
        say(f"cannot run: {missing}")
        return 2
    records = args.records or (15_000 if args.quick else 60_000)
    backlog = args.backlog_records or 5 * records
    latency_s = args.latency_seconds or (5.0 if args.quick else 15.0)
    semantics = [s for s in args.semantics.split(",") if s]
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = sorted(set(runtimes) - set(KNOWN_RUNTIMES))
    if unknown:
        say(f"unknown runtime {unknown[0]!r}: use {', '.join(KNOWN_RUNTIMES)}")
        return 2

    def phases() -> list[Phase]:
        rate = args.rate
        groups = {
            "throughput": [
                Phase("many keys", MANY_KEYS, records, None),
                Phase("one hot key", 1, records, None),
            ],
            "latency": [
                Phase(f"many keys @ {rate:,.0f}/s", MANY_KEYS, round(rate * latency_s), rate),
                Phase(f"one hot key @ {rate:,.0f}/s", 1, round(rate * latency_s), rate),
            ],
            "backlog": [
                Phase("many keys, backlog", MANY_KEYS, backlog, None, backlog=True),
                Phase(HOT_BACKLOG, 1, backlog, None, backlog=True),
            ],
        }
        warm_up_records = 300 if args.smoke else 3_000 if args.quick else 10_000
        warm_up = Phase("warm-up", MANY_KEYS, warm_up_records, 2_000.0)
        chosen = groups if args.phases == "all" else {args.phases: groups[args.phases]}
        return [warm_up, *(phase for group in chosen.values() for phase in group)]

    versions = (
        f"Python {platform.python_version()}; StateFun 3.3.0 on Flink 1.16.2, {java_version()}, "
        f"-Xmx{args.heap}; Kafka {kafka_version()}; {os.cpu_count()} cores"
    )
    say(versions)
    load_before = os.getloadavg()
    runs: list[Run] = []
    alone: list[Alone] = []  # the function server without a runtime, once per repeat
    with tempfile.TemporaryDirectory(prefix="bench-jvm-") as tmp:
        work = Path(tmp)
        broker = (
            KafkaBroker.external(args.bootstrap) if args.bootstrap else KafkaBroker(heap="512m")
        )
        with broker:
            bootstrap = broker.bootstrap_servers
            say(f"Kafka at {bootstrap}")
            port = free_port()
            server = start_serve(FUNCTION, port, work / "serve.log")
            try:
                for repeat in range(args.repeat):
                    for semantic in semantics:
                        # alternate which runtime goes first, against drifting machine load
                        order = runtimes if repeat % 2 == 0 else runtimes[::-1]
                        for runtime in order:
                            if args.repeat > 1:
                                say(f"-- repeat {repeat + 1} of {args.repeat}")
                            runs.append(
                                run_one(
                                    runtime,
                                    semantic,
                                    bootstrap,
                                    server,
                                    port,
                                    phases(),
                                    work,
                                    args.heap,
                                    strict=args.smoke,
                                    broker_pid=broker.pid,
                                )
                            )
                    if args.phases in ("all", "backlog"):
                        alone.append(drive(port, server.process.pid, backlog))
                        say(
                            f"the function server alone, one hot key: "
                            f"{alone[-1].records_per_s:,.0f} records/s"
                        )
            finally:
                server.stop()
    load = os.getloadavg()
    if args.smoke:
        smoke_banner()
    print(versions)
    print(
        f"records per throughput phase: {records:,}; per backlog phase: {backlog:,}; latency "
        f"phases: {args.rate:,.0f} records/s for {latency_s:g} s; many keys = {MANY_KEYS:,} keys"
    )
    print()
    if args.repeat > 1:
        print(f"median of {args.repeat} runs each (min-max in brackets)")
    merged = merge(runs)
    print(table(merged))
    print()
    print(ratios(merged))
    print()
    by_repeat = hot_backlog_by_repeat(runs)
    if by_repeat:
        print(by_repeat)
        print()
    if alone:
        print(ceiling(merged, alone))
        print()
    for variant in VARIANTS:
        cost = variant_cost(runs, variant)
        if cost:
            print(cost)
            print()
    print(
        f"load average (1 min) at the start {load_before[0]:.2f}, at the end {load[0]:.2f} "
        f"(5 min: {load[1]:.2f})"
    )
    for run in merged:
        if run.note:
            print(f"note: {run.runtime} {run.semantic}: {run.note}")
    failed = [f"{r.runtime} {r.semantic}" for r in runs if any(p.failed for p in r.phases)]
    if args.smoke:
        failed += [f"{r.runtime} {r.semantic}: {r.note}" for r in runs if r.note]
    if failed:
        say(f"FAILED: {'; '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
