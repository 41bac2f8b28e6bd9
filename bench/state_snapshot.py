"""State snapshots: how long a checkpoint stalls processing, and how long the rest takes.

    .venv/bin/python bench/state_snapshot.py [--keys 100000 1000000] [--backends memory rocksdb]
    .venv/bin/python bench/state_snapshot.py --smoke   # does it still run? (seconds)

For each backend and state size (addresses with one 8-byte int state, 128 key groups):

* snapshot(): the synchronous part at the checkpoint's cut, on the event loop (the stall);
* write(): the first, full write, in a worker thread, while the main thread goes on putting;
  "max put" is the longest single put meanwhile: GIL contention, the memory backend's
  copy-on-write copies, and the cyclic GC walking the copied dicts once or twice;
* 2nd write: after changing 1% of the addresses, with the first checkpoint as ``previous``;
  "copied" is what it wrote (RocksDB hard-links unchanged SST files; memory writes it all);
* restore(): the second checkpoint into a fresh backend;
* verify: reading back every file of the second checkpoint and checking its size and CRC-32C
  against the manifest, as a restore does first (the checksums themselves are computed while
  the files are written, inside "write").

For RocksDB it also shows what a native checkpoint (memtable flush + hard links) of the same
freshly loaded state costs: the stall if it were taken at the cut instead of in the worker.

Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import SMOKE_HELP, expect, progress, smoke_banner  # noqa: E402
from statefun._checksums import describe_mismatch, file_sum  # noqa: E402
from statefun._keygroups import key_group_for  # noqa: E402
from statefun.sdk._types import TypedValue  # noqa: E402
from statefun.state.base import StateBackend  # noqa: E402
from statefun.state.memory import MemoryStateBackend  # noqa: E402

TYPENAME = "bench/counter"
KEY_GROUPS = 128
INT = "io.statefun.types/int"


def _make(kind: str, path: Path) -> StateBackend:
    if kind == "memory":
        return MemoryStateBackend()
    from statefun.state.rocksdb import RocksDBStateBackend

    return RocksDBStateBackend(path)


def _value(i: int) -> dict[str, Any]:
    return {"count": TypedValue(INT, struct.pack("<q", i))}


def _native_checkpoint_ms(backend: StateBackend, path: Path) -> float:
    from rocksdict import Checkpoint

    db = backend._db  # type: ignore[attr-defined]
    started = time.perf_counter()
    Checkpoint(db).create_checkpoint(str(path))
    return (time.perf_counter() - started) * 1000


def run(kind: str, n: int, root: Path) -> dict[str, Any]:
    keys = [(key_group_for(TYPENAME, str(i), KEY_GROUPS), (TYPENAME, str(i))) for i in range(n)]
    backend = _make(kind, root / "live")
    started = time.perf_counter()
    for i, (kg, key) in enumerate(keys):
        backend.put(kg, key, _value(i))
    fill_s = time.perf_counter() - started
    # Some writes since the last flush, as in steady operation.
    for i in random.sample(range(n), min(n, 5_000)):
        backend.put(keys[i][0], keys[i][1], _value(-i))

    started = time.perf_counter()
    snap = backend.snapshot()
    stall_ms = (time.perf_counter() - started) * 1000

    result: dict[str, Any] = {}
    errors: list[BaseException] = []

    def write() -> None:
        try:
            began = time.perf_counter()
            result.update(snap.write(root / "chk-1", None))
            result["seconds"] = time.perf_counter() - began
        except BaseException as exc:  # pragma: no cover - shown below
            errors.append(exc)

    worker = threading.Thread(target=write)
    worker.start()
    max_put = 0.0
    puts = 0
    while worker.is_alive():
        kg, key = keys[random.randrange(n)]
        t = time.perf_counter()
        backend.put(kg, key, _value(puts))
        max_put = max(max_put, time.perf_counter() - t)
        puts += 1
        if puts % 64 == 0:
            time.sleep(0.0005)  # an event loop is not busy all the time
    worker.join()
    if errors:
        raise errors[0]
    snap.release()
    first = dict(result)

    for i in random.sample(range(n), n // 100):
        backend.put(keys[i][0], keys[i][1], _value(i + 1))
    snap = backend.snapshot()
    started = time.perf_counter()
    second = snap.write(root / "chk-2", root / "chk-1")
    second_s = time.perf_counter() - started
    snap.release()

    started = time.perf_counter()
    for name, expected in second["checksums"].items():
        found = file_sum(root / "chk-2" / name)
        assert describe_mismatch((expected[0], expected[1]), found) is None, name
    verify_s = time.perf_counter() - started

    restored = _make(kind, root / "restored")
    started = time.perf_counter()
    restored.restore(root / "chk-2", second)
    restore_s = time.perf_counter() - started
    # The restored state is the state at the second snapshot: every address (a sample of at
    # most 2,000), with its value. Nothing was put between that snapshot and now.
    restored_keys = sum(1 for kg in restored.key_groups() for _ in restored.items(kg))
    expect(restored_keys == n, f"{kind}: {restored_keys} addresses restored, expected {n}")
    for i in random.sample(range(n), min(n, 2_000)):
        expect(
            restored.get(*keys[i]) == backend.get(*keys[i]),
            f"{kind}: the restored state of {keys[i][1]} differs from the checkpointed one",
        )
    restored.close()
    backend.close()

    native_ms = None
    if kind == "rocksdb":  # the same state in a fresh database, checkpointed natively
        other = _make(kind, root / "native")
        for i, (kg, key) in enumerate(keys):
            other.put(kg, key, _value(i))
        other._flush_pending(1 << 62)  # type: ignore[attr-defined]
        native_ms = _native_checkpoint_ms(other, root / "native-chk")
        other.close()

    def size(manifest: dict[str, Any]) -> tuple[float, float]:
        if manifest["backend"] == "memory":
            return manifest["bytes"] / 1e6, manifest["bytes"] / 1e6
        total = manifest["copied_bytes"] + manifest["reused_bytes"]
        return manifest["copied_bytes"] / 1e6, total / 1e6

    copied, total = size(second)
    return {
        "backend": kind,
        "keys": n,
        "fill_s": fill_s,
        "stall_ms": stall_ms,
        "write_s": first["seconds"],
        "max_put_ms": max_put * 1000,
        "puts": puts,
        "second_s": second_s,
        "copied_mb": copied,
        "total_mb": total,
        "restore_s": restore_s,
        "verify_s": verify_s,
        "native_ms": native_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=["memory", "rocksdb"])
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.keys = [2_000]
    rows = []
    for n in args.keys:
        for kind in args.backends:
            root = Path(tempfile.mkdtemp(prefix="statefun-bench-"))
            try:
                rows.append(run(kind, n, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            row = rows[-1]
            progress(f"  done {kind} {n}: {row}")
    if args.smoke:
        smoke_banner()
    print(
        "| backend | keys | snapshot() (stall) | write (full) | max put during write "
        "| 2nd write, 1% changed | 2nd copied / size | restore | verify | "
        "native checkpoint at cut |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        native = "-" if r["native_ms"] is None else f"{r['native_ms']:.0f} ms"
        print(
            f"| {r['backend']} | {r['keys']:,} | {r['stall_ms']:.3f} ms | {r['write_s']:.2f} s "
            f"| {r['max_put_ms']:.1f} ms | {r['second_s']:.2f} s "
            f"| {r['copied_mb']:.1f} / {r['total_mb']:.1f} MB | {r['restore_s']:.2f} s "
            f"| {r['verify_s'] * 1000:.0f} ms | {native} |"
        )


if __name__ == "__main__":
    main()
