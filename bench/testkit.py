"""The test kit's virtual time: how long a test that lives through days of delayed messages
takes, in this process (statefun.testing.FunctionHarness).

  reminder-30d     one address sends itself a reminder every day for 30 days: a new
                   harness, the first message, ``advance(31 days)`` (30 delayed messages,
                   30 invocations, 30 egress records), checked
  reminders-30d-N  the same for N addresses at once (N x 30 delayed messages)
  send             one invocation through ``send`` (a counter: read, write, egress), per call
  job-reminder-30d the reminder in a module.yaml on the real runtime (JobHarness): a new
                   job, one ingress record, ``advance(31 days)``, checked, the job closed
  job-reminders-30d-N          the same for N addresses
  job-reminders-30d-N-daily-checkpoints   and a checkpoint every virtual day (31 of them,
                   written and fsynced to a temporary folder)

Each figure is the best of ``--repeat`` runs.

    .venv/bin/python bench/testkit.py
    .venv/bin/python bench/testkit.py --smoke   # does it still run? (a second)

Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, expect, progress, smoke_banner  # noqa: E402
from statefun import (  # noqa: E402
    Context,
    IntType,
    Message,
    StatefulFunctions,
    ValueSpec,
    egress_message_builder,
    kafka_egress_message,
    make_json_type,
    message_builder,
)
from statefun.testing import FunctionHarness, JobHarness, KafkaRecord  # noqa: E402

functions = StatefulFunctions()
REMINDER = make_json_type("bench/Reminder")


@functions.bind("bench/reminder", specs=[ValueSpec("sent", IntType)])
def reminder(context: Context, message: Message) -> None:
    request = message.as_type(REMINDER)
    left = request["days"]
    if request.get("fire"):
        sent = (context.storage.sent or 0) + 1
        context.storage.sent = sent
        context.send_egress(
            kafka_egress_message(
                typename="bench/mail", topic="mail", key=context.address.id, value=f"day {sent}"
            )
        )
        left -= 1
    if left > 0:
        later = message_builder(
            "bench/reminder",
            context.address.id,
            value={"days": left, "fire": True},
            value_type=REMINDER,
        )
        context.send_after(timedelta(days=1), later, f"daily-{context.address.id}")


@functions.bind("bench/counter", specs=[ValueSpec("count", IntType)])
def counter(context: Context, message: Message) -> None:
    count = context.storage.count = (context.storage.count or 0) + 1
    context.send_egress(egress_message_builder("bench/out", count, IntType))


def reminders(addresses: int, days: int = 30) -> float:
    """Seconds for one test: a harness, ``addresses`` first messages, advance, checks."""
    started = time.perf_counter()
    harness = FunctionHarness(functions)
    for n in range(addresses):
        harness.send("bench/reminder", f"user-{n}", {"days": days}, typename="bench/Reminder")
    outcome = harness.advance(timedelta(days=days + 1))
    elapsed = time.perf_counter() - started
    expect(outcome.invocations == addresses * days, f"{outcome.invocations} invocations")
    mail = outcome.egress("bench/mail")
    expect(len(mail) == addresses * days, f"{len(mail)} reminders")
    expect(
        mail[-1] == KafkaRecord("mail", f"user-{addresses - 1}", f"day {days}".encode()), "order"
    )
    expect(harness.pending_delayed() == [], "reminders left over")
    return elapsed


def sends(count: int) -> float:
    """Seconds per ``send``."""
    harness = FunctionHarness(functions)
    started = time.perf_counter()
    for _ in range(count):
        harness.send("bench/counter", "c", "x")
    elapsed = time.perf_counter() - started
    expect(harness.state("bench/counter", "c") == {"count": count}, "count")
    return elapsed / count


MODULE = f"""\
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: bench/*
  module: {Path(__file__).resolve()}:functions
---
kind: io.pystatefun.file.v1/ingress
spec:
  id: bench/in
  path: in.jsonl
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: bench/mail
"""


def job_reminders(module: Path, addresses: int, checkpoints: bool, days: int = 30) -> float:
    """Seconds for one job-level test: a JobHarness on ``module``, ``addresses`` ingress
    records, ``advance`` through the days (a checkpoint each day if ``checkpoints``), checks,
    close."""
    started = time.perf_counter()
    interval = timedelta(days=1) if checkpoints else None
    with JobHarness(module, checkpoint_interval=interval) as harness:
        ingress = harness.ingress("bench/in")
        for n in range(addresses):
            ingress.send(
                f"user-{n}", {"days": days}, target="bench/reminder", typename="bench/Reminder"
            )
        harness.advance(timedelta(days=days + 1))
        mail = harness.egress("bench/mail").records
        expect(len(mail) == addresses * days, f"{len(mail)} reminders")
        last = f"user-{addresses - 1}"
        expect(harness.state("bench/reminder", last) == {"sent": days}, "state")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best counts")
    parser.add_argument("--addresses", type=int, default=1_000, help="addresses of reminders-30d-N")
    parser.add_argument("--sends", type=int, default=20_000, help="invocations timed by send")
    parser.add_argument(
        "--job-addresses", type=int, default=100, help="addresses of job-reminders-30d-N"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.addresses, args.sends, args.job_addresses = 1, 10, 100, 5
    progress("reminder-30d ...")
    one = min(reminders(1) for _ in range(args.repeat))
    progress(f"reminders-30d-{args.addresses} ...")
    many = min(reminders(args.addresses) for _ in range(args.repeat))
    progress("send ...")
    per_send = min(sends(args.sends) for _ in range(args.repeat))
    with tempfile.TemporaryDirectory() as folder:
        module = Path(folder) / "module.yaml"
        module.write_text(MODULE, encoding="utf-8")
        progress("job-reminder-30d ...")
        job_one = min(job_reminders(module, 1, False) for _ in range(args.repeat))
        n = args.job_addresses
        progress(f"job-reminders-30d-{n} ...")
        job_many = min(job_reminders(module, n, False) for _ in range(args.repeat))
        progress(f"job-reminders-30d-{n}-daily-checkpoints ...")
        job_checkpointed = min(job_reminders(module, n, True) for _ in range(args.repeat))
    if args.smoke:
        smoke_banner()
    print(f"Python {platform.python_version()}; best of {args.repeat}")
    print()
    print("| scenario | invocations | time |")
    print("|---|---:|---:|")
    print(f"| reminder-30d | 30 | {one * 1e3:.2f} ms |")
    print(f"| reminders-30d-{args.addresses} | {args.addresses * 30:,} | {many * 1e3:.1f} ms |")
    print(f"| send | 1 | {per_send * 1e6:.1f} us |")
    print(f"| job-reminder-30d | 30 | {job_one * 1e3:.1f} ms |")
    print(f"| job-reminders-30d-{n} | {n * 30:,} | {job_many * 1e3:.1f} ms |")
    print(
        f"| job-reminders-30d-{n}-daily-checkpoints | {n * 30:,} | "
        f"{job_checkpointed * 1e3:.1f} ms |"
    )


if __name__ == "__main__":
    main()
