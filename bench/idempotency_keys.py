"""What the HTTP ingress's Idempotency-Keys cost: memory per key, and the key log's work.

  memory   bytes per key held in memory (``KeyStore``: entry, 36-character key, fingerprint,
           ordered-dict node), for a /messages key and for a /call key with a small reply
  append   appending the keys a checkpoint covers to the key log (one fsync), per key
  load     reading the key log back and filling the store, as on start, per key
  answer   the ingress's work for a keyed request beyond an unkeyed one (checking the key,
           fingerprinting a 100-byte body, recording the outcome), first and repeated

    .venv/bin/python bench/idempotency_keys.py
    .venv/bin/python bench/idempotency_keys.py --keys 1000000

Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

from statefun._http.server import Reply, plain
from statefun.ingress._idempotency import IdempotentRequests
from statefun.ingress._keystore import ACCEPTED, Entry, KeyLog, KeyStore
from statefun.sdk._types import TypedValue


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--per-checkpoint", type=int, default=10_000)
    args = parser.parse_args()
    print(f"{args.keys} keys ...", file=sys.stderr)
    messages = memory_per_key(args.keys, "messages")
    calls = memory_per_key(args.keys, "call")
    append, load = log_costs(args.keys, args.per_checkpoint)
    first, repeat = answer_costs(min(args.keys, 100_000))
    print("| measure | figure |")
    print("| --- | --- |")
    print(f"| memory per /messages key | {messages:.0f} B |")
    print(f"| memory per /call key (2-byte reply) | {calls:.0f} B |")
    print(f"| key log append, {args.per_checkpoint} keys per checkpoint | {append:.2f} us/key |")
    print(f"| key log load on start | {load:.2f} us/key |")
    print(f"| keyed request, first | {first:.2f} us |")
    print(f"| keyed request, repeat | {repeat:.2f} us |")


if __name__ == "__main__":
    main()
