"""What the HTTP ingress's Idempotency-Keys cost: memory per key, the key log's work, and the
latency of keyed requests in one process and clustered.

  memory   bytes per key held in memory (``KeyStore``: entry, 36-character key, fingerprint,
           ordered-dict node), for a /messages key and for a /call key with a small reply
  append   appending the keys a checkpoint covers to the key log (one fsync), per key
  load     reading the key log back and filling the store, as on start, per key
  answer   the ingress's work for a keyed request beyond an unkeyed one (checking the key,
           fingerprinting a 100-byte body, recording the outcome), first and repeated
  latency  end to end over HTTP, p50/p99, for /messages and /call without a key, with a new
           key and repeated, in one process (``single``) and on 1 and 2 clustered workers
           (``cluster-1``, ``cluster-2``, on a Kafka broker), side by side with the ratios
           keyed / plain and clustered / single (``_keyed_latency.py``)

    .venv/bin/python bench/idempotency_keys.py                     # about 3 minutes
    .venv/bin/python bench/idempotency_keys.py --keys 1000000 --modes none
    .venv/bin/python bench/idempotency_keys.py --smoke --bootstrap 127.0.0.1:9092  # does it run?

Progress goes to stderr; Markdown tables and the ratios to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, progress, smoke_banner  # noqa: E402
from bench._keyed_latency import CASES, MODES, Figures, measure_mode  # noqa: E402
from bench.kafka_e2e import machine  # noqa: E402
from statefun._http.server import Reply, plain  # noqa: E402
from statefun.ingress._idempotency import IdempotentRequests  # noqa: E402
from statefun.ingress._keystore import ACCEPTED, Entry, KeyLog, KeyStore  # noqa: E402
from statefun.sdk._types import TypedValue  # noqa: E402


def memory_per_key(keys: int, route: str) -> float:
    store = KeyStore(1 << 62, 1 << 62, 1 << 62)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for n in range(keys):
        entry = store.begin(str(uuid.uuid4()), os.urandom(16), route, n)
        reply = ("io.statefun.types/int", True, b"\x08" + os.urandom(1))
        result = ACCEPTED if route == "messages" else reply
        store.complete(entry, result)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / keys


def log_costs(keys: int, per_checkpoint: int) -> tuple[float, float]:
    """(append, load) in microseconds per key."""
    with tempfile.TemporaryDirectory() as folder:
        log = KeyLog(Path(folder))
        log.open()
        records = [
            [1, str(uuid.uuid4()), os.urandom(16), "messages", n, None, ACCEPTED]
            for n in range(keys)
        ]
        started = time.perf_counter()
        for start in range(0, keys, per_checkpoint):
            log.append(records[start : start + per_checkpoint])
        append = (time.perf_counter() - started) / keys * 1e6
        log.close()
        started = time.perf_counter()
        store = KeyStore(1 << 62, 1 << 62, 1 << 62)
        again = KeyLog(Path(folder))
        for tag, key, fp, route, accepted_ms, request_id, result in again.load(1):
            entry = Entry(key, fp, route, accepted_ms)
            entry.result, entry.request_id, entry.tag = result, request_id, tag
            store.put(entry)
        load = (time.perf_counter() - started) / keys * 1e6
        again.close()
        return append, load


def answer_costs(requests: int) -> tuple[float, float]:
    """(first, repeat) in microseconds per request."""

    async def measure() -> tuple[float, float]:
        keys = IdempotentRequests("bench/http", 3600.0, 1 << 62, 1 << 62, None, {})
        value = TypedValue("io.statefun.types/string", os.urandom(100))
        accepted = plain(202, "accepted")

        async def run(entry: Entry) -> Reply:
            keys.emitted(entry.key, None)
            return accepted

        names = [str(uuid.uuid4()) for _ in range(requests)]
        timings = []
        for _ in range(2):  # first: new keys; then: repeats
            started = time.perf_counter()
            for name in names:
                await keys.answer(name, "messages", "a/b", "c", value, run, Reply, 30.0)
            timings.append((time.perf_counter() - started) / requests * 1e6)
        return timings[0], timings[1]

    return asyncio.run(measure())


def latency(args: argparse.Namespace) -> dict[str, dict[str, Figures]]:
    from statefun._kafka_local.broker import KafkaBroker, kafka_version

    modes = [m for m in args.modes.split(",") if m]
    if not modes:
        return {}
    broker: Any = contextlib.nullcontext()
    if any(MODES[m] for m in modes):
        if args.bootstrap:
            broker = KafkaBroker.external(args.bootstrap)
        else:
            progress(f"starting a Kafka {kafka_version()} broker")
            broker = KafkaBroker()
    results = {}
    with broker as running, tempfile.TemporaryDirectory(prefix="keys-bench-") as tmp:
        bootstrap = running.bootstrap_servers if running is not None else ""
        for mode in modes:
            results[mode] = measure_mode(
                mode,
                bootstrap,
                Path(tmp),
                args.clients,
                args.seconds,
                args.addresses,
                args.interval_ms,
            )
    return results


def report_latency(results: dict[str, dict[str, Figures]], args: argparse.Namespace) -> None:
    modes = list(results)
    print(
        f"\nlatency over HTTP: {args.clients} clients in a closed loop, {args.seconds:g} s per "
        f"case, {args.addresses:,} addresses, checkpoints every {args.interval_ms} ms; "
        f"{machine()}\n"
    )
    print("| case | " + " | ".join(f"{m} p50 / p99 | {m} req/s" for m in modes) + " |")
    print("| --- |" + " ---: | ---: |" * len(modes))
    for case in CASES:
        cells = []
        for mode in modes:
            f = results[mode][case]
            cells.append(f"{f.p50:,.1f} / {f.p99:,.1f} ms | {f.per_s:,.0f}")
        print(f"| {case} | " + " | ".join(cells) + " |")
    print("\np50 ratios: keyed / plain and repeat / plain per mode; each mode / single per case\n")
    print("| case | " + " | ".join(modes) + " |")
    print("| --- |" + " ---: |" * len(modes))
    for case in CASES:
        route, kind = case.split()
        cells = []
        for mode in modes:
            by = results[mode]
            text = "-" if kind == "plain" else f"{by[case].p50 / by[f'{route} plain'].p50:.2f}x"
            if mode != "single" and "single" in results:
                text += f" ({by[case].p50 / results['single'][case].p50:.2f}x single)"
            cells.append(text)
        print(f"| {case} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--per-checkpoint", type=int, default=10_000)
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"latency modes, comma-separated, of {', '.join(MODES)}; 'none': no latency part",
    )
    parser.add_argument("--clients", type=int, default=8, help="latency: concurrent clients")
    parser.add_argument("--seconds", type=float, default=8.0, help="latency: seconds per case")
    parser.add_argument("--addresses", type=int, default=1_000, help="latency: addresses")
    parser.add_argument("--interval-ms", type=int, default=1_000, help="checkpoint interval")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start one)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.modes == "none":
        args.modes = ""
    if args.smoke:
        args.keys, args.per_checkpoint, args.clients, args.seconds = 2_000, 500, 2, 0.3
        args.interval_ms = 200
    print(f"{args.keys} keys ...", file=sys.stderr)
    messages = memory_per_key(args.keys, "messages")
    calls = memory_per_key(args.keys, "call")
    append, load = log_costs(args.keys, args.per_checkpoint)
    first, repeat = answer_costs(min(args.keys, 100_000))
    results = latency(args)
    if args.smoke:
        smoke_banner()
    print("| measure | figure |")
    print("| --- | --- |")
    print(f"| memory per /messages key | {messages:.0f} B |")
    print(f"| memory per /call key (2-byte reply) | {calls:.0f} B |")
    print(f"| key log append, {args.per_checkpoint} keys per checkpoint | {append:.2f} us/key |")
    print(f"| key log load on start | {load:.2f} us/key |")
    print(f"| keyed request, first | {first:.2f} us |")
    print(f"| keyed request, repeat | {repeat:.2f} us |")
    if results:
        report_latency(results, args)


if __name__ == "__main__":
    main()
