"""Every benchmark still runs: each script of bench/ in its smoke mode (``--smoke``).

A smoke run takes every scenario of the benchmark end to end at tiny sizes, with the real code
paths (runtime processes, function servers, the Kafka broker of the test run, StateFun's JVM
runtime), and exits non-zero if anything fails, its own correctness checks included (counts
exact, no record twice, the same answers from every SDK). Its figures mean nothing; speed is
measured by running the benchmarks themselves (BENCHMARKS.md).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _restate_processes as restate_peer
from bench._jvm_processes import missing_jvm_tools
from bench._restate_processes import missing_restate_tools

ROOT = Path(__file__).resolve().parents[2]
HAVE_ROCKSDB = importlib.util.find_spec("rocksdict") is not None
#: the state backends the benchmarks that take ``--backends`` can run here
BACKENDS = ["--backends", "memory", "rocksdb"] if HAVE_ROCKSDB else ["--backends", "memory"]

pytestmark = pytest.mark.bench


def smoke(script: str, *options: str, timeout: float = 240.0) -> str:
    """Run ``bench/<script> --smoke OPTIONS``; fail with its output's tail unless it exits 0
    and prints its table as a smoke run. Returns its stdout."""
    command = [sys.executable, str(ROOT / "bench" / script), "--smoke", *options]
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"{script} --smoke did not finish in {timeout:.0f} s:\n{err[-3000:]}")
    if done.returncode != 0:
        pytest.fail(
            f"{script} --smoke exited {done.returncode}:\n{done.stderr[-4000:]}\n"
            f"--- stdout:\n{done.stdout[-2000:]}"
        )
    assert done.stdout.startswith("SMOKE RUN"), done.stdout[:500]
    assert "|" in done.stdout, f"{script} printed no table:\n{done.stdout}"
    return done.stdout


def test_hot_paths() -> None:
    smoke("hot_paths.py", timeout=60)


def test_embedded_dispatch() -> None:
    out = smoke("embedded_dispatch.py", timeout=60)
    assert "| one key | slice loop |" in out, out


def test_instructions() -> None:
    out = smoke("instructions.py", timeout=120)  # under valgrind where it is installed
    assert "| per message |" in out, out
    out = smoke("instructions.py", "--workload", "sdk-handler", timeout=120)
    assert "| per invocation |" in out, out


def test_state_snapshot() -> None:
    smoke("state_snapshot.py", *BACKENDS, timeout=60)


@pytest.mark.compat  # the official SDK and the fork in their own virtualenvs
@pytest.mark.timeout(660)
def test_sdk_handler() -> None:
    out = smoke("sdk_handler.py", timeout=600)  # a first run builds the peers' virtualenvs
    assert "official 3.3.0" in out and "fork 3.5.0" in out


def test_runtime_e2e() -> None:
    out = smoke("runtime_e2e.py")
    for scenario in ("a", "b1", "b2", "c1", "c1x", "c2", "c2x"):
        assert f"\n| {scenario} |" in out, f"scenario {scenario} missing:\n{out}"


def test_checkpoints() -> None:
    out = smoke("checkpoints.py", *BACKENDS)
    for part in ("### 1.", "### 2.", "### 3.", "### 4."):
        assert part in out, f"part {part} missing:\n{out}"


@pytest.mark.kafka
def test_kafka_consumer(bootstrap: str) -> None:
    smoke("kafka_consumer.py", "--bootstrap", bootstrap, timeout=120)


@pytest.mark.kafka
def test_kafka_producer(bootstrap: str) -> None:
    smoke("kafka_producer.py", "--bootstrap", bootstrap, timeout=120)


@pytest.mark.kafka
def test_kafka_e2e(bootstrap: str) -> None:
    out = smoke("kafka_e2e.py", "--bootstrap", bootstrap, timeout=180)
    for scenario in ("loop-alo", "sf-alo", "loop-eo", "sf-eo"):
        assert f"\n| {scenario} |" in out, f"scenario {scenario} missing:\n{out}"


_missing = missing_jvm_tools()


@pytest.mark.jvm
@pytest.mark.kafka
@pytest.mark.timeout(900)  # a first Maven build fetches ~300 MB
@pytest.mark.skipif(_missing is not None, reason=_missing or "")
def test_statefun_jvm_vs_pystatefun(bootstrap: str) -> None:
    out = smoke("statefun_jvm_vs_pystatefun.py", "--bootstrap", bootstrap, timeout=840)
    for semantic in ("exactly-once", "at-least-once"):
        for runtime in ("pystatefun", "statefun-jvm"):
            assert f"| {semantic} | {runtime} |" in out, f"{runtime} {semantic} missing:\n{out}"
            assert f"- {semantic}, {runtime}: " in out, f"no share of the ceiling:\n{out}"
    assert "- one hot key, backlog: the function server alone" in out, out


def test_testkit() -> None:
    out = smoke("testkit.py", timeout=60)
    for scenario in ("reminder-30d", "reminders-30d-10", "send"):
        assert f"\n| {scenario} |" in out, f"scenario {scenario} missing:\n{out}"


_restate_missing = missing_restate_tools()


@pytest.mark.timeout(600)  # a first run installs the server from npm (~225 MB)
@pytest.mark.skipif(_restate_missing is not None, reason=_restate_missing or "")
def test_restate_vs_pystatefun() -> None:
    try:
        restate_peer.install()
    except restate_peer.RestateUnavailableError as exc:
        pytest.skip(f"the Restate peer cannot be installed here: {exc}")
    out = smoke("restate_vs_pystatefun.py", *BACKENDS, timeout=300)
    for case in ("20 keys, 8 callers", "one key, 8 callers", "one key, one caller"):
        assert f"| {case} | Restate | - |" in out, f"{case}, Restate missing:\n{out}"
        assert f"| {case} | pystatefun | memory |" in out, f"{case}, pystatefun missing:\n{out}"


def test_cluster(bootstrap: str) -> None:
    out = smoke("cluster.py", "--bootstrap", bootstrap, timeout=300)
    assert "| two-hop | cluster-2 |" in out and "two-hop: cluster-2 / single:" in out, out


def test_idempotency_keys(bootstrap: str) -> None:
    out = smoke("idempotency_keys.py", "--bootstrap", bootstrap, timeout=300)
    assert "| call repeat |" in out and "cluster-2 p50 / p99" in out, out
    assert "| messages keyed | " in out and "x single)" in out, out


def test_cluster_paths() -> None:
    smoke("cluster_paths.py", timeout=60)


def test_admin_views() -> None:
    out = smoke("admin_views.py", *BACKENDS, timeout=120)
    for part in ("### 1.", "### 2.", "### 3."):
        assert part in out, f"part {part} missing:\n{out}"
