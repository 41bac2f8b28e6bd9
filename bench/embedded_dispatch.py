"""The CPU per message around an embedded function, without the event loop: keyBy and a
dispatcher's inbox, run slice by slice (``runtime/_batch.py``) and one message at a time (the
per-message path, ``Dispatcher.batched = False``), interleaved in this process.

The function is bench/runtime_e2e.py's counter (one IntType state incremented, one egress
record per message) and the sink its ``TimingSink``; the messages are built before the clock
starts. Per round, 10,000 messages are sent through ``Job.send`` (keyBy: key group, admission,
the dispatcher's inbox) and every dispatcher's inbox is worked off as its ``run`` loop would,
``dispatcher_slice`` messages at a time. Figures are CPU time of this thread (``thread_time``,
so other work on the machine counts less than in wall time), microseconds per message, the
median of the measured rounds.

  many keys   10,000 keys in turn (bench/runtime_e2e.py's scenario a): no two messages of a
              slice go to one address
  one key     every message to one address (runs of one address: the state read once)

    .venv/bin/python bench/embedded_dispatch.py
    .venv/bin/python bench/embedded_dispatch.py --rounds 20
    .venv/bin/python bench/embedded_dispatch.py --smoke     # does it still run? (a second)

Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, expect, progress, smoke_banner  # noqa: E402
from bench.runtime_e2e import (  # noqa: E402
    FUNCTION_TARGET,
    INT_TYPENAME,
    TimingSink,
    _serialize_int,
)
from statefun._settings import Settings  # noqa: E402
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec  # noqa: E402
from statefun.runtime import Job  # noqa: E402
from statefun.runtime._dispatcher import Dispatcher  # noqa: E402
from statefun.runtime._envelope import Envelope  # noqa: E402
from statefun.sdk import TypedValue  # noqa: E402

COUNTER = "bench/counter"
clock = time.thread_time


def new_job() -> tuple[Job, TimingSink]:
    settings = Settings.load({"max_in_flight_messages": "100000"}, environ={})
    endpoint = EmbeddedEndpointSpec(FunctionTarget("bench", "counter"), FUNCTION_TARGET)
    sink = TimingSink()
    return Job(ModuleSpec(endpoints=(endpoint,)), settings, sources=[], sinks=[sink]), sink


def one_round(job: Job, ids: list[str], first: int, batched: bool) -> tuple[float, float]:
    """(route, dispatch) CPU seconds of one round of ``len(ids)`` messages."""
    Dispatcher.batched = batched
    values = [TypedValue(INT_TYPENAME, _serialize_int(first + i)) for i in range(len(ids))]
    send = job.send
    slice_size = job.settings.dispatcher_slice
    started = clock()
    for id_, value in zip(ids, values, strict=True):
        send(Envelope(COUNTER, id_, value, None))
    routed = clock()
    for dispatcher in job.dispatchers:
        inbox = dispatcher.inbox
        while inbox:
            dispatcher._run_slice(inbox, slice_size)
    return routed - started, clock() - routed


def measure(keys: int, messages: int, rounds: int, warmup: int) -> dict[bool, list[float]]:
    """Per path (batched or not): route and dispatch microseconds per message, medians."""
    jobs = {batched: new_job() for batched in (True, False)}
    ids = [f"key-{i % keys}" for i in range(messages)]
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    gc.disable()  # (a collection would land in whichever round it falls)
    try:
        for round_ in range(warmup + rounds):
            for batched in (round_ % 2 == 0, round_ % 2 != 0):  # the order alternates
                job, _ = jobs[batched]
                route, dispatch = one_round(job, ids, round_ * messages, batched)
                if round_ >= warmup:
                    times[batched].append((route, dispatch))
    finally:
        gc.enable()
        Dispatcher.batched = True
    for batched, (job, sink) in jobs.items():
        expect(
            len(sink.seqs) == messages * (warmup + rounds),
            f"{keys} keys, batched={batched}: the sink saw {len(sink.seqs)} records",
        )
        expect(job.pending == 0, f"{keys} keys: {job.pending} messages still in flight")
    return {
        batched: [
            statistics.median(t[0] for t in pairs) * 1e6 / messages,
            statistics.median(t[1] for t in pairs) * 1e6 / messages,
        ]
        for batched, pairs in times.items()
    }


async def run(args: argparse.Namespace) -> list[tuple[str, dict[bool, list[float]]]]:
    results = []
    for name, keys in (("many keys", 10_000), ("one key", 1)):
        progress(f"{name}: {args.rounds} rounds of {args.messages:,} messages per path")
        results.append((name, measure(keys, args.messages, args.rounds, args.warmup)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="measured rounds per path")
    parser.add_argument("--warmup", type=int, default=5, help="rounds before measuring")
    parser.add_argument("--messages", type=int, default=10_000, help="messages per round")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.warmup, args.messages = 2, 1, 500
    results = asyncio.run(run(args))
    if args.smoke:
        smoke_banner()
    print("| keys | path | route us/msg | dispatch us/msg | both us/msg |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, figures in results:
        for batched, label in ((False, "per message"), (True, "slice loop")):
            route, dispatch = figures[batched]
            print(f"| {name} | {label} | {route:.2f} | {dispatch:.2f} | {route + dispatch:.2f} |")
    print()
    for name, figures in results:
        before, after = sum(figures[False]), sum(figures[True])
        print(f"- {name}: the slice loop takes {after / before:.0%} of the per-message CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
