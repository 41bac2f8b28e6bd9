"""SDK handler benchmark: invocations per second of RequestReplyHandler, ours against peers.

The function is a counter (one IntType state "count", read and written; one outgoing message
per invocation built with message_builder(..., int_value=...)). The ToFunction requests with
batches of 1, 10 and 100 invocations are built once, written to files, and every SDK handles
exactly those bytes: this SDK (the python running this script), the official
apache-flink-statefun 3.3.0 and the flink-statefun 3.5.0 fork, each in its own virtualenv
(statefun/_testing/peers.py) and its own worker process (bench/_handler_worker.py), one after
another. Only the handler is timed: no HTTP, no runtime. The answers of all SDKs must be the
same bytes.

    .venv/bin/python bench/sdk_handler.py            # full run, a few minutes
    .venv/bin/python bench/sdk_handler.py --quick    # a short run
    .venv/bin/python bench/sdk_handler.py --smoke    # does it still run? (seconds)

Prints progress on stderr and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))

from bench._common import SMOKE_HELP, expect, progress, smoke_banner  # noqa: E402
from statefun import IntType  # noqa: E402
from statefun._testing.peers import ensure_peer_venv  # noqa: E402
from statefun.sdk._proto import request_reply_pb2 as pb  # noqa: E402

WORKER = BENCH / "_handler_worker.py"
BATCHES = (1, 10, 100)
MODES = ("sync", "async")
INITIAL_COUNT = 41


def build_request(batch: int) -> bytes:
    """The ToFunction of a batch of ``batch`` increments for bench/counter, id user-1."""
    encode = IntType.serializer().serialize
    request = pb.ToFunction()
    invocation = request.invocation
    invocation.target.namespace = "bench"
    invocation.target.type = "counter"
    invocation.target.id = "user-1"
    invocation.state.add(
        state_name="count",
        state_value=pb.TypedValue(
            typename=IntType.typename, has_value=True, value=encode(INITIAL_COUNT)
        ),
    )
    for i in range(batch):
        invocation.invocations.add(
            caller=pb.Address(namespace="bench", type="source", id=f"src-{i % 7}"),
            argument=pb.TypedValue(typename=IntType.typename, has_value=True, value=encode(1)),
        )
    return bytes(request.SerializeToString())


def check_response(batch: int, data: bytes) -> None:
    """The answer must hold count = 41 + batch and one message per invocation."""
    response = pb.FromFunction.FromString(data)
    result = response.invocation_result
    decode = IntType.serializer().deserialize
    (mutation,) = result.state_mutations
    assert mutation.state_name == "count"
    assert decode(mutation.state_value.value) == INITIAL_COUNT + batch
    assert len(result.outgoing_messages) == batch
    last = result.outgoing_messages[-1]
    assert (last.target.namespace, last.target.type, last.target.id) == ("bench", "sink", "user-1")
    assert decode(last.argument.value) == INITIAL_COUNT + batch


def run_worker(python: Path | str, request_file: Path, batch: int, mode: str, args: Any) -> Any:
    command = [
        str(python),
        "-I",  # nothing from the current folder or PYTHON* variables: each SDK is its own
        str(WORKER),
        f"--request={request_file}",
        f"--batch={batch}",
        f"--mode={mode}",
        f"--seconds={args.seconds}",
        f"--warmup={args.warmup}",
        f"--repeats={args.repeats}",
    ]
    done = subprocess.run(
        command, cwd=BENCH, capture_output=True, text=True, check=False, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker failed: {' '.join(command)}\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 30 s in all)")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before timing")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the best counts")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.repeats = 0.25, 0.1, 2
    if args.smoke:
        args.seconds, args.warmup, args.repeats = 0.02, 0.0, 1
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    sdks: dict[str, Path | str] = {"pystatefun": sys.executable}
    for label, peer in (
        ("official 3.3.0", "statefun-3.3.0"),
        ("fork 3.5.0", "flink-statefun-3.5.0"),
    ):
        progress(f"peer {peer}: making sure its virtualenv is there")
        sdks[label] = ensure_peer_venv(peer)

    results: dict[tuple[str, int, str], float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pystatefun-bench-") as tmp:
        files: dict[int, Path] = {}
        for batch in BATCHES:
            files[batch] = Path(tmp) / f"request-batch-{batch}.bin"
            files[batch].write_bytes(build_request(batch))
        for batch in BATCHES:
            for mode in MODES:
                answers: dict[str, bytes] = {}
                for label, python in sdks.items():
                    progress(f"batch {batch:>3} {mode:<5} {label} ...")
                    out = run_worker(python, files[batch], batch, mode, args)
                    expected_home = (
                        BENCH.parent if label == "pystatefun" else Path(python).parents[1]
                    )
                    expect(
                        Path(out["statefun"]).is_relative_to(expected_home),
                        f"{label} ran the statefun of {out['statefun']}",
                    )
                    results[label, batch, mode] = out["invocations_per_s"]
                    answers[label] = base64.b64decode(out["response_b64"])
                    progress(f"    {out['invocations_per_s']:>12,.0f} invocations/s")
                check_response(batch, answers["pystatefun"])
                for label, answer in answers.items():
                    expect(
                        answer == answers["pystatefun"],
                        f"batch {batch} {mode}: {label} answered other bytes than pystatefun",
                    )
    progress(f"done in {time.monotonic() - started:.0f} s")

    peers = [label for label in sdks if label != "pystatefun"]
    if args.smoke:
        smoke_banner()
    print(
        f"SDK handler, invocations/s (best of {args.repeats} x {args.seconds:g} s, "
        f"{os.cpu_count()} cores, Python {platform.python_version()})\n"
    )
    print(
        "| batch | handler | "
        + " | ".join(["pystatefun", *peers])
        + " | "
        + " | ".join(f"ours / {p}" for p in peers)
        + " |"
    )
    print("|" + "---|" * (2 + len(sdks) + len(peers)))
    for batch in BATCHES:
        for mode in MODES:
            ours = results["pystatefun", batch, mode]
            cells = [f"{results[label, batch, mode]:,.0f}" for label in sdks]
            ratios = [f"{ours / results[p, batch, mode]:.1f}x" for p in peers]
            print(f"| {batch} | handle_{mode} | " + " | ".join(cells + ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
