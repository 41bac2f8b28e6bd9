"""The admin port's views: what queryable state and the timeline cost the running job.

Three parts:

1. **Listing ids and looking up state on a million addresses**: a state backend (memory,
   RocksDB) holding ``--addresses`` addresses (1,000,000) of one function type in 128 key
   groups, and 100 of another. ``StateView.list_ids`` pages through them (pages of 1,000;
   the first 20 pages in turn, then the first page and the sparse type, whose listing walks
   every key group, 5 times each: the median) while a ticker task on the same event loop
   records the longest time it waited for the loop, in the loop thread's CPU time (on a
   shared machine a wall-clock gap also holds other processes' time slices): the longest
   stall a listing causes. Goal: at most 1 ms. Also the time of one ``lookup`` (a read and
   the decoding of its values).
2. **The timeline's memory and cost**: the job's ring (``timeline_entries`` 10,000) full of
   invocations of 1,000 addresses, each with its own objects as a job makes them (one message
   in, two state writes, one message out, one egress record): the bytes they hold
   (tracemalloc; the ring's own part apart), the time of one ``record`` call, and the longest
   time a lookup that scans the ring holds the event loop (median of 5).
3. **Throughput with the timeline off, as by default, and recording every invocation**:
   ``bench/checkpoints.py``'s embedded counter (part 1 there: 10,000 keys, checkpoints every
   second, memory backend) with ``timeline_invocations=0``, the defaults (no address looked
   up) and ``timeline_entries=10000``, in rounds that alternate the order, each run in a
   fresh process; the admin server runs in all (the timeline is kept only while it does).
   Messages per CPU-second, pairwise medians against the timeline off.

    .venv/bin/python bench/admin_views.py            # full run, about 4 minutes
    .venv/bin/python bench/admin_views.py --smoke    # does it still run? (about 20 s)

Progress goes to stderr; Markdown tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, expect, free_port, progress, smoke_banner  # noqa: E402
from bench.checkpoints import THROUGHPUT_KEYS, run_child  # noqa: E402
from statefun._keygroups import key_group_for  # noqa: E402
from statefun._settings import Settings  # noqa: E402
from statefun.runtime._envelope import Envelope  # noqa: E402
from statefun.runtime._state_view import StateView, StateViewJob  # noqa: E402
from statefun.runtime._timeline import Timeline  # noqa: E402
from statefun.sdk import (  # noqa: E402
    IntType,
    StringType,
    ValueSpec,
    egress_message_builder,
    make_json_type,
    message_builder,
)
from statefun.sdk._context import InvocationContext  # noqa: E402
from statefun.sdk._spec import SdkAddress  # noqa: E402
from statefun.sdk._storage import make_storage_class  # noqa: E402
from statefun.sdk._types import to_typed_value  # noqa: E402
from statefun.state._registry import create_backend  # noqa: E402
from statefun.state.base import AddressKey, StateBackend  # noqa: E402

DENSE, SPARSE = "bench/cart", "bench/rare"
JSON = make_json_type("bench/items")
#: runs of each listing whose longest stall is reported as a median
REPEATS = 5


def _fill(backend: StateBackend, addresses: int, max_p: int) -> None:
    count = to_typed_value(IntType, 7)
    items = to_typed_value(JSON, {"apple": 2, "pear": 1})
    for n in range(addresses):
        id_ = f"user-{n:07d}"
        backend.put(
            key_group_for(DENSE, id_, max_p), (DENSE, id_), {"count": count, "items": items}
        )
    for n in range(100):
        id_ = f"rare-{n:03d}"
        backend.put(key_group_for(SPARSE, id_, max_p), (SPARSE, id_), {"count": count})


async def _longest_wait(work: Any) -> tuple[Any, float]:
    """Run ``work`` (a coroutine) while a ticker records its longest wait for the loop (s), in
    the loop thread's CPU time: what the work held it for, not the time slices the machine's
    other processes took meanwhile (the machine is shared)."""
    longest = 0.0
    done = False

    async def ticker() -> None:
        nonlocal longest
        last = time.thread_time()
        while not done:
            await asyncio.sleep(0)
            now = time.thread_time()
            longest = max(longest, now - last)
            last = now

    task = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        done = True
        await task
    return result, longest


async def _listing(backend_name: str, addresses: int, pages: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-views-"))
    backend = create_backend(backend_name, str(tmp / "state"))
    try:
        settings = Settings()
        started = time.perf_counter()
        _fill(backend, addresses, settings.max_parallelism)
        progress(
            f"  {backend_name}: {addresses:,} addresses in {time.perf_counter() - started:.1f} s"
        )
        job = SimpleNamespace(settings=settings, state=backend, functions=SimpleNamespace())
        job.functions.resolve = lambda typename: None
        view = StateView(cast(StateViewJob, job))
        stall = 0.0
        seen = 0
        after = None
        started = time.perf_counter()
        for _ in range(pages):
            page, longest = await _longest_wait(view.list_ids(DENSE, after, 1000))
            stall = max(stall, longest)
            seen += len(page["ids"])
            after = page["next"]
        per_page = (time.perf_counter() - started) / pages
        expect(seen == min(addresses, pages * 1000), f"{seen} ids listed")
        sparse: list[float] = []
        for _ in range(REPEATS):
            rare, longest = await _longest_wait(view.list_ids(SPARSE, None, 1000))
            expect(len(rare["ids"]) == 100, f"{len(rare['ids'])} rare ids")
            sparse.append(longest)
        first_pages: list[float] = []
        for _ in range(REPEATS):
            first_pages.append((await _longest_wait(view.list_ids(DENSE, None, 1000)))[1])
        lookups = 2000
        started = time.perf_counter()
        for n in range(lookups):
            found = view.lookup(DENSE, f"user-{(n * 7919) % addresses:07d}")
            expect(found is not None, "a lookup found nothing")
        lookup_us = (time.perf_counter() - started) / lookups * 1e6
        return {
            "backend": backend_name,
            "addresses": addresses,
            "page_ms": per_page * 1000,
            "stall_ms": stall * 1000,
            "first_page_ms": statistics.median(first_pages) * 1000,
            "sparse_ms": statistics.median(sparse) * 1000,
            "lookup_us": lookup_us,
        }
    finally:
        backend.close()
        shutil.rmtree(tmp, ignore_errors=True)


CART = make_storage_class("bench/cart", [ValueSpec("count", IntType), ValueSpec("items", JSON)])


def _invocation(n: int) -> tuple[AddressKey, Envelope, InvocationContext]:
    """What one invocation of ``bench/cart`` leaves behind, its own objects (as a job makes
    them): one message in, two state writes, one message out, one egress record."""
    id_ = f"user-{n % 1000}"
    caller = SdkAddress("bench", "source", "s", "bench/source")
    envelope = Envelope(DENSE, id_, to_typed_value(StringType, "apple pear fig"), caller)
    context = InvocationContext(SdkAddress("bench", "cart", id_, DENSE), CART(DENSE, {}))
    context.storage.count = n
    context.storage.items = {"apple": 1, "pear": n % 7}
    context.send(message_builder("bench/audit", id_, str_value="an item"))
    context.send_egress(egress_message_builder("bench/out", n, IntType))
    return (DENSE, id_), envelope, context


async def _timeline(entries: int, addresses: int, per_address: int) -> dict[str, Any]:
    """Memory per entry (the job's ring full of invocations of 1,000 addresses), the time of
    one ``record``, and of a lookup that scans the ring (its longest hold of the loop)."""
    made = [_invocation(n) for n in range(entries)]  # (made first: the job makes them anyway)
    timeline = Timeline(per_address, addresses, entries)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for key, envelope, context in made:
        timeline.record(key, 1.0, envelope, context)
    ring_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # what the entries keep alive: the invocations' own objects, once nothing else holds them
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    made = [_invocation(n) for n in range(entries)]
    made_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    timeline = Timeline(per_address, addresses, entries)
    for key, envelope, context in made:
        timeline.record(key, 1.0, envelope, context)
    del made
    calls = 20_000
    key, envelope, context = _invocation(1)
    started = time.perf_counter()
    for _ in range(calls):
        timeline.record(key, started, envelope, context)
    record_us = (time.perf_counter() - started) / calls * 1e6
    for n in range(entries):  # the ring again: invocations of 1,000 addresses
        key, envelope, context = _invocation(n)
        timeline.record(key, 1.0, envelope, context)
    lookups: list[float] = []
    for _ in range(REPEATS):
        found, longest = await _longest_wait(timeline.entries_async((DENSE, "user-7")))
        expect(len(found) == min(per_address, entries // 1000), f"{len(found)} entries found")
        lookups.append(longest)
    return {
        "entries": entries,
        "ring_per_entry": ring_bytes / entries,
        "per_entry": (ring_bytes + made_bytes) / entries,
        "mib": (ring_bytes + made_bytes) / 2**20,
        "record_us": record_us,
        "lookup_ms": statistics.median(lookups) * 1000,
    }


#: part 3's settings: the timeline off, as by default (nothing looked up), every invocation
VARIANTS = (
    ("timeline_invocations=0", {"timeline_invocations": "0"}),
    ("default", {}),
    ("timeline_entries=10000", {"timeline_entries": "10000"}),
)


def _throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for pair in range(args.pairs):
        for name, overrides in VARIANTS if pair % 2 == 0 else VARIANTS[::-1]:
            tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-views-tp-"))
            try:
                progress(f"  round {pair + 1}, {name}")
                result = run_child(
                    {
                        "kind": "throughput",
                        "tmp": str(tmp),
                        "backend": "memory",
                        "checkpoints": True,
                        "keys": THROUGHPUT_KEYS,
                        "warmup": args.warmup,
                        "seconds": args.seconds,
                        "interval_ms": 200 if args.smoke else 1000,
                        # the timeline is kept only while the admin server runs: on in all
                        "admin_port": free_port(),
                        "settings": overrides,
                    }
                )
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            result.update(pair=pair + 1, variant=name)
            rows.append(result)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--addresses", type=int, default=1_000_000)
    parser.add_argument("--backends", nargs="+", default=["memory", "rocksdb"])
    parser.add_argument("--pairs", type=int, default=4, help="part 3: off/on pairs (default 4)")
    parser.add_argument("--seconds", type=float, default=6.0, help="part 3: seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="part 3: warm-up seconds")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    pages = 20
    if args.smoke:
        args.addresses, args.pairs, args.seconds, args.warmup, pages = 5_000, 1, 1.0, 0.5, 3

    progress(f"1. listing ids and lookups, {args.addresses:,} addresses")
    listing = [asyncio.run(_listing(b, args.addresses, pages)) for b in args.backends]
    progress("2. the timeline's memory")
    ring = asyncio.run(
        _timeline(
            2_000 if args.smoke else 10_000,
            Settings.timeline_addresses,
            Settings.timeline_invocations,
        )
    )
    progress("3. throughput with the timeline off and on")
    throughput = _throughput(args)

    if args.smoke:
        smoke_banner()
    print(f"### 1. Listing ids (pages of 1,000) and lookups, {args.addresses:,} addresses\n")
    print(
        "| backend | time per page | longest stall, 20 pages | first page: longest stall "
        "(median of 5) | sparse type, 100 ids: longest stall (median of 5) | lookup |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in listing:
        print(
            f"| {r['backend']} | {r['page_ms']:.1f} ms | {r['stall_ms']:.3f} ms "
            f"| {r['first_page_ms']:.3f} ms | {r['sparse_ms']:.3f} ms | {r['lookup_us']:.1f} µs |"
        )
    print("\n### 2. Timeline: the job's ring full (timeline_entries), 1,000 addresses\n")
    print("| entries | held | per entry | of it, the ring | one record() | lookup: longest hold |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {ring['entries']:,} | {ring['mib']:.1f} MiB | {ring['per_entry']:,.0f} B "
        f"| {ring['ring_per_entry']:.0f} B | {ring['record_us']:.2f} µs "
        f"| {ring['lookup_ms']:.2f} ms |"
    )
    print("\n### 3. Embedded counter, admin server on (memory backend, checkpoints every 1 s)\n")
    print("| round | settings | messages/s | messages/CPU-s |")
    print("|---:|---|---:|---:|")
    for r in throughput:
        print(
            f"| {r['pair']} | {r['variant']} | {r['messages_per_s']:,.0f} "
            f"| {r['messages_per_cpu_s']:,.0f} |"
        )
    off = [r for r in throughput if r["variant"] == VARIANTS[0][0]]
    for name, _ in VARIANTS[1:]:
        ratios = [
            r["messages_per_cpu_s"] / o["messages_per_cpu_s"] - 1
            for r in throughput
            if r["variant"] == name
            for o in off
            if o["pair"] == r["pair"]
        ]
        if ratios:
            print(
                f"\n{name} against the timeline off, messages per CPU-second, pairwise median: "
                f"{statistics.median(ratios) * 100:+.1f}%"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
