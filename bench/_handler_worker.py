"""Times one SDK's RequestReplyHandler; started by bench/sdk_handler.py, once per measurement.

Runs under the python of the SDK being measured (this project's, or a peer virtualenv's) and
uses nothing but ``from statefun import *``, so the same code runs against every SDK. It reads
one ToFunction from a file, checks the function's answer once, then calls the handler on those
same bytes for a fixed time after a warm-up, several times, and prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from statefun import *  # noqa: F403

functions = StatefulFunctions()  # noqa: F405


@functions.bind(typename="bench/counter", specs=[ValueSpec(name="count", type=IntType)])  # noqa: F405
def counter(context: Any, message: Any) -> None:
    count = (context.storage.count or 0) + message.as_int()
    context.storage.count = count
    context.send(message_builder("bench/sink", context.address.id, int_value=count))  # noqa: F405


handler = RequestReplyHandler(functions)  # noqa: F405


def _chunk_size(call: Callable[[], Any]) -> int:
    """Calls per clock reading: about 5 ms worth, so reading the clock costs nothing."""
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < 0.02:
        call()
        n += 1
    return max(1, n // 4)


def _time_sync(call: Callable[[], Any], seconds: float, chunk: int) -> tuple[int, float]:
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(chunk):
            call()
        calls += chunk
        now = time.perf_counter()
        if now >= deadline:
            return calls, now - start


async def _time_async(
    call: Callable[[], Awaitable[Any]], seconds: float, chunk: int
) -> tuple[int, float]:
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(chunk):
            await call()
        calls += chunk
        now = time.perf_counter()
        if now >= deadline:
            return calls, now - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--request", required=True, help="file holding one ToFunction")
    parser.add_argument("--batch", type=int, required=True, help="invocations in the request")
    parser.add_argument("--mode", choices=("sync", "async"), required=True)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before the runs")
    parser.add_argument("--repeats", type=int, default=5, help="runs; the best one counts")
    args = parser.parse_args()

    with open(args.request, "rb") as f:
        request = f.read()
    response = handler.handle_sync(request)
    gc.collect()

    runs: list[float] = []
    if args.mode == "sync":

        def call() -> Any:
            return handler.handle_sync(request)

        chunk = _chunk_size(call)
        _time_sync(call, args.warmup, chunk)
        for _ in range(args.repeats):
            calls, elapsed = _time_sync(call, args.seconds, chunk)
            runs.append(calls / elapsed)
    else:

        async def run_all() -> None:
            def call() -> Awaitable[Any]:
                return handler.handle_async(request)  # type: ignore[no-any-return]

            await call()
            start = time.perf_counter()
            n = 0
            while time.perf_counter() - start < 0.02:
                await call()
                n += 1
            chunk = max(1, n // 4)
            await _time_async(call, args.warmup, chunk)
            for _ in range(args.repeats):
                calls, elapsed = await _time_async(call, args.seconds, chunk)
                runs.append(calls / elapsed)

        asyncio.run(run_all())

    import statefun

    json.dump(
        {
            "statefun": statefun.__file__,
            "batch": args.batch,
            "mode": args.mode,
            "calls_per_s": runs,
            "invocations_per_s": max(runs) * args.batch,
            "response_b64": base64.b64encode(bytes(response)).decode("ascii"),
        },
        sys.stdout,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
