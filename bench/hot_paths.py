"""The runtime's per-record CPU on a remote function's hot path, without Kafka, HTTP or peers.

With one hot key the side-by-side benchmark (bench/statefun_jvm_vs_pystatefun.py) is bound by
the runtime's CPU per record, spread over a few steps that this script times one by one, in
this process, on the same records as that benchmark (value ``b"<topic> <ns>"`` typed
``bench/stamp``, the counter function of bench/_jvm_counter.py):

  route    a polled batch of 1,000 Kafka records (librdkafka's messages, as the default fetch
           client hands them over) through the Kafka ingress (``_route_all``)
           into the mailbox of an address that has a batch in flight - one hot key, or 1,000
           keys - each message encoded there (encode-ahead)
  decode   a FromFunction of 1,000 results (state, 1,000 Kafka egress records) parsed
  apply    its state applied and its egress grouped per egress id (``_apply_remote``)
  emit     the egress records handed to a Kafka egress (``KafkaSink.write_many``: decoded
           into rows for the producer thread; nothing is sent)

Each figure is the best of ``--repeat`` rounds, in microseconds per record, for this process's
loops (compiled where ``statefun/_hotloops.c`` is built) and, measured turn about, for a process
whose loops run as Python (``PYSTATEFUN_NO_EXTENSIONS=1``), with the ratio. Compare two commits
by running it on both (the figures move by a few percent from run to run).

    .venv/bin/python bench/hot_paths.py
    .venv/bin/python bench/hot_paths.py --rounds 100 --repeat 3   # quicker
    .venv/bin/python bench/hot_paths.py --smoke   # does it still run? (a second)

Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections import deque
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import confluent_kafka  # noqa: E402

from bench._common import SMOKE_HELP, progress, smoke_banner  # noqa: E402
from bench._jvm_counter import functions  # noqa: E402
from statefun._compiled import NO_EXTENSIONS_VARIABLE, hot_loops  # noqa: E402
from statefun._keygroups import key_group_for  # noqa: E402
from statefun._settings import Settings  # noqa: E402
from statefun.egress.kafka import KafkaSink  # noqa: E402
from statefun.ingress.kafka import KafkaSource, _Route  # noqa: E402
from statefun.module._specs import (  # noqa: E402
    FunctionTarget,
    HttpEndpointSpec,
    KafkaTopicSpec,
    ModuleSpec,
)
from statefun.runtime import Job  # noqa: E402
from statefun.runtime._dispatcher import _egress_groups  # noqa: E402
from statefun.runtime._envelope import Envelope  # noqa: E402
from statefun.runtime._functions import RemoteFunction, StateSpec  # noqa: E402
from statefun.runtime._remote import decode_from_function, encode_to_function  # noqa: E402
from statefun.sdk import IntType, TypedValue  # noqa: E402
from statefun.sdk._handler import RequestReplyHandler  # noqa: E402

FUNCTION = "bench/counter"
STAMP = b"bench-out-0 1733241234567890123"
BATCH = 1_000
#: the runtime's young-generation threshold while it runs (Job._start)
RUNTIME_GC_THRESHOLD = (50_000, 20, 100)
REPLY_STEPS = ("decode", "apply", "emit")


def new_job() -> tuple[Job, KafkaSink, RemoteFunction]:
    endpoint = HttpEndpointSpec(FunctionTarget("bench", None), "http://127.0.0.1:1/statefun")
    sink = KafkaSink("bench/out", "127.0.0.1:1", "at-least-once", timedelta(minutes=1), {})
    job = Job(
        ModuleSpec(endpoints=(endpoint,)),
        Settings(max_in_flight_remote_messages=10**9),
        sinks=[sink],
    )
    function = job.functions.resolve(FUNCTION)
    assert isinstance(function, RemoteFunction)
    function.register(StateSpec("count", IntType.typename))
    return job, sink, function


async def time_route(keys: int, rounds: int) -> float:
    """Seconds per record to route a poll into busy mailboxes."""
    job, _, _ = new_job()
    topic = KafkaTopicSpec("bench-in", "bench/stamp", (FUNCTION,))
    source = KafkaSource("bench/in", "127.0.0.1:1", [topic])
    routes = {"bench-in": _Route(topic, job)}
    ids = [f"k{i % keys}".encode() for i in range(BATCH)]
    # as the ingress's default fetch client (librdkafka) hands them over
    records = [
        confluent_kafka.Message(topic="bench-in", partition=0, offset=i, key=ids[i], value=STAMP)
        for i in range(BATCH)
    ]
    for id_ in set(ids):  # each address has a batch in flight
        key = (FUNCTION, id_.decode())
        dispatcher = job._subtask_of[key_group_for(*key, job.settings.max_parallelism)]
        dispatcher.busy[key] = deque()
        dispatcher._encode_ahead[key] = BATCH
    spent = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        await source._route_all(records, routes, job)
        spent += time.perf_counter() - started
        waiting = sum(len(m) for d in job.dispatchers for m in d.busy.values())
        if waiting != BATCH:
            raise AssertionError(f"{waiting} messages in the mailboxes, expected {BATCH}")
        for dispatcher in job.dispatchers:  # empty again, with the gate open
            for mailbox in dispatcher.busy.values():
                mailbox.clear()
        job.pending = job.pending_remote = 0
        job._overfull_mailboxes.clear()
        job._room.set()
    return spent / (rounds * BATCH)


def time_reply(rounds: int) -> dict[str, float]:
    """Seconds per record to decode, apply and emit a reply of BATCH results."""
    job, sink, function = new_job()
    batch = [Envelope(FUNCTION, "hot", TypedValue("bench/stamp", STAMP), None)] * BATCH
    body = encode_to_function(FUNCTION, "hot", [("count", IntType.typename, None)], batch)
    reply = RequestReplyHandler(functions).handle_sync(body)
    dispatcher = job.dispatchers[0]
    key = (FUNCTION, "hot")
    spent = {"decode": 0.0, "apply": 0.0, "emit": 0.0}
    for _ in range(rounds):
        t0 = time.perf_counter()
        response = decode_from_function(reply, FUNCTION)
        t1 = time.perf_counter()
        egress = None if _egress_groups is None else _egress_groups(reply, TypedValue)
        outputs = dispatcher._apply_remote(
            function, key, 0, {}, response.invocation_result, 0, egress
        )
        t2 = time.perf_counter()
        outputs()
        t3 = time.perf_counter()
        if len(sink._buffer) != BATCH:
            raise AssertionError(f"{len(sink._buffer)} egress rows, expected {BATCH}")
        sink._buffer.clear()
        spent["decode"] += t1 - t0
        spent["apply"] += t2 - t1
        spent["emit"] += t3 - t2
    return {step: seconds / (rounds * BATCH) for step, seconds in spent.items()}


async def measure(rounds: int) -> dict[str, float]:
    """Seconds per record of each step, this process's loops, one measurement."""
    gc.set_threshold(*RUNTIME_GC_THRESHOLD)  # as the runtime collects (runtime/_job.py)
    return {
        "route, one hot key": await time_route(1, rounds),
        "route, 1,000 keys": await time_route(BATCH, rounds),
        **time_reply(rounds),
    }


def measure_python_loops(rounds: int) -> dict[str, float]:
    """The same measurement in a process whose hot loops run as Python (the peer)."""
    out = subprocess.run(
        [sys.executable, __file__, "--loops", "python", "--rounds", str(rounds)],
        env={**os.environ, NO_EXTENSIONS_VARIABLE: "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    found: dict[str, float] = json.loads(out.stdout)
    return found


def _add_reply(best: dict[str, float]) -> dict[str, float]:
    return {**best, "reply (decode + apply + emit)": sum(best[s] for s in REPLY_STEPS)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="batches per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="measurements; the best counts")
    parser.add_argument(
        "--loops",
        choices=("both", "python"),
        default="both",
        help="both: this process's loops (compiled where built) and, turn about, a process "
        "with the Python ones; python: one measurement of the latter, as JSON (the peer)",
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.loops == "python":
        print(json.dumps(await measure(args.rounds)))
        return
    if args.smoke:
        args.rounds, args.repeat = 3, 1
    best: dict[str, float] = {}
    peer: dict[str, float] = {}
    for attempt in range(1, args.repeat + 1):
        progress(f"round {attempt}/{args.repeat}")
        for found, into in (
            (await measure(args.rounds), best),
            (measure_python_loops(args.rounds), peer),
        ):
            for step, seconds in found.items():
                into[step] = min(into.get(step, float("inf")), seconds)
    if args.smoke:
        smoke_banner()
    compiled = "compiled" if hot_loops is not None else "not built here: Python"
    print(f"Python {platform.python_version()}; best of {args.repeat} x {args.rounds} batches")
    print()
    print(f"| step | us per record ({compiled}) | Python loops | Python / this |")
    print("|---|---:|---:|---:|")
    ours, theirs = _add_reply(best), _add_reply(peer)
    for step, seconds in ours.items():
        print(
            f"| {step} | {seconds * 1e6:.2f} | {theirs[step] * 1e6:.2f} "
            f"| {theirs[step] / seconds:.2f}x |"
        )


if __name__ == "__main__":
    asyncio.run(main())
