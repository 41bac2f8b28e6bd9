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
2. **The timeline's memory and cost**: ``Timeline`` rings full (``timeline_invocations`` 50
   entries for ``timeline_addresses`` 1,000 addresses) of invocations with one message in,
   two state writes, one message out and one egress record; bytes held (tracemalloc) and
   the time of one ``record`` call.
3. **Throughput with the timeline on and off**: ``bench/checkpoints.py``'s embedded counter
   (part 1 there: 10,000 keys, checkpoints every second, memory backend) with
   ``timeline_invocations`` 50 (the default) against 0, in interleaved pairs, each run in a
   fresh process; the admin server runs in both (the timeline is kept only while it does).

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
from statefun.sdk import IntType, StringType, make_json_type  # noqa: E402
from statefun.sdk._messages import Message  # noqa: E402
from statefun.sdk._spec import SdkAddress  # noqa: E402
from statefun.sdk._types import TypedValue, to_typed_value  # noqa: E402
from statefun.state._registry import create_backend  # noqa: E402
from statefun.state.base import StateBackend  # noqa: E402

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


def _timeline(per_address: int, addresses: int) -> dict[str, Any]:
    caller = SdkAddress("bench", "source", "s", "bench/source")
    values = {"count": to_typed_value(IntType, 3), "items": to_typed_value(JSON, {"a": 1})}
    out = [Message("bench/audit", "x", to_typed_value(StringType, "an item"))]
    egress = [("bench/out", [TypedValue("bench/record", b"x" * 40)])]
    keys = [("bench/cart", f"user-{n}") for n in range(addresses)]
    envelopes = [
        [Envelope(k[0], k[1], to_typed_value(StringType, "apple pear fig"), caller)] for k in keys
    ]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    timeline = Timeline(per_address, addresses)
    for _ in range(per_address):
        for key, batch in zip(keys, envelopes, strict=True):
            timeline.record(
                key,
                batch,
                time.perf_counter(),
                state=values,
                written=("count", "items"),
                messages=out,
                egress=egress,
            )
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    calls = 20_000
    started = time.perf_counter()
    for n in range(calls):
        key = keys[n % addresses]
        timeline.record(
            key,
            envelopes[n % addresses],
            started,
            state=values,
            written=("count", "items"),
            messages=out,
            egress=egress,
        )
    record_us = (time.perf_counter() - started) / calls * 1e6
    entries = per_address * addresses
    return {
        "entries": entries,
        "mib": held / 2**20,
        "per_entry": held / entries,
        "record_us": record_us,
    }


def _throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for pair in range(args.pairs):
        for timeline in (0, Settings.timeline_invocations) if pair % 2 == 0 else (50, 0):
            tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-views-tp-"))
            try:
                progress(f"  pair {pair + 1}, timeline_invocations={timeline}")
                result = run_child(
                    {
                        "kind": "throughput",
                        "tmp": str(tmp),
                        "backend": "memory",
                        "checkpoints": True,
                        "keys": THROUGHPUT_KEYS,
                        "warmup": args.warmup,
                        "seconds": args.seconds,
                        "interval_ms": 1000,
                        "timeline": timeline,
                        # the timeline is kept only while the admin server runs: on in both
                        "admin_port": free_port(),
                    }
                )
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            result.update(pair=pair + 1, timeline=timeline)
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
    ring = _timeline(Settings.timeline_invocations, Settings.timeline_addresses)
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
    print("\n### 2. Timeline memory (rings full)\n")
    print("| entries | held | per entry | one record() |")
    print("|---:|---:|---:|---:|")
    print(
        f"| {ring['entries']:,} | {ring['mib']:.1f} MiB | {ring['per_entry']:.0f} B "
        f"| {ring['record_us']:.2f} µs |"
    )
    print("\n### 3. Embedded counter throughput, timeline off and on (memory, checkpoints 1 s)\n")
    print("| pair | timeline_invocations | messages/s | messages/CPU-s |")
    print("|---:|---:|---:|---:|")
    for r in throughput:
        print(
            f"| {r['pair']} | {r['timeline']} | {r['messages_per_s']:,.0f} "
            f"| {r['messages_per_cpu_s']:,.0f} |"
        )
    off = [r["messages_per_s"] for r in throughput if r["timeline"] == 0]
    on = [r["messages_per_s"] for r in throughput if r["timeline"] != 0]
    if off and on:
        ratio = (sum(on) / len(on)) / (sum(off) / len(off))
        print(f"\nmean on/off: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
