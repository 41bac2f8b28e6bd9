"""Randomized end to end: the runtime process is killed with SIGKILL at random moments.

Functions count per key, forward to other addresses, send delayed messages and cancel some,
and write to a file egress. The runtime (``statefun run``, a real process) is killed a few
times and restarted on the same checkpoints; at the end the committed egress output must be
exactly what a model of the input predicts: every effect once, none missing. Embedded and
remote functions (a ``statefun serve`` process that stays up), memory and RocksDB state.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests._support import endpoint_yaml, serve_functions

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = Path(__file__).with_name("model_fns.py")
STATEFUN = [sys.executable, "-m", "statefun"]


def write_input(path: Path, rng: random.Random, messages: int, keys: int) -> list[tuple[int, str]]:
    sent = [(seq, f"k{rng.randrange(keys)}") for seq in range(1, messages + 1)]
    with path.open("w") as out:
        for seq, key in sent:
            record = {"target": "model/counter", "id": key, "value": f"inc:{seq}"}
            out.write(json.dumps(record) + "\n")
    return sent


def model(sent: list[tuple[int, str]]) -> Counter[str]:
    expected: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for seq, key in sent:
        counts[key] += 1
        expected[f"count {key}={counts[key]}"] += 1
        expected[f"fwd {seq}"] += 1
        if seq % 5 == 0 and seq % 10 != 0:
            expected[f"late {seq}"] += 1
    return expected


def committed(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["value"] for line in path.read_text().splitlines())


def module_yaml(tmp: Path, remote_url: str | None) -> Path:
    endpoint = endpoint_yaml(FUNCTIONS, remote_url)
    text = (
        endpoint
        + "---\nkind: io.pystatefun.file.v1/ingress\nspec:\n  id: model/in\n  path: in.jsonl\n"
        + "---\nkind: io.pystatefun.file.v1/egress\nspec:\n  id: model/out\n  path: out.jsonl\n"
    )
    path = tmp / "module.yaml"
    path.write_text(text)
    return path


def run_args(tmp: Path, backend: str) -> list[str]:
    return [
        *STATEFUN,
        "run",
        str(tmp / "module.yaml"),
        "--set",
        f"checkpoint_dir={tmp / 'checkpoints'}",
        "--set",
        "checkpoint_interval_ms=40",
        "--set",
        f"state_backend={backend}",
        "--set",
        f"state_dir={tmp / 'state'}",
        "--set",
        "max_in_flight_messages=200",
        "--set",
        "max_in_flight_remote_messages=200",
        "--set",
        f"dead_letter_path={tmp / 'dead.jsonl'}",
    ]


@pytest.fixture
def function_server(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param != "remote":
        yield None
        return
    with serve_functions(FUNCTIONS, ROOT) as url:
        yield url


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("function_server", ["embedded", "remote"], indirect=True)
def test_sigkill_at_random_moments_changes_nothing(
    tmp_path: Path, backend: str, function_server: str | None
) -> None:
    seed = int(os.environ.get("PYSTATEFUN_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    remote = function_server is not None
    sent = write_input(tmp_path / "in.jsonl", rng, messages=3000 if remote else 50000, keys=25)
    module_yaml(tmp_path, function_server)
    kills = 0
    for _ in range(3):
        process = subprocess.Popen(
            run_args(tmp_path, backend), cwd=tmp_path, stderr=subprocess.DEVNULL
        )
        # Kill mid-work: after a new checkpoint appeared, plus a random part of an interval.
        before = len(list((tmp_path / "checkpoints").glob("chk-*/_metadata")))
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            if len(list((tmp_path / "checkpoints").glob("chk-*/_metadata"))) > before:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.1))
        if process.poll() is not None:
            break  # finished before the kill
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
    final = subprocess.run(
        run_args(tmp_path, backend), cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert final.returncode == 0, f"seed {seed}: {final.stderr[-2000:]}"
    assert kills >= 1, f"seed {seed}: the job ended before it could be killed"
    assert not (tmp_path / "dead.jsonl").exists(), f"seed {seed}: dead letters"
    got, want = committed(tmp_path / "out.jsonl"), model(sent)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"seed {seed}, {kills} kill(s): {sum(missing.values())} missing "
        f"{list(missing)[:5]}, {sum(extra.values())} extra {list(extra)[:5]}"
    )
