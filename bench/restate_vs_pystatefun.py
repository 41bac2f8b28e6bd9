"""Side by side with Restate: durable request-reply calls to a counter over HTTP.

The same load client (bench/_load_client.py, a process of its own: closed-loop callers that each
wait for the reply before the next call) drives, in one run:

* **Restate** (bench/peers/restate/, installed from npm and PyPI into the peer cache): the
  ``restate-server`` binary on 127.0.0.1 with its data in a temporary folder, and the counter
  as a Virtual Object on ``restate-sdk`` (``POST /Counter/{key}/add`` answers the new count).
  Restate keeps each call's state change durable (journalled, fsynced) before it answers.
* **pystatefun** (``statefun run``, as part 2 of bench/checkpoints.py): the HTTP ingress, the
  embedded function ``bench/call`` (``POST /call/bench/call/{key}`` increments the count and
  replies it), ``reply_release=on-checkpoint`` (a reply leaves only once the checkpoint
  covering the call is complete, so calls need no write-ahead log) with checkpoints every
  ``--interval-ms`` (20 ms), on the memory and on the RocksDB state backend.

Each system runs in a fresh process with fresh storage for each case:

  many   1,000 keys, 64 callers
  hot    one key, 64 callers
  one    one key, one caller (sequential calls: the latency of a lone request)

Checks: each key's replies are exactly 1..n for its n calls (the load client), and after the
load each key's final count, read back from the system (Restate: ``/Counter/{key}/get``;
pystatefun: the string ``get`` to ``bench/call``), is exactly n.

``--variant NAME:setting=value[,setting=value]`` (repeatable) adds pystatefun runs with those
settings next to the default ones, and ``--baseline DIR`` runs of another checkout's runtime
(e.g. ``git archive COMMIT | tar -x -C DIR``; variant ``baseline``): A/B in the same run.

    .venv/bin/python bench/restate_vs_pystatefun.py            # about 4 minutes
    .venv/bin/python bench/restate_vs_pystatefun.py --cases one --backends memory
    .venv/bin/python bench/restate_vs_pystatefun.py --smoke    # does it run? (about 30 s)

Progress goes to stderr; Markdown tables and the ratios to stdout. Exits non-zero if a check
fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _restate_processes as restate_peer  # noqa: E402
from bench._common import (  # noqa: E402
    SMOKE_HELP,
    BenchmarkCheckError,
    expect,
    free_port,
    progress,
    smoke_banner,
)
from bench._function_server import CALL  # noqa: E402
from bench.checkpoints import machine_note, runtime_process  # noqa: E402
from statefun.runtime._commands import _settings_overrides  # noqa: E402

LOAD_CLIENT = ROOT / "bench" / "_load_client.py"


@dataclass(frozen=True)
class Case:
    name: str
    keys: int
    callers: int

    def describe(self) -> str:
        keys = "one key" if self.keys == 1 else f"{self.keys:,} keys"
        callers = "one caller" if self.callers == 1 else f"{self.callers} callers"
        return f"{keys}, {callers}"


CASES = {"many": Case("many", 1000, 64), "hot": Case("hot", 1, 64), "one": Case("one", 1, 1)}
SMOKE_CASES = {"many": Case("many", 20, 8), "hot": Case("hot", 1, 8), "one": Case("one", 1, 1)}


@dataclass(frozen=True)
class Target:
    """Where the load goes: a URL and the paths of a call and of a read."""

    url: str
    call_path: str  # {key} filled in
    read_path: str
    call_body: str  # "" = no body
    read_body: str


def load(target: Target, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        str(LOAD_CLIENT),
        "--url",
        target.url,
        "--path",
        target.call_path,
        "--body",
        target.call_body,
        "--concurrency",
        str(case.callers),
        "--keys",
        str(case.keys),
        "--warmup",
        str(args.warmup),
        "--seconds",
        str(args.seconds),
    ]
    client = subprocess.run(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        timeout=args.warmup + args.seconds + 120,
        check=False,
    )
    if client.returncode != 0:
        raise RuntimeError(f"the load client failed with exit code {client.returncode}")
    result: dict[str, Any] = json.loads(client.stdout.strip().splitlines()[-1])
    return result


async def _read_counts(target: Target, keys: list[str]) -> dict[str, int | str]:
    counts: dict[str, int | str] = {}
    data = target.read_body.encode() or None
    headers = {"Content-Type": "text/plain"} if data else {}
    skip = () if data else ("Content-Type",)
    limit = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def read(key: str) -> None:
            url = target.url + target.read_path.replace("{key}", key)
            async with limit:
                try:
                    async with session.post(
                        url, data=data, headers=headers, skip_auto_headers=skip
                    ) as answer:
                        body = await answer.read()
                        counts[key] = int(body) if answer.status == 200 else f"HTTP {answer.status}"
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    counts[key] = type(exc).__name__

        await asyncio.gather(*(read(key) for key in keys))
    return counts


def measure(system: str, target: Target, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """Run the load, read every count back, check both; the load client's figures."""
    result = load(target, case, args)
    calls: dict[str, int] = result.pop("calls_per_key")
    counts = asyncio.run(_read_counts(target, sorted(calls)))
    wrong = {key: (counts[key], n) for key, n in calls.items() if counts[key] != n}
    result["counts_exact"] = not wrong
    what = f"{case.name} ({case.describe()}), {system}"
    expect(
        result["exact"] and result["ok"] > 0,
        f"{what}: the replies are not exactly 1..n per key ({result['ok']} ok, "
        f"{result['failed']} failed {result['statuses']}, "
        f"{result['duplicate_replies']} duplicates)",
    )
    sample = ", ".join(f"{k}: read {c!r}, called {n}" for k, (c, n) in list(wrong.items())[:3])
    expect(not wrong, f"{what}: {len(wrong)} final count(s) differ from the calls ({sample})")
    return result


RESTATE_TARGET = ("/Counter/{key}/add", "/Counter/{key}/get", "", "")
OUR_TARGET = (f"/call/{CALL}/{{key}}", f"/call/{CALL}/{{key}}", "x", "get")


def run_restate(case: Case, peer: tuple[Path, Path], args: argparse.Namespace) -> dict[str, Any]:
    with restate_peer.running(*peer) as server:
        return measure("Restate", Target(server.ingress_url, *RESTATE_TARGET), case, args)


@contextlib.contextmanager
def _pystatefun(settings: dict[str, str], checkout: Path) -> Iterator[str]:
    tmp = Path(tempfile.mkdtemp(prefix="statefun-bench-restate-"))
    port = free_port()
    full = {
        "checkpoint_dir": str(tmp / "checkpoints"),
        "state_dir": str(tmp / "state"),
        "dead_letter_path": str(tmp / "dead-letters.jsonl"),
        **settings,
    }
    try:
        with runtime_process(tmp, full, port, checkout):
            yield f"http://127.0.0.1:{port}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_pystatefun(
    case: Case, backend: str, extra: dict[str, str], checkout: Path, args: argparse.Namespace
) -> dict[str, Any]:
    settings = {
        "checkpoint_interval_ms": str(args.interval_ms),
        "reply_release": "on-checkpoint",
        "state_backend": backend,
        **_settings_overrides(args.set),
        **extra,
    }
    with _pystatefun(settings, checkout) as url:
        return measure(f"pystatefun {backend}", Target(url, *OUR_TARGET), case, args)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, sep, rest = text.partition(":")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: expected NAME:setting=value[,setting=value]"
        )
    return name, _settings_overrides(rest.split(","))


def versions(server: Path | None) -> str:
    parts = [f"Python {platform.python_version()}"]
    for name in ("aiohttp", "rocksdict"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            parts.append(f"{name} {metadata.version(name)}")
    if server is not None:
        parts.append(
            f"{restate_peer.server_version(server)}, restate-sdk {restate_peer.SDK_VERSION}"
        )
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        parts.append(f"pystatefun at {commit} (+ working tree)")
    return ", ".join(parts)


def _label(row: dict[str, Any]) -> str:
    return str(row["system"]) if row["variant"] == "" else f"{row['system']} [{row['variant']}]"


def _key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return (row["case"], row["system"], row["backend"], row["variant"])


def merge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case, system, backend and variant: the medians of its rounds, the range of
    requests/s and p99 when there were several."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_key(row), []).append(row)
    merged = []
    for group in groups.values():
        row = dict(group[0])
        for name in ("requests_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms"):
            row[name] = statistics.median(r[name] for r in group)
        row["ok"] = sum(r["ok"] for r in group)
        row["checked"] = all(r["exact"] and r["counts_exact"] for r in group)
        row["rounds"] = len(group)
        row["rps_range"] = (
            min(r["requests_per_s"] for r in group),
            max(r["requests_per_s"] for r in group),
        )
        row["p99_range"] = (min(r["p99_ms"] for r in group), max(r["p99_ms"] for r in group))
        merged.append(row)
    return merged


def _spread(value: float, spread: tuple[float, float], rounds: int, spec: str) -> str:
    text = format(value, spec)
    if rounds > 1:
        text += f" ({format(spread[0], spec)}-{format(spread[1], spec)})"
    return text


def print_report(
    rows: list[dict[str, Any]], cases: dict[str, Case], args: argparse.Namespace
) -> None:
    rounds = f"median of {args.rounds} rounds (min-max), " if args.rounds > 1 else ""
    print(
        f"pystatefun: reply_release=on-checkpoint, checkpoints every {args.interval_ms} ms, "
        f"checkpoint_dir on local disk{'; --set ' + ' '.join(args.set) if args.set else ''}. "
        f"{rounds}{args.warmup:g} s warm-up, {args.seconds:g} s measured per row.\n"
    )
    rows = merge(rows)
    print("| case | system | backend | requests/s | p50 ms | p90 ms | p99 ms | max ms | checks |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        checks = "exact" if row["checked"] else "FAILED"
        print(
            f"| {cases[row['case']].describe()} | {_label(row)} | {row['backend']} "
            f"| {_spread(row['requests_per_s'], row['rps_range'], row['rounds'], ',.0f')} "
            f"| {row['p50_ms']:.1f} | {row['p90_ms']:.1f} "
            f"| {_spread(row['p99_ms'], row['p99_range'], row['rounds'], '.1f')} "
            f"| {row['max_ms']:.1f} | {checks} ({row['ok']:,} calls) |"
        )
    print(
        "\nRatios, pystatefun / Restate: requests/s (above 1: more), p50 and p99 (below 1: "
        "lower latency)\n"
    )
    print("| case | pystatefun | requests/s | p50 | p99 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in cases:
        peers = [r for r in rows if r["case"] == name and r["system"] == "Restate"]
        if not peers:
            continue
        ref = peers[0]
        for row in rows:
            if row["case"] != name or row["system"] == "Restate":
                continue
            label = row["backend"] + (f" [{row['variant']}]" if row["variant"] else "")
            print(
                f"| {cases[name].describe()} | {label} "
                f"| {row['requests_per_s'] / ref['requests_per_s']:.2f}x "
                f"| {row['p50_ms'] / ref['p50_ms']:.2f}x | {row['p99_ms'] / ref['p99_ms']:.2f}x |"
            )
    ab = [r for r in rows if r["system"] == "pystatefun" and r["variant"]]
    if not ab:
        return
    print("\nA/B, pystatefun / its variant: requests/s, p50, p99\n")
    print("| case | backend | variant | requests/s | p50 | p99 |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    default = {_key(r): r for r in rows}
    for row in ab:
        a = default.get((row["case"], "pystatefun", row["backend"], ""))
        if a is None:
            continue
        print(
            f"| {cases[row['case']].describe()} | {row['backend']} | {row['variant']} "
            f"| {a['requests_per_s'] / row['requests_per_s']:.2f}x "
            f"| {a['p50_ms'] / row['p50_ms']:.2f}x | {a['p99_ms'] / row['p99_ms']:.2f}x |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per row")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per row")
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="default all"
    )
    parser.add_argument(
        "--systems", nargs="+", choices=["restate", "pystatefun"], default=["restate", "pystatefun"]
    )
    parser.add_argument(
        "--backends", nargs="+", choices=["memory", "rocksdb"], default=["memory", "rocksdb"]
    )
    parser.add_argument(
        "--interval-ms", type=int, default=20, help="pystatefun checkpoint interval (default 20)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a pystatefun setting"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=parse_variant,
        metavar="NAME:SETTING=VALUE,...",
        help="also run pystatefun with these settings (A/B in the same run)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also run the runtime of this pystatefun checkout (variant 'baseline')",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds, interleaved; the tables show medians"
    )
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    cases = SMOKE_CASES if args.smoke else CASES
    if args.smoke:
        args.seconds, args.warmup = 1.5, 0.5
    cases = {name: case for name, case in cases.items() if name in args.cases}

    peer = None
    if "restate" in args.systems:
        progress("installing the Restate peer (cached after the first run)")
        peer = restate_peer.install()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    variants: list[tuple[str, dict[str, str], Path]] = [
        ("", {}, ROOT),
        *((name, extra, ROOT) for name, extra in args.variant),
    ]
    if args.baseline is not None:
        if not (args.baseline / "statefun" / "__main__.py").is_file():
            parser.error(f"--baseline {args.baseline}: no statefun package there")
        variants.append(("baseline", {}, args.baseline.resolve()))

    def record(
        system: str, backend: str, variant: str, case: Case, run: Callable[[], dict[str, Any]]
    ) -> None:
        started = time.monotonic()
        try:
            result = run()
        except (BenchmarkCheckError, RuntimeError) as exc:
            failures.append(str(exc))
            progress(f"    FAILED: {exc}")
            return
        result.update(system=system, backend=backend, variant=variant, case=case.name)
        progress(
            f"    {result['requests_per_s']:,.0f} requests/s, p50 {result['p50_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms ({time.monotonic() - started:.0f} s)"
        )
        rows.append(result)

    def run_case(case: Case) -> None:
        if peer is not None:
            progress(f"{case.name} ({case.describe()}): Restate")
            record("Restate", "-", "", case, functools.partial(run_restate, case, peer, args))
        if "pystatefun" not in args.systems:
            return
        for backend in args.backends:
            for variant, extra, checkout in variants:
                progress(
                    f"{case.name} ({case.describe()}): pystatefun {backend}"
                    + (f" [{variant}: {extra}]" if variant else "")
                )
                record(
                    "pystatefun",
                    backend,
                    variant,
                    case,
                    functools.partial(run_pystatefun, case, backend, extra, checkout, args),
                )

    for round_ in range(args.rounds):
        if args.rounds > 1:
            progress(f"round {round_ + 1} of {args.rounds}")
        for case in cases.values():
            run_case(case)

    if args.smoke:
        smoke_banner()
    print(f"Machine: {machine_note()}. {versions(peer[0] if peer else None)}.\n")
    print_report(rows, cases, args)
    for failure in failures:
        print(f"\nFAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
