"""Randomized end to end on a clustered job: workers killed, added, removed and paused.

The input, the functions and the model are those of ``test_kafka_crash_model.py`` (commands
through a Kafka ingress, counters that forward to echo functions on other keys - most on other
workers -, delayed messages with cancellation, every effect to an exactly-once Kafka egress).
Here the job runs on ``statefun worker`` processes, each with a folder of its own: three at
first; during the run one is SIGKILLed and its folder deleted before it restarts (twice, at
random), a fourth joins, one leaves (SIGTERM, exit 0), and one is SIGSTOPped past the session
timeout and resumed (its commits are refused: it exits 1 and is restarted). Every expected
record must be read ``read_committed`` exactly once, none other, each key's counts in order.
The time from a SIGKILL to the first output of the killed worker's key groups on another worker
is printed (the rebalance time). A third run keeps state in RocksDB (embedded functions): there a
killed worker keeps its folder, so it catches up from its local copy's marks after each restart.
``PYSTATEFUN_CRASH_SEED=<seed>`` replays a plan.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import cluster_config
from tests._support import serve_functions
from tests.e2e.test_kafka_crash_model import (
    FUNCTIONS,
    ROOT,
    Feeder,
    Reader,
    make_input,
    model,
    write_module,
)
from tests.kafka_fixture import HEARTBEAT_MS, SESSION_MS

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
PARTITIONS = 8


@pytest.fixture(params=["embedded", "remote-rocksdb"])
def variant(request: pytest.FixtureRequest) -> Iterator[tuple[str | None, str]]:
    """(the functions' URL, None: embedded; the state backend). Two runs cover both kinds of
    function and both backends (each run takes most of a minute)."""
    backend = "rocksdb" if request.param.endswith("-rocksdb") else "memory"
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    if not request.param.startswith("remote"):
        yield None, backend
        return
    with serve_functions(FUNCTIONS, ROOT) as url:
        yield url, backend


class Workers:
    def __init__(self, tmp: Path, bootstrap: str, job_id: str, backend: str = "memory") -> None:
        self.tmp, self.bootstrap, self.job_id = tmp, bootstrap, job_id
        self.backend = backend
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()

    def log(self, worker: str) -> Path:
        return self.tmp / f"{worker}-{self.starts[worker]}.log"

    def start(self, worker: str) -> None:
        folder = self.tmp / worker
        folder.mkdir(exist_ok=True)
        self.starts[worker] += 1
        args = [sys.executable, "-m", "statefun", "worker", str(self.tmp / "module.yaml")]
        for name, value in {
            "cluster.bootstrap_servers": self.bootstrap,
            "cluster.job_id": self.job_id,
            "cluster.worker_id": worker,
            "cluster.partitions": str(PARTITIONS),
            "cluster.session_timeout_ms": str(SESSION_MS),
            "cluster.heartbeat_interval_ms": str(HEARTBEAT_MS),
            "checkpoint_interval_ms": "200",
            "dead_letter_path": str(folder / "dead.jsonl"),
            "state_backend": self.backend,
        }.items():
            args += ["--set", f"{name}={value}"]
        with self.log(worker).open("wb") as err:
            self.running[worker] = subprocess.Popen(
                args, cwd=folder, stdout=subprocess.DEVNULL, stderr=err
            )

    def kill(self, worker: str) -> None:
        process = self.running.pop(worker)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        if self.backend == "memory":
            shutil.rmtree(self.tmp / worker)  # state must come back from Kafka

    def owned(self, worker: str) -> set[int]:
        lines = [
            line
            for line in self.log(worker).read_text(errors="replace").splitlines()
            if "partitions assigned:" in line
        ]
        text = lines[-1].split("partitions assigned: ")[1].split(";")[0] if lines else "none"
        found: set[int] = set()
        for part in [] if text == "none" else text.split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
        return found

    def close(self) -> None:
        for process in self.running.values():
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGKILL)
            process.wait(10)


def _partition_of_output(key: str, max_p: int) -> int:
    typename = "model/echo" if key.endswith(("-f", "-late")) else "model/counter"
    return key_group_for(typename, key, max_p) * PARTITIONS // max_p


def test_workers_killed_added_removed_and_paused_exactly_once(
    tmp_path: Path, bootstrap: str, variant: tuple[str | None, str]
) -> None:
    function_url, backend = variant
    seed = int(os.environ.get("PYSTATEFUN_CRASH_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    tag = f"cluster-crash-{uuid.uuid4().hex[:8]}"
    topic, out = f"{tag}-in", f"{tag}-out"
    write_module(tmp_path, bootstrap, topic, tag, function_url)
    config = cluster_config(
        Settings.load({"cluster.bootstrap_servers": bootstrap, "cluster.job_id": tag}, environ={})
    )
    assert config is not None
    sent = make_input(rng, 1500)
    want = model(sent)
    total = sum(want.values())
    workers = Workers(tmp_path, bootstrap, tag, backend)
    reader = Reader(bootstrap, out)
    context = f"seed {seed} ({'remote' if function_url else 'embedded'}, {backend})"
    gaps: list[float] = []
    try:
        for worker in ("w0", "w1", "w2"):
            workers.start(worker)
        time.sleep(4)
        feeder = Feeder(bootstrap, topic, out, sent, rate=100)  # ~15 s of input
        feeder.start()
        plan = ["kill", "add", "kill", "remove", "pause"]
        for step in plan:
            time.sleep(rng.uniform(1.5, 2.5))
            reader.poll(0.1)
            alive = sorted(workers.running)
            if step == "kill":
                victim = rng.choice(alive)
                moved = workers.owned(victim)
                killed_at = time.monotonic()
                workers.kill(victim)
                time.sleep(1)
                reader.poll(0.3)  # what the victim committed before it died
                seen_before = len(reader.records)
                workers.start(victim)
                # the rebalance time: the first output of the victim's key groups after it
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline and moved:
                    reader.poll(0.2)
                    if any(
                        _partition_of_output(k, config.max_parallelism) in moved
                        for k, _ in reader.records[seen_before:]
                    ):
                        gaps.append(time.monotonic() - killed_at)
                        break
            elif step == "add":
                workers.start("w3")
            elif step == "remove":
                leaving = rng.choice(alive)
                process = workers.running.pop(leaving)
                process.send_signal(signal.SIGTERM)
                assert process.wait(60) == 0, f"{context}: {leaving} did not stop cleanly"
            else:
                paused = rng.choice(alive)
                process = workers.running[paused]
                process.send_signal(signal.SIGSTOP)
                time.sleep(SESSION_MS / 1000 + 2)
                process.send_signal(signal.SIGCONT)
                time.sleep(3)
                if process.poll() is not None:  # fenced: it stopped itself
                    assert process.returncode == 1, f"{context}: {paused} exit {process.returncode}"
                    workers.start(paused)
        feeder.join(60)
        assert feeder.error is None, f"{context}: producing the input failed: {feeder.error!r}"
        deadline = time.monotonic() + 120
        while len(reader.records) < total and time.monotonic() < deadline:
            reader.poll(0.5)
        reader.poll(3)  # duplicates would come late
    finally:
        workers.close()
    reader.drain()
    reader.close()
    for gap in gaps:
        print(
            f"\nrebalance after a SIGKILL ({context}): {gap:.2f} s to the first output of the "
            f"killed worker's key groups (session timeout {SESSION_MS / 1000:.0f} s)"
        )
    got = Counter(reader.records)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"{context}: {len(reader.records)} records of {total}; "
        f"{sum(missing.values())} missing {list(missing)[:5]}, "
        f"{sum(extra.values())} extra {list(extra)[:5]}"
    )
    for key in {k for _, k in sent}:
        counts = [v for k, v in reader.records if k == key]
        assert counts == [f"count {key}={n}" for n in range(1, len(counts) + 1)], context
    if backend == "rocksdb":  # a restarted worker read its partitions from its marks
        logs = " ".join(log.read_text(errors="replace") for log in tmp_path.glob("w*-*.log"))
        assert "caught up from their marks" in logs, context
