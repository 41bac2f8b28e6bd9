"""Scale-out on Kafka: one job in one process, and on 1 and 2 clustered worker processes.

Kafka ingress -> embedded counter -> Kafka egress (exactly-once), 10,000 keys, as
bench/kafka_e2e.py's ``sf-eo``; and a two-hop job (each input goes to ``bench/hop``, which sends
it to the counter of another key: with two workers most hops cross between them through the
job's exchange topic). Modes, each its own process tree, one after the other:

  single      ``statefun run`` (one process, checkpoints to a local folder, no cluster)
  cluster-1   ``statefun run --workers 1`` (one worker of a clustered job: exchange and
              changelog topics, one Kafka transaction per checkpoint)
  cluster-2   ``statefun run --workers 2`` (two workers on this machine)

Per mode and job: records/s draining a backlog (``--records`` records over 4 partitions, read
from the beginning; from the first commit of output records to the one that holds the last)
and its steady part (from the commit that holds 10% of them to the one that holds 90%: without
the start and the last records' wait for their commit, one checkpoint interval or, for a record
that crossed between two workers, two), with the CPU each worker process and the broker spent
per record meanwhile, then p50/p99 end-to-end latency at ``--rate`` records/s for
``--seconds``, with the CPU time of every worker process and of the broker (when this script
started it, or ``--broker-pid``) over that phase, as shares of one core.

The drain is watched, not read: every 50 ms one ListOffsets request (``read_committed``: the
output's last stable offsets) and the processes' CPU times from /proc. The output records are
read once the ends stop moving, outside the timed window, and checked against the backlog:
each record's output exactly once, and each key's counts 1..m (``read_committed``).

    .venv/bin/python bench/cluster.py                 # about 4 minutes
    .venv/bin/python bench/cluster.py --quick         # about 2 minutes
    .venv/bin/python bench/cluster.py --smoke --bootstrap 127.0.0.1:9092  # does it run?
    .venv/bin/python bench/cluster.py --quick --profile /tmp/prof  # where the CPU goes
    .venv/bin/python bench/cluster.py --only-job one-hop --repeat 3  # 3 rounds, ratios per round

With ``--repeat N`` the modes take turns N times (single, cluster-1, cluster-2, single, ...) on
the same backlog, and each round's ratios are against that round's single run (its neighbour:
this machine's speed drifts within minutes), with their median.

Progress goes to stderr; a Markdown table and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
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
    terminate,
)
from bench.kafka_e2e import (  # noqa: E402
    KEYS,
    PARTITIONS,
    KafkaAdminClient,
    Reader,
    create_topics,
    feed,
    kafka,
    machine,
)
from statefun._kafka_local.broker import KafkaBroker, kafka_version  # noqa: E402

PYTHON = sys.executable
FUNCTIONS = ROOT / "bench" / "_cluster_fns.py"
MODES = {"single": 0, "cluster-1": 1, "cluster-2": 2}
JOBS = {"one-hop": "bench/counter", "two-hop": "bench/hop"}
#: how often the drain's watch samples the output's committed ends and the CPU times
_WATCH_S = 0.05


@dataclass
class Result:
    mode: str
    job: str
    round: int
    records_per_s: float
    steady_per_s: float  # records/s from 10% to 90% of the drain's committed output
    p50_ms: float
    p99_ms: float
    worker_cpu: list[float]  # % of a core, each worker process
    broker_cpu: float | None
    drain_us: list[float]  # CPU per backlog record while draining, us, each worker process
    broker_drain_us: float | None


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def start(
    mode: str,
    job: str,
    bootstrap: str,
    topics: list[str],
    out: str,
    tmp: Path,
    args: argparse.Namespace,
) -> subprocess.Popen[bytes]:
    specs = "".join(
        f"    - topic: {t}\n      valueType: bench/Stamp\n      targets:\n        - {JOBS[job]}\n"
        for t in topics
    )
    module = tmp / f"{mode}-{job}.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\n"
        f"spec:\n  functions: bench/*\n  module: {FUNCTIONS}:functions\n"
        "---\nkind: io.statefun.kafka.v1/ingress\nspec:\n  id: bench/in\n"
        f"  address: {bootstrap}\n  consumerGroupId: {out}-group\n"
        "  startupPosition:\n    type: earliest\n"
        f"  topics:\n{specs}"
        "---\nkind: io.statefun.kafka.v1/egress\nspec:\n  id: bench/out\n"
        f"  address: {bootstrap}\n  deliverySemantic:\n    type: exactly-once\n"
        "    transactionTimeout: 1min\n"
        f"  properties:\n    - transactional.id: {out}-tx\n"
    )
    folder = tmp / out  # each run its own: the modes take turns with --repeat
    folder.mkdir()
    command = [PYTHON, "-m", "statefun", "--log-level", args.log_level, "run", str(module)]
    command += ["--set", f"checkpoint_interval_ms={args.interval_ms}"]
    command += ["--set", f"dead_letter_path={folder / 'dead.jsonl'}"]
    for setting in args.set or ():
        command += ["--set", setting]
    if MODES[mode]:
        command += ["--workers", str(MODES[mode])]
        command += ["--set", f"cluster.bootstrap_servers={bootstrap}"]
        command += ["--set", f"cluster.job_id={out}", "--set", "cluster.worker_id=bench"]
        command += ["--set", f"cluster.partitions={args.partitions}"]
    else:
        command += ["--set", f"checkpoint_dir={folder / 'checkpoints'}"]
    env = {**os.environ, "BENCH_KAFKA_OUT": out}
    if args.profile:  # every process of the tree profiles its threads (bench/_profile_site)
        site = str(ROOT / "bench" / "_profile_site")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH", "")]))
        env["BENCH_PROFILE_DIR"] = str(Path(args.profile).resolve() / f"{mode}-{job}")
    with (tmp / f"{mode}-{job}.log").open("wb") as err:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=folder)


@dataclass
class Sample:
    """The output topic's committed ends and the CPU seconds spent so far, at one moment."""

    at: float  # time.monotonic()
    ends: list[int]  # the last stable offset of each output partition (read_committed)
    cpu: list[float]  # each worker process (none before the first commit)
    broker: float


Output = tuple[int, int, bytes, bytes]  # partition, offset, key, value


class Backlog:
    """The backlog's records, to check each mode's outputs against (read once, before the
    first mode: outside every timed window)."""

    def __init__(self, bootstrap: str, topic: str, n: int) -> None:
        self.topic = topic
        reader = Reader(bootstrap, topic)
        try:
            ends = reader.consumer.end_offsets(reader.partitions)
            records = read_to(reader, [ends[tp] for tp in reader.partitions])
        finally:
            reader.close()
        expect(len(records) == n, f"the backlog holds {len(records)} of {n} records")
        self.records = Counter((key, value) for _, _, key, value in records)
        self.per_key = Counter(key for _, _, key, _ in records)

    def check(self, tag: str, job: str, outputs: list[Output]) -> None:
        """Each backlog record's output exactly once, counted once by its key's counter (the
        outputs of a key of m records carry the counts 1..m): exactly-once state and output."""
        suffix = b"x" if job == "two-hop" else b""  # the hop's counter key: ``<id>x``
        seen: Counter[tuple[bytes, bytes]] = Counter()
        counts: dict[bytes, list[int]] = {}
        for _, _, key, value in outputs:
            expect(key.endswith(suffix), f"{tag}: an output keyed {key!r}")
            original = key[: len(key) - len(suffix)]
            stamp, _, count = value.rpartition(b" ")
            seen[(original, stamp)] += 1
            counts.setdefault(original, []).append(int(count))
        twice = sum(c - 1 for c in seen.values() if c > 1)
        expect(twice == 0, f"{tag}: {twice} backlog records' outputs arrived twice")
        missing = sum((self.records - seen).values())
        expect(missing == 0, f"{tag}: {missing} backlog records' outputs are missing")
        expect(seen == self.records, f"{tag}: outputs of no backlog record")
        wrong = [k for k, m in self.per_key.items() if sorted(counts[k]) != [*range(1, m + 1)]]
        expect(not wrong, f"{tag}: {len(wrong)} keys counted wrong, {wrong[:1]!r} first")


def read_to(reader: Reader, ends: list[int]) -> list[Output]:
    """``reader``'s records from where it is up to ``ends`` (one offset per partition)."""
    consumer, partitions = reader.consumer, reader.partitions
    records: list[Output] = []
    deadline = time.monotonic() + 120
    while any(consumer.position(tp) < end for tp, end in zip(partitions, ends, strict=True)):
        expect(time.monotonic() < deadline, f"{partitions[0].topic}: not read up to {ends}")
        for tp, batch in consumer.poll(timeout_ms=100, max_records=10_000).items():
            records += [(tp.partition, r.offset, r.key, r.value) for r in batch]
    return records


class Group:
    """Whether a clustered job's group is stable: every worker a member with its partitions
    (a worker that joins later makes the group move the partitions: the drain is counted
    from the first commit after the last such move)."""

    def __init__(self, bootstrap: str, job_id: str, workers: int) -> None:
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap) if workers else None
        self.group, self.workers = f"pystatefun.{job_id}", workers
        self.members: list[str] = []

    def stable(self) -> bool:
        if self.admin is None:
            return True
        try:
            described = self.admin.describe_groups([self.group]).get(self.group) or {}
        except kafka.errors.KafkaError as exc:  # a new broker's group coordinator is still starting
            if not getattr(exc, "retriable", False):
                raise
            return False
        members = described.get("members") or []
        assigned = [m for m in members if m.get("member_assignment")]
        self.members = sorted(str(m.get("member_id")) for m in members)
        return described.get("group_state") == "Stable" and len(assigned) == self.workers

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()


def watch_drain(
    tag: str,
    process: subprocess.Popen[bytes],
    reader: Reader,
    group: Group,
    broker_pid: int | None,
    args: argparse.Namespace,
) -> tuple[list[Sample], int, list[Output]]:
    """Every ``_WATCH_S``, the output topic's committed ends (one ListOffsets request) and the
    CPU seconds of the processes, until the ends reach the backlog and stay put for two
    checkpoint intervals; then the records up to there are read (after the drain: a reader
    reading as they come would compete for the cores the drain is measured on), and the
    watch goes on if some are missing. The samples, the index of the first one that saw the
    group stable, and the records read."""
    n, quiet_s = args.records, 2 * args.interval_ms / 1000
    consumer, partitions = reader.consumer, reader.partitions
    samples: list[Sample] = []
    outputs: list[Output] = []
    pids: list[int] = []
    stable_at = -1
    moved_at = 0.0
    drained = False
    deadline = time.monotonic() + 90 + n / 300
    while True:
        expect(process.poll() is None, f"{tag}: exited {process.returncode}")
        expect(
            time.monotonic() < deadline,
            f"{tag}: "
            + ("the group was never stable" if drained else "not drained before the deadline"),
        )
        if not pids:  # every process of the job, once it runs
            pids = children(process.pid) if group.workers else [process.pid]
            pids = pids if len(pids) == max(group.workers, 1) else []
        if stable_at < 0 and pids and group.stable():
            stable_at = len(samples)
        by_partition = consumer.end_offsets(partitions)
        ends = [by_partition[tp] for tp in partitions]
        sample = Sample(
            time.monotonic(),
            ends,
            [cpu_seconds(p) for p in pids] if pids else [0.0] * max(group.workers, 1),
            cpu_seconds(broker_pid) if broker_pid else 0.0,
        )
        if not samples or samples[-1].ends != ends:
            moved_at = sample.at
        samples.append(sample)
        if sum(ends) >= n and sample.at - moved_at >= quiet_s:  # (ends count commit markers)
            outputs += read_to(reader, ends)
            # a small backlog may drain before the last worker has its share: then the watch
            # goes on until the group is stable, so that a worker that never joins still fails
            drained = sum(1 for o in outputs if o[3][:1] == b"T") >= n
            if drained and stable_at >= 0:
                members = group.members
                expect(group.stable() and group.members == members, f"{tag}: the group moved")
                return samples, stable_at, outputs
        time.sleep(_WATCH_S)


def drain_figures(
    samples: list[Sample], stable_at: int, outputs: list[Output]
) -> tuple[float, float, list[float], float, int]:
    """records/s, steady records/s (``steady_rate``), CPU microseconds per record of each
    worker process and of the broker, and the records counted: those of the commits after the
    first commit of backlog records that was seen once the group was stable, up to the sample
    that first saw the last of them committed (the work of the commits counted is done between
    those two samples, about). A backlog drained before the group was stable (as in --smoke)
    is counted from its first commit, or the start."""
    last: dict[int, int] = {}
    for partition, offset, _, value in outputs:
        if value[:1] == b"T":
            last[partition] = max(offset, last.get(partition, -1))
    end = next(i for i, s in enumerate(samples) if all(s.ends[p] > o for p, o in last.items()))
    commits = [i for i in range(1, end) if samples[i].ends != samples[i - 1].ends]
    stable = [i for i in commits if i >= stable_at]
    first = (stable or commits or [0])[0]
    start, stop = samples[first], samples[end]
    counted = sum(1 for p, o, _, v in outputs if v[:1] == b"T" and o >= start.ends[p])
    workers = [1e6 * (a - b) / counted for a, b in zip(stop.cpu, start.cpu, strict=True)]
    broker = 1e6 * (stop.broker - start.broker) / counted
    rate = counted / max(stop.at - start.at, 0.001)
    return rate, steady_rate(samples[first : end + 1]), workers, broker, counted


def steady_rate(samples: list[Sample]) -> float:
    """records/s between the samples that first saw 10% and 90% of the output these samples
    saw committed: the drain without its start (the first commits) and its end (the last
    records wait for their commit: one checkpoint interval, and with two workers a record
    that crossed between them waits for two), so that a drain of a few seconds is not
    dominated by one or two intervals of latency. The ends count the commit markers too (one
    per partition per commit: a few per thousand records)."""
    base = sum(samples[0].ends)
    total = sum(samples[-1].ends) - base
    low = next(s for s in samples if sum(s.ends) - base >= 0.1 * total)
    high = next(s for s in samples if sum(s.ends) - base >= 0.9 * total)
    if high.at <= low.at:  # (one commit held most of the drain: too short to tell)
        return (total / max(samples[-1].at - samples[0].at, 0.001)) if total else 0.0
    return (sum(high.ends) - sum(low.ends)) / (high.at - low.at)


def run(
    mode: str,
    job: str,
    round_: int,
    bootstrap: str,
    backlog: Backlog,
    broker_pid: int | None,
    args: argparse.Namespace,
    tmp: Path,
) -> Result:
    tag = f"{mode}-{job}-{uuid.uuid4().hex[:6]}"
    live, out = f"{tag}-live", f"{tag}-out"
    create_topics(bootstrap, live, out)
    reader = Reader(bootstrap, out)
    process = start(mode, job, bootstrap, [backlog.topic, live], out, tmp, args)
    n, want = args.records, int(args.rate * args.seconds)
    latencies: list[float] = []
    extra = 0
    feeder = None
    try:
        progress(f"[{tag}] backlog of {n:,}")
        group = Group(bootstrap, out, MODES[mode])
        try:
            samples, stable_at, outputs = watch_drain(tag, process, reader, group, broker_pid, args)
        finally:
            group.close()
        rate, steady, drain_us, broker_drain_us, counted = drain_figures(
            samples, stable_at, outputs
        )
        backlog.check(tag, job, [o for o in outputs if o[3][:1] == b"T"])
        extra += sum(1 for o in outputs if o[3][:1] != b"T")
        progress(
            f"[{tag}]   {rate:,.0f} records/s ({steady:,.0f} steady) over {counted:,} records; "
            "every output once"
        )
        pids = children(process.pid) if MODES[mode] else [process.pid]
        before = [cpu_seconds(p) for p in pids]
        broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
        started = time.monotonic()
        feeder = feed(bootstrap, live, want, args.rate, "L")
        deadline = time.monotonic() + args.seconds + 60
        while len(latencies) < want and time.monotonic() < deadline:
            values = reader.poll()
            now_ns = time.time_ns()
            for value in values:
                if value[:1] == b"L":
                    latencies.append((now_ns - int(value[2:].split(b" ", 1)[0])) / 1e6)
                else:
                    extra += 1
        elapsed = time.monotonic() - started
        cpu = [100 * (cpu_seconds(p) - b) / elapsed for p, b in zip(pids, before, strict=True)]
        broker = 100 * (cpu_seconds(broker_pid) - broker_before) / elapsed if broker_pid else None
        settle = time.monotonic() + 2 * args.interval_ms / 1000
        while time.monotonic() < settle:
            extra += len(reader.poll())
    finally:
        if feeder is not None:
            feeder.wait(timeout=60)
        terminate(process)
        reader.close()
    expect(len(latencies) == want, f"{tag}: {len(latencies)} of {want} latency records")
    expect(extra == 0, f"{tag}: {extra} records arrived twice")
    ordered = sorted(latencies)
    result = Result(
        mode,
        job,
        round_,
        rate,
        steady,
        percentile(ordered, 0.5),
        percentile(ordered, 0.99),
        cpu,
        broker,
        drain_us,
        broker_drain_us,
    )
    progress(
        f"[{tag}]   p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, CPU {cpu}; "
        f"drain CPU per record {drain_us} us, broker {broker_drain_us}"
    )
    return result


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(f"\n{machine()}")
    print(
        f"backlog {args.records:,} records over {PARTITIONS} partitions, {KEYS:,} keys; latency "
        f"and CPU at {args.rate:,.0f} records/s for {args.seconds:g} s; checkpoints every "
        f"{args.interval_ms} ms; cluster_partitions {args.partitions}\n"
    )
    print(
        "| round | job | mode | records/s | steady records/s | drain CPU/record: workers | "
        "broker | p50 | p99 | CPU per worker | broker CPU |"
    )
    print("| ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: |")
    for r in results:
        workers = " + ".join(f"{c:.0f}%" for c in r.worker_cpu)
        broker = "-" if r.broker_cpu is None else f"{r.broker_cpu:.0f}%"
        per_record = " + ".join(f"{c:.1f}" for c in r.drain_us) + " us"
        broker_us = "-" if r.broker_drain_us is None else f"{r.broker_drain_us:.1f} us"
        print(
            f"| {r.round} | {r.job} | {r.mode} | {r.records_per_s:,.0f} | "
            f"{r.steady_per_s:,.0f} | {per_record} | "
            f"{broker_us} | {r.p50_ms:,.1f} ms | {r.p99_ms:,.1f} ms | {workers} | {broker} |"
        )
    print()
    for job in JOBS:
        for mode in ("cluster-1", "cluster-2"):
            for what, figure in (("records/s", "records_per_s"), ("steady", "steady_per_s")):
                ratios = round_ratios(results, job, mode, figure)
                if ratios:
                    each = ", ".join(f"{x:.2f}x" for x in ratios)
                    median = statistics.median(ratios)
                    print(f"- {job}: {mode} / single: {each} {what} (median {median:.2f}x)")


def round_ratios(results: list[Result], job: str, mode: str, figure: str) -> list[float]:
    """Per round, ``mode``'s ``figure`` over the single-process run's of the same round."""
    ratios = []
    for n in sorted({r.round for r in results}):
        by = {r.mode: r for r in results if r.job == job and r.round == n}
        if "single" in by and mode in by:
            ratios.append(getattr(by[mode], figure) / getattr(by["single"], figure))
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about 2 minutes)")
    parser.add_argument("--records", type=int, help="backlog records (default 100,000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency phase records/s")
    parser.add_argument("--seconds", type=float, help="latency phase length (default 10)")
    parser.add_argument("--only-mode", action="append", choices=list(MODES))
    parser.add_argument("--only-job", action="append", choices=list(JOBS))
    parser.add_argument("--partitions", type=int, default=32, help="cluster_partitions")
    parser.add_argument("--interval-ms", type=int, default=1000, help="checkpoint interval")
    parser.add_argument("--log-level", default="warning", help="of the runtime processes")
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="a runtime setting, every mode"
    )
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--broker-pid", type=int, help="the existing broker's pid (its CPU)")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the runtime's processes (cProfile per thread, slower): pstats and "
        "per-thread CPU into DIR/<mode>-<job>/",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds: the modes take turns this many times"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    expect(args.repeat >= 1, "--repeat must be at least 1")
    expect(args.repeat == 1 or not args.profile, "--profile profiles one round: no --repeat")
    if args.smoke:
        args.records, args.seconds, args.rate, args.interval_ms = 1_000, 1.0, 300.0, 200
    args.records = args.records or (50_000 if args.quick else 100_000)
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    broker = KafkaBroker.external(args.bootstrap) if args.bootstrap else KafkaBroker()
    if not args.bootstrap:
        progress(f"starting a Kafka {kafka_version()} broker")
    with broker, tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        bootstrap = broker.bootstrap_servers
        topic = f"backlog-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, topic)
        progress(f"producing the backlog: {args.records:,} records")
        expect(feed(bootstrap, topic, args.records, 0, "T").wait() == 0, "the backlog failed")
        backlog = Backlog(bootstrap, topic, args.records)
        results = [
            run(mode, job, n, bootstrap, backlog, broker.pid or args.broker_pid, args, Path(tmp))
            for n in range(1, args.repeat + 1)
            for job in (args.only_job or list(JOBS))
            for mode in (args.only_mode or list(MODES))
        ]
    if args.smoke:
        smoke_banner()
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
