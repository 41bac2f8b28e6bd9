"""Run the fuzz tests for a given time, round after round with new seeds, on one core.

    .venv/bin/python scripts/fuzz.py --minutes 25

Each round runs one fuzz test file under the ``long`` Hypothesis profile (tests/_fuzz.py)
with a fresh seed; rounds cycle through the files until the time is spent. At the end it
prints, per test, the examples tried, failures and hangs (a test past ``--hang-seconds``).
A failure's example is printed by Hypothesis in the round's output, kept in --log-dir.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [
    "tests/unit/test_fuzz_handler.py",
    "tests/unit/test_fuzz_module_loader.py",
    "tests/integration/test_fuzz_http_ingress.py",
]
_TEST = re.compile(r"^(tests/\S+::\S+):$", re.MULTILINE)
_GENERATED = re.compile(r"during generate phase.*?- (\d+) passing, (\d+) failing", re.DOTALL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=25.0)
    parser.add_argument("--hang-seconds", type=int, default=900)
    parser.add_argument("--log-dir", type=Path, default=ROOT / "build" / "fuzz")
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    passing: dict[str, int] = defaultdict(int)
    failing: dict[str, int] = defaultdict(int)
    rounds = hangs = 0
    started = time.monotonic()
    end = started + args.minutes * 60
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    while time.monotonic() < end:
        file = FILES[rounds % len(FILES)]
        seed = random.randrange(1 << 32)
        command = [
            sys.executable, "-m", "pytest", file, "-q", "-p", "no:cacheprovider",
            "--hypothesis-profile=long", f"--hypothesis-seed={seed}",
            "--hypothesis-show-statistics", f"--timeout={args.hang_seconds}",
        ]  # fmt: skip
        result = subprocess.run(
            ["taskset", "-c", "0", *command] if _has_taskset() else command,
            cwd=ROOT, env=environment, capture_output=True, text=True, check=False,
        )  # fmt: skip
        output = result.stdout + result.stderr
        (args.log_dir / f"round-{rounds:04d}.log").write_text(f"{command}\n{output}")
        rounds += 1
        hangs += output.count("Timeout >")
        # --hypothesis-show-statistics: per test, the examples of its generate phase
        pieces = _TEST.split(output)
        for name, text in zip(pieces[1::2], pieces[2::2], strict=True):
            counts = _GENERATED.search(text)
            if counts is not None:
                passing[name] += int(counts.group(1))
                failing[name] += int(counts.group(2))
        if result.returncode != 0:
            print(f"round {rounds} ({file}, seed {seed}) FAILED: see {args.log_dir}", flush=True)
    minutes = (time.monotonic() - started) / 60
    print(f"{rounds} rounds in {minutes:.1f} min; hangs: {hangs}")
    for name in sorted(passing):
        print(f"{name}: {passing[name]} examples passed, {failing[name]} failed")
    print(f"total: {sum(passing.values())} examples, {sum(failing.values())} failed")
    return 1 if hangs or any(failing.values()) else 0


def _has_taskset() -> bool:
    return subprocess.run(["which", "taskset"], capture_output=True, check=False).returncode == 0


if __name__ == "__main__":
    raise SystemExit(main())
