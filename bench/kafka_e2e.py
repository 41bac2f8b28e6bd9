"""Kafka end to end: Kafka -> counter function -> Kafka, records per second and latency.

A real Kafka 4.x broker (``statefun._kafka_local.broker.KafkaBroker``, one node, 127.0.0.1)
is started for the run, or an existing one is used (``--bootstrap``). Each scenario runs its
processor as its own process:

  loop-alo    ceiling: a plain kafka-python consume-and-produce loop (bench/_kafka_loop.py);
              every second it flushes the producer, then commits the consumed offsets
  sf-alo      pystatefun: ``statefun run`` with an io.statefun.kafka.v1/ingress, the counter
              (embedded; one IntType state, one kafka_egress_message per input;
              bench/_kafka_fns.py) and an at-least-once io.statefun.kafka.v1/egress;
              checkpoints every 1 s
  loop-eo     ceiling: the same loop with one Kafka transaction per second (records and
              consumed offsets)
  sf-eo       pystatefun with an exactly-once egress: the records of each checkpoint interval
              go into an open Kafka transaction, committed when the checkpoint completes;
              checkpoints every 1 s

Two phases per scenario, one processor process:

1. throughput: every processor reads the same backlog topic (``--records`` records, produced
   before the first scenario) from its beginning; a ``read_committed`` consumer of the output
   topic counts the records as they arrive. records/s = backlog / drain time, the time from
   the first output record to the last (start-up left out); exactly-once adds one interval,
   since its first commit holds the work of the first interval.
2. latency: a feeder process (bench/_kafka_feed.py) produces ``--rate`` records/s for
   ``--seconds`` to a second input topic, each with its send time (``time.time_ns()``); the
   same consumer subtracts it from its own clock at arrival: p50/p99 end to end.

The processor's CPU time (user + system, all threads) during the latency phase, as a share of
one core, and its peak RSS (VmHWM) are reported too: they depend less on what else runs. Every
latency record must arrive, and no record twice.

    .venv/bin/python bench/kafka_e2e.py            # about 2.5 minutes
    .venv/bin/python bench/kafka_e2e.py --quick    # about 1 minute
    .venv/bin/python bench/kafka_e2e.py --only sf-eo
    .venv/bin/python bench/kafka_e2e.py --smoke --bootstrap 127.0.0.1:9092  # does it run?

Progress goes to stderr; a Markdown table and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    SMOKE_HELP,
    cpu_seconds,
    expect,
    percentile,
    progress,
    smoke_banner,
)
from statefun._kafka_local.broker import KafkaBroker, kafka_version  # noqa: E402

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    import kafka
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
    from kafka.admin import NewTopic

PYTHON = sys.executable
LOOP = ROOT / "bench" / "_kafka_loop.py"
FEED = ROOT / "bench" / "_kafka_feed.py"
FUNCTIONS = ROOT / "bench" / "_kafka_fns.py"
PARTITIONS = 4
KEYS = 10_000
INTERVAL_MS = 1000
SCENARIOS = {
    "loop-alo": ("kafka-python loop", "at-least-once"),
    "sf-alo": ("pystatefun", "at-least-once"),
    "loop-eo": ("kafka-python loop", "exactly-once"),
    "sf-eo": ("pystatefun", "exactly-once"),
}


@dataclass
class Result:
    name: str
    processor: str
    semantic: str
    records_per_s: float
    drain_s: float
    cpu_percent: float  # of one core, at the latency phase's rate
    p50_ms: float
    p99_ms: float
    peak_rss_mb: float
    latency_records: int
    duplicates: int


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- topics and input -----------------------------------------------------------------------------


def create_topics(bootstrap: str, *names: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
        )
    finally:
        admin.close()


def feed(bootstrap: str, topic: str, count: int, rate: float, kind: str) -> subprocess.Popen[str]:
    args = [PYTHON, str(FEED), "--bootstrap", bootstrap, "--topic", topic, "--count", str(count)]
    args += ["--rate", str(rate), "--keys", str(KEYS), "--kind", kind]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


class Reader:
    """A read_committed consumer of every partition of a topic, from its beginning."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            max_poll_records=2000,
        )
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.consumer.assign(self.partitions)
        self.consumer.seek_to_beginning(*self.partitions)

    def poll(self) -> list[bytes]:
        polled = self.consumer.poll(timeout_ms=50)
        return [r.value for records in polled.values() for r in records]

    def close(self) -> None:
        self.consumer.close()


# -- processors -----------------------------------------------------------------------------------


def start_processor(
    name: str, bootstrap: str, topics: list[str], out: str, tmp: Path, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    processor, semantic = SCENARIOS[name]
    group = f"{out}-group"
    log = tmp / f"{name}.log"
    if processor != "pystatefun":
        command = [PYTHON, str(LOOP), "--bootstrap", bootstrap, "--topics", ",".join(topics)]
        command += ["--out", out, "--group", group, "--interval-ms", str(args.interval_ms)]
        if semantic == "exactly-once":
            command.append("--transactional")
        with log.open("wb") as err:
            return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    topic_specs = "".join(
        f"    - topic: {t}\n      valueType: bench/Stamp\n      targets:\n        - bench/counter\n"
        for t in topics
    )
    timeout = "    transactionTimeout: 1min\n" if semantic == "exactly-once" else ""
    module = tmp / f"{name}.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\n"
        f"spec:\n  functions: bench/*\n  module: {FUNCTIONS}:functions\n"
        "---\nkind: io.statefun.kafka.v1/ingress\nspec:\n  id: bench/in\n"
        f"  address: {bootstrap}\n  consumerGroupId: {group}\n"
        "  startupPosition:\n    type: earliest\n"
        f"  topics:\n{topic_specs}"
        "---\nkind: io.statefun.kafka.v1/egress\nspec:\n  id: bench/out\n"
        f"  address: {bootstrap}\n  deliverySemantic:\n    type: {semantic}\n{timeout}"
        f"  properties:\n    - transactional.id: {out}-tx\n"
    )
    command = [PYTHON, "-m", "statefun", "--log-level", args.log_level, "run", str(module)]
    command += ["--set", f"checkpoint_dir={tmp / name / 'checkpoints'}"]
    command += ["--set", f"checkpoint_interval_ms={args.interval_ms}"]
    command += ["--set", f"dead_letter_path={tmp / name / 'dead.jsonl'}"]
    env = {**os.environ, "BENCH_KAFKA_OUT": out}
    with log.open("wb") as err:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=tmp)


def run_scenario(
    name: str, bootstrap: str, backlog: str, args: argparse.Namespace, tmp: Path
) -> Result:
    processor, semantic = SCENARIOS[name]
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    live, out = f"{tag}-live", f"{tag}-out"
    create_topics(bootstrap, live, out)
    reader = Reader(bootstrap, out)
    process = start_processor(name, bootstrap, [backlog, live], out, tmp, args)
    n = args.records
    latency_count = int(args.rate * args.seconds)
    arrivals: list[float] = []  # time of each poll that brought backlog records
    latencies: list[float] = []
    seen = 0
    feeder: subprocess.Popen[str] | None = None
    try:
        progress(f"[{name}] throughput: {n:,} backlog records through {processor}, {semantic}")
        deadline = time.monotonic() + 60 + n / 500
        while seen < n:
            if process.poll() is not None:
                raise RuntimeError(f"{name}: processor exited {process.returncode}, see {tmp}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only {seen} of {n} records after the deadline")
            got = sum(1 for value in reader.poll() if value[:1] == b"T")
            if got:
                seen += got
                arrivals.append(time.monotonic())
        expect(seen == n, f"{name}: {seen} backlog records arrived, expected {n}")
        # Exactly-once: the first commit holds the work of the first interval.
        lead = args.interval_ms / 1000 if semantic == "exactly-once" else 0.0
        drain = max(arrivals[-1] - arrivals[0] + lead, 0.001)  # tiny runs: one poll
        rate = n / drain
        progress(f"[{name}]   {rate:,.0f} records/s ({n:,} in {drain:.2f} s)")

        progress(f"[{name}] latency: {args.rate:,.0f} records/s for {args.seconds:g} s")
        cpu_before, started = cpu_seconds(process.pid), time.monotonic()
        feeder = feed(bootstrap, live, latency_count, args.rate, "L")
        deadline = time.monotonic() + args.seconds + 60
        extra = 0
        while len(latencies) < latency_count and time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name}: processor exited {process.returncode}, see {tmp}")
            values = reader.poll()
            now_ns = time.time_ns()
            for value in values:
                if value[:1] == b"L":
                    stamp = int(value[2:].split(b" ", 1)[0])
                    latencies.append((now_ns - stamp) / 1e6)
                else:
                    extra += 1
        cpu_percent = 100 * (cpu_seconds(process.pid) - cpu_before) / (time.monotonic() - started)
        # A little longer: records seen twice would show up now (there should be none).
        settle = time.monotonic() + 2 * args.interval_ms / 1000
        late = 0
        while time.monotonic() < settle:
            late += len(reader.poll())
        rss = peak_rss_mb(process.pid)
    finally:
        if feeder is not None:
            feeder.wait(timeout=60)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.close()
    expect(
        len(latencies) >= latency_count,
        f"{name}: only {len(latencies)} of {latency_count} latency records arrived",
    )
    ordered = sorted(latencies)
    result = Result(
        name=name,
        processor=processor,
        semantic=semantic,
        records_per_s=rate,
        drain_s=drain,
        cpu_percent=cpu_percent,
        p50_ms=percentile(ordered, 0.50),
        p99_ms=percentile(ordered, 0.99),
        peak_rss_mb=rss,
        latency_records=len(ordered),
        duplicates=extra + late + max(0, len(latencies) - latency_count),
    )
    progress(
        f"[{name}]   p50 {result.p50_ms:,.1f} ms, p99 {result.p99_ms:,.1f} ms "
        f"({len(ordered)} records), CPU {cpu_percent:.0f}% of a core, peak RSS {rss:.0f} MB, "
        f"duplicates {result.duplicates}, exit {process.returncode}"
    )
    expect(result.duplicates == 0, f"{name}: {result.duplicates} records arrived twice")
    return result


# -- report ---------------------------------------------------------------------------------------


def machine() -> str:
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model or platform.processor()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, kafka-python {kafka.__version__}, Kafka "
        f"{kafka_version()}; load average {load}"
    )


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(f"\n{machine()}")
    print(
        f"backlog {args.records:,} records over {PARTITIONS} partitions, {KEYS:,} keys; "
        f"latency and CPU at {args.rate:,.0f} records/s for {args.seconds:g} s; "
        f"checkpoints (pystatefun) and offset commits / transactions (loop) every "
        f"{args.interval_ms} ms\n"
    )
    print(
        "| scenario | processor | delivery | records/s | p50 latency | p99 latency | "
        f"CPU at {args.rate:,.0f}/s | peak RSS | duplicates |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r.name} | {r.processor} | {r.semantic} | {r.records_per_s:,.0f} | "
            f"{r.p50_ms:,.1f} ms | {r.p99_ms:,.1f} ms | {r.cpu_percent:.0f}% | "
            f"{r.peak_rss_mb:.0f} MB | {r.duplicates} |"
        )
    by_name = {r.name: r for r in results}
    print()
    for ours, ceiling in (("sf-alo", "loop-alo"), ("sf-eo", "loop-eo")):
        if ours in by_name and ceiling in by_name:
            a, b = by_name[ours], by_name[ceiling]
            print(
                f"- {ours} / {ceiling}: {a.records_per_s / b.records_per_s:.2f}x records/s, "
                f"p50 {a.p50_ms / b.p50_ms:.2f}x, p99 {a.p99_ms / b.p99_ms:.2f}x, "
                f"CPU {a.cpu_percent / b.cpu_percent:.2f}x"
            )
    if "sf-alo" in by_name and "sf-eo" in by_name:
        a, b = by_name["sf-eo"], by_name["sf-alo"]
        print(f"- sf-eo / sf-alo: {a.records_per_s / b.records_per_s:.2f}x records/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about 1 minute)")
    parser.add_argument(
        "--records", type=int, help="backlog records (default 300,000; 100,000 with --quick)"
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="latency phase records/s")
    parser.add_argument("--seconds", type=float, help="latency phase length (default 15)")
    parser.add_argument("--only", action="append", choices=list(SCENARIOS))
    parser.add_argument("--log-level", default="warning", help="of the runtime processes")
    parser.add_argument("--log-dir", help="keep the processors' logs here (default: dropped)")
    parser.add_argument(
        "--interval-ms",
        type=int,
        default=INTERVAL_MS,
        help=f"checkpoints / commits every so many ms (default {INTERVAL_MS})",
    )
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.records, args.seconds, args.rate, args.interval_ms = 2_000, 1.0, 500.0, 200
    args.records = args.records or (100_000 if args.quick else 300_000)
    args.seconds = args.seconds or (4.0 if args.quick else 15.0)
    names = args.only or list(SCENARIOS)
    if args.bootstrap:
        broker = KafkaBroker.external(args.bootstrap)
    else:
        progress(f"starting a Kafka {kafka_version()} broker")
        broker = KafkaBroker()
    with broker, tempfile.TemporaryDirectory(prefix="kafka-e2e-") as tmp:
        work = Path(args.log_dir) if args.log_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        bootstrap = broker.bootstrap_servers
        backlog = f"backlog-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, backlog)
        progress(f"producing the backlog: {args.records:,} records to {backlog}")
        started = time.monotonic()
        feeder = feed(bootstrap, backlog, args.records, 0, "T")
        if feeder.wait() != 0:
            raise RuntimeError("producing the backlog failed")
        progress(f"  {args.records / (time.monotonic() - started):,.0f} records/s produced")
        results = [run_scenario(n, bootstrap, backlog, args, work) for n in names]
    if args.smoke:
        smoke_banner()
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
