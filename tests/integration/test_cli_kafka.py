"""`statefun kafka`: the local development broker, as a user runs it (real processes, a real
broker from the Maven Central jars the test suite uses)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statefun._kafka_local._command import topic_argument
from statefun._kafka_local.broker import jars_fetched, kafka_version
from tests._support import free_port

pytestmark = pytest.mark.timeout(300)

STATEFUN = [sys.executable, "-m", "statefun"]


def kafka(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STATEFUN, "kafka", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_topic_argument() -> None:
    assert topic_argument("orders") == ("orders", 1)
    assert topic_argument("shop-carts:4") == ("shop-carts", 4)
    for bad in ("", "a b", "a:0", "a:x", "..", "a:2:3", "x" * 250):
        with pytest.raises(argparse.ArgumentTypeError):
            topic_argument(bad)


def test_start_on_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = kafka("start", "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.startswith(f"statefun kafka: error: cannot listen on 127.0.0.1:{port}: ")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_without_java_and_maven_says_what_it_needs(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": str(tmp_path),  # neither java nor mvn
        "PYSTATEFUN_KAFKA_CACHE": str(tmp_path / "empty-cache"),  # nothing fetched yet
    }
    env.pop("JAVA_HOME", None)
    done = kafka("start", "--port", str(free_port()), env=env)
    assert done.returncode == 1
    assert done.stderr == (
        "statefun kafka: error: needs Java 17+ and Maven (mvn) on PATH to fetch Kafka "
        f"{kafka_version()} from Maven Central; missing: java, mvn\n"
    )


def test_status_and_stop_without_a_broker() -> None:
    port = free_port()
    done = kafka("status", "--port", str(port))
    assert done.returncode == 1
    assert done.stdout.startswith(f"no Kafka broker at 127.0.0.1:{port} (")
    done = kafka("stop", "--port", str(port))
    assert done.returncode == 1
    assert done.stdout == f"no broker of `statefun kafka start` on 127.0.0.1:{port}\n"


def _start(args: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    """Start `statefun kafka start ARGS`; its stdout lines up to the one after the topics."""
    process = subprocess.Popen(
        [*STATEFUN, "kafka", "start", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C stops the broker"):
            return process, lines
    process.wait(timeout=60)
    assert process.stderr is not None
    raise AssertionError(f"no broker: {lines} {process.stderr.read()}")


def _stop(process: subprocess.Popen[str], signum: int) -> str:
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return out


@pytest.mark.kafka
@pytest.mark.skipif(not jars_fetched(), reason="Kafka's jars are not fetched yet")
def test_start_creates_topics_keeps_data_and_stops_cleanly(tmp_path: Path) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    port = free_port()
    data = tmp_path / "kafka-data"
    process, lines = _start(
        ["--port", str(port), "--topic", "orders:2", "--topic", "receipts", "--data-dir", str(data)]
    )
    try:
        assert lines[:3] == [
            f"Kafka broker ready at 127.0.0.1:{port}",
            "created topic orders (2 partitions)",
            "created topic receipts (1 partition)",
        ]
        bootstrap = f"127.0.0.1:{port}"
        assert kafka("status", "--port", str(port)).returncode == 0
        admin: Any = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics()}
        finally:
            admin.close()
        assert described["orders"] == 2 and described["receipts"] == 1
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        producer.send("orders", key=b"k", value=b"kept").get(timeout=30)
        producer.close()
    except BaseException:
        process.kill()
        raise
    assert _stop(process, signal.SIGINT).strip() == "Kafka broker stopped"
    assert kafka("status", "--port", str(port)).returncode == 1

    # Again on the same data directory: the topic and its record are still there.
    process, lines = _start(["--port", str(port), "--topic", "orders:3", "--data-dir", str(data)])
    try:
        assert lines[:2] == [
            f"Kafka broker ready at 127.0.0.1:{port}",
            "topic orders exists (2 partitions; kept, not 3)",
        ]
        consumer = KafkaConsumer(
            "orders",
            bootstrap_servers=f"127.0.0.1:{port}",
            auto_offset_reset="earliest",
            consumer_timeout_ms=10_000,
        )
        values = [record.value for record in consumer]
        consumer.close()
        assert values == [b"kept"]
    except BaseException:
        process.kill()
        raise
    stopped = kafka("stop", "--port", str(port))
    assert (stopped.returncode, stopped.stdout) == (
        0,
        f"Kafka broker on 127.0.0.1:{port} stopped\n",
    )
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == "Kafka broker stopped"
    assert (data / "logs" / "meta.properties").is_file()
    again = kafka("stop", "--port", str(port))
    assert again.returncode == 1
    assert again.stdout == f"no broker of `statefun kafka start` on 127.0.0.1:{port}\n"
