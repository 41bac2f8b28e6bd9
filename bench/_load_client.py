"""Load generator of bench/checkpoints.py: concurrent request-reply calls over HTTP.

Runs in a process of its own (so it does not share the runtime's core or event loop):

    .venv/bin/python bench/_load_client.py --url http://127.0.0.1:PORT --typename bench/call \
        --concurrency 64 --keys 1000 --warmup 3 --seconds 10

``concurrency`` callers share one aiohttp session; each loops on ``POST
{url}/call/{typename}/{key}`` (or ``{url}`` + ``--path`` with ``{key}`` filled in, e.g.
``/Counter/{key}/add`` for Restate, whose handler without input takes an empty body: ``--body
''``) with a key drawn uniformly from ``keys`` ids (one id, ``hot``,
when ``keys`` is 1) and waits for the reply before the next call (a closed loop). A call's
latency is the time from sending the request to reading the whole reply. Requests that end
inside the measured window count; at the end each caller finishes its call in flight, so
every request sent has an answer.

The function replies the address's count after the call; the client keeps every reply and
checks, per key, that the replies are exactly 1..n for the n calls it made to that key (each
call counted once in state, none lost, none twice) when every call succeeded, and reports n
per key (``calls_per_key``) so that the caller can read the final counts back.

Prints progress to stderr and one JSON object to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import percentile  # noqa: E402

clock = time.perf_counter


async def run(args: argparse.Namespace) -> dict[str, object]:
    ids = [f"k{i}" for i in range(args.keys)] if args.keys > 1 else ["hot"]
    path = args.path if args.path is not None else f"/call/{args.typename}/{{key}}"
    urls = {key: args.url + path.replace("{key}", key) for key in ids}
    data = args.body.encode() or None  # None: no body and no Content-Type
    headers = {"Content-Type": "text/plain"} if data else {}
    skip = () if data else ("Content-Type",)  # aiohttp adds application/octet-stream
    replies: dict[str, list[int]] = {key: [] for key in ids}
    calls: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    done_times: list[float] = []
    latencies: list[float] = []
    stopping = False
    window = [float("inf"), float("inf")]

    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def caller(seed: int) -> None:
            rng = random.Random(seed)
            while not stopping:
                key = ids[rng.randrange(len(ids))]
                calls[key] += 1
                started = clock()
                try:
                    async with session.post(
                        urls[key], data=data, headers=headers, skip_auto_headers=skip
                    ) as response:
                        body = await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1
                    await asyncio.sleep(0.01)
                    continue
                ended = clock()
                statuses[str(status)] += 1
                if status == 200:
                    replies[key].append(int(body))
                if window[0] <= ended <= window[1]:
                    done_times.append(ended)
                    latencies.append(ended - started)

        tasks = [asyncio.create_task(caller(n)) for n in range(args.concurrency)]
        try:
            await asyncio.sleep(args.warmup)
            cpu0 = os.times()
            t0 = clock()
            window[0], window[1] = t0, t0 + args.seconds
            end = window[1]
            while (left := end - clock()) > 0:
                count = len(done_times)
                began = clock()
                await asyncio.sleep(min(1.0, left))
                rate = (len(done_times) - count) / (clock() - began)
                print(f"    load client: {rate:,.0f} requests/s", file=sys.stderr, flush=True)
            t1 = clock()
            cpu1 = os.times()
            stopping = True
            await asyncio.wait_for(asyncio.gather(*tasks), args.timeout + 5)
        finally:
            for task in tasks:
                task.cancel()

    seconds = t1 - t0
    latencies.sort()
    ok = sum(n for s, n in statuses.items() if s == "200")
    failed = sum(n for s, n in statuses.items() if s != "200")
    duplicates = sum(len(v) - len(set(v)) for v in replies.values())
    exact = failed == 0 and all(
        sorted(replies[key]) == list(range(1, calls[key] + 1)) for key in ids
    )
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p90_ms": percentile(latencies, 0.90) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": (latencies[-1] * 1000) if latencies else float("nan"),
        "client_cpu_percent": 100
        * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system))
        / seconds,
        "total_calls": sum(calls.values()),
        "ok": ok,
        "failed": failed,
        "statuses": dict(statuses),
        "duplicate_replies": duplicates,
        "exact": exact,
        "calls_per_key": dict(calls),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the HTTP ingress, http://host:port")
    parser.add_argument("--typename", help="function type: namespace/name (POST /call/...)")
    parser.add_argument("--path", help="instead of --typename: the path, {key} filled in")
    parser.add_argument("--body", default="x", help="the request body (text/plain unless empty)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    args = parser.parse_args()
    if (args.typename is None) == (args.path is None):
        parser.error("give one of --typename and --path")
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
