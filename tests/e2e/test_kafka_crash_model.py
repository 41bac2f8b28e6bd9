"""Randomized end to end through Kafka: the runtime is killed with SIGKILL at random moments.

Commands are produced to a Kafka ingress topic (key = function id, value = UTF-8 text typed
``model/Command``) at a steady rate while runtimes (``statefun run``, real processes) come and go.
The functions (``kafka_model_fns.py``) count per key, forward to another function, send
delayed messages and cancel some, and write every effect to an exactly-once Kafka egress.
The runtime is killed a few times - after a new checkpoint plus a random part of an interval,
or at a random moment of its start-up and recovery - and restarted on the same checkpoints.
The last process runs until a ``read_committed`` consumer has seen the expected number of
records (plus a few checkpoints more, to let duplicates show), then gets SIGTERM and must exit
0. Every expected record must have been seen exactly once, none other, and each key's counts
in order. Embedded functions with memory and RocksDB state, and remote functions (a
``statefun serve`` process that stays up).

A failure names its seed; ``PYSTATEFUN_CRASH_SEED=<seed>`` replays the same input and the same
kill plan (where exactly a kill lands still depends on timing).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statefun._kafka_local.broker import KafkaBroker
from tests._support import endpoint_yaml, serve_functions

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = Path(__file__).with_name("kafka_model_fns.py")
STATEFUN = [sys.executable, "-m", "statefun"]
INTERVAL_MS = 100
KEYS = 25
PARTITIONS = 3
_CHECKPOINT = re.compile(r"^chk-(\d+)$")


# -- input and model ------------------------------------------------------------------------------


def make_input(rng: random.Random, messages: int) -> list[tuple[int, str]]:
    return [(seq, f"k{rng.randrange(KEYS)}") for seq in range(1, messages + 1)]


def model(sent: list[tuple[int, str]]) -> Counter[tuple[str, str]]:
    """Every (key, value) record the egress must hold once."""
    expected: Counter[tuple[str, str]] = Counter()
    counts: Counter[str] = Counter()
    for seq, key in sent:
        counts[key] += 1
        expected[(key, f"count {key}={counts[key]}")] += 1
        counts[f"{key}-f"] += 1
        expected[(f"{key}-f", f"fwd {seq}")] += 1
        expected[(f"{key}-f", f"seen {key}-f={counts[f'{key}-f']}")] += 1
        if seq % 5 == 0 and seq % 10 != 0:
            counts[f"{key}-late"] += 1
            expected[(f"{key}-late", f"late {seq}")] += 1
            expected[(f"{key}-late", f"seen {key}-late={counts[f'{key}-late']}")] += 1
    return expected


class Feeder(threading.Thread):
    """Produces the input at a steady rate while runtimes come and go (Kafka keeps it)."""

    def __init__(
        self, bootstrap: str, topic: str, out: str, sent: list[tuple[int, str]], rate: float
    ) -> None:
        super().__init__(daemon=True)
        self.args = bootstrap, topic, out, sent, rate
        self.error: BaseException | None = None

    def run(self) -> None:
        bootstrap, topic, out, sent, rate = self.args
        try:
            producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
            try:
                start = time.monotonic()
                for index in range(0, len(sent), 20):
                    # The default partitioner keeps a key on one partition: in order.
                    for seq, key in sent[index : index + 20]:
                        producer.send(topic, key=key.encode(), value=f"inc:{seq}:{out}".encode())
                    time.sleep(max(0.0, start + (index + 20) / rate - time.monotonic()))
                producer.flush(timeout=30)
            finally:
                producer.close()
        except BaseException as exc:
            self.error = exc


class Reader:
    """A read_committed consumer of the output topic that keeps what it has read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        self.partition = TopicPartition(topic, 0)
        self.consumer.assign([self.partition])
        self.consumer.seek_to_beginning(self.partition)
        self.records: list[tuple[str, str]] = []

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            for batch in self.consumer.poll(timeout_ms=100).values():
                self.records += [(r.key.decode(), r.value.decode()) for r in batch]
            if time.monotonic() >= deadline:
                return

    def until(self, count: int, seconds: float, alive: Any) -> bool:
        """Read until ``count`` records or ``seconds``; False if ``alive()`` turns False."""
        deadline = time.monotonic() + seconds
        while len(self.records) < count and time.monotonic() < deadline:
            if not alive():
                return False
            self.poll(0.2)
        return True

    def drain(self) -> None:
        """Everything committed up to the end of the partition (no writer is left)."""
        end = self.consumer.end_offsets([self.partition])[self.partition]
        deadline = time.monotonic() + 30
        while self.consumer.position(self.partition) < end and time.monotonic() < deadline:
            self.poll(0.2)
        self.poll(0.5)

    def close(self) -> None:
        self.consumer.close()


# -- processes ------------------------------------------------------------------------------------


def write_module(tmp: Path, bootstrap: str, topic: str, tag: str, remote_url: str | None) -> None:
    endpoint = endpoint_yaml(FUNCTIONS, remote_url)
    (tmp / "module.yaml").write_text(
        f"""{endpoint}---
kind: io.statefun.kafka.v1/ingress
spec:
  id: model/in
  address: {bootstrap}
  consumerGroupId: {tag}-group
  startupPosition:
    type: earliest
  properties:
    - max.poll.records: "100"
  topics:
    - topic: {topic}
      valueType: model/Command
      targets:
        - model/counter
---
kind: io.statefun.kafka.v1/egress
spec:
  id: model/out
  address: {bootstrap}
  deliverySemantic:
    type: exactly-once
    transactionTimeout: 1min
  properties:
    - transactional.id: {tag}-tx
"""
    )


def start_runtime(tmp: Path, number: int, backend: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"runtime-{number}.log"
    args = [
        *STATEFUN,
        "run",
        str(tmp / "module.yaml"),
        "--set",
        f"checkpoint_dir={tmp / 'checkpoints'}",
        "--set",
        f"checkpoint_interval_ms={INTERVAL_MS}",
        "--set",
        "max_in_flight_messages=200",
        "--set",
        "max_in_flight_remote_messages=200",
        "--set",
        f"state_backend={backend}",
        "--set",
        f"state_dir={tmp / 'state'}",
        "--set",
        f"dead_letter_path={tmp / 'dead.jsonl'}",
    ]
    with log.open("wb") as err:
        process = subprocess.Popen(args, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err)
    return process, log


def latest_checkpoint(tmp: Path) -> int:
    best = 0
    folder = tmp / "checkpoints"
    if folder.is_dir():
        for entry in folder.iterdir():
            match = _CHECKPOINT.match(entry.name)
            if match and (entry / "_metadata").exists():
                best = max(best, int(match.group(1)))
    return best


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@pytest.fixture
def function_server(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param != "remote":
        yield None
        return
    with serve_functions(FUNCTIONS, ROOT) as url:
        yield url


# -- the test -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function_server", "backend"),
    [("embedded", "memory"), ("embedded", "rocksdb"), ("remote", "memory")],
    indirect=["function_server"],
)
def test_sigkill_at_random_moments_kafka_exactly_once(
    tmp_path: Path, kafka_broker: KafkaBroker, function_server: str | None, backend: str
) -> None:
    seed = int(os.environ.get("PYSTATEFUN_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    bootstrap = kafka_broker.bootstrap_servers
    tag = f"crash-{uuid.uuid4().hex[:10]}"
    source, out = f"{tag}-in", f"{tag}-out"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(source, num_partitions=PARTITIONS, replication_factor=1),
                NewTopic(out, num_partitions=1, replication_factor=1),
            ]
        )
    finally:
        admin.close()
    write_module(tmp_path, bootstrap, source, tag, function_server)
    kills = rng.randint(2, 4)
    # About 5 s of input at a steady rate: the kills land while records keep arriving.
    messages, rate = (1500, 300.0) if function_server else (4000, 800.0)
    sent = make_input(rng, messages)
    want = model(sent)
    total = sum(want.values())
    where = "remote" if function_server else "embedded"
    context = f"seed {seed} ({where}, {backend}, {kills} kills)"

    reader = Reader(bootstrap, out)
    feeder = Feeder(bootstrap, source, out, sent, rate)
    feeder.start()
    try:
        moments: list[str] = []
        for number in range(kills):
            process, log = start_runtime(tmp_path, number, backend)
            before = latest_checkpoint(tmp_path)
            if rng.random() < 0.25:  # anywhere in start-up and recovery, or a bit later
                pause = rng.uniform(0.0, 2.5)
                moments.append(f"{pause:.2f}s after start")
                time.sleep(pause)
            else:  # mid-work: after 1-3 new checkpoints, plus a random part of an interval
                wanted = before + rng.randint(1, 3)
                deadline = time.monotonic() + 60
                while latest_checkpoint(tmp_path) < wanted:
                    assert process.poll() is None, f"{context}: runtime exited\n{tail(log)}"
                    assert time.monotonic() < deadline, f"{context}: no checkpoint\n{tail(log)}"
                    time.sleep(0.005)
                pause = rng.uniform(0.0, INTERVAL_MS / 1000)
                moments.append(f"chk {wanted}+{pause:.3f}s")
                time.sleep(pause)
            assert process.poll() is None, f"{context}: runtime exited\n{tail(log)}"
            process.send_signal(signal.SIGKILL)
            process.wait()
            reader.poll(0)

        process, log = start_runtime(tmp_path, kills, backend)
        try:
            before = latest_checkpoint(tmp_path)
            finished = reader.until(total, 90, lambda: process.poll() is None)
            assert finished, f"{context}: runtime exited\n{tail(log)}"
            # The earlier processes may have written everything already: this one must have
            # recovered and completed a few checkpoints too (duplicates would show up by now).
            deadline = time.monotonic() + 60
            while latest_checkpoint(tmp_path) < before + 3:
                assert process.poll() is None, f"{context}: runtime exited\n{tail(log)}"
                assert time.monotonic() < deadline, f"{context}: no checkpoint\n{tail(log)}"
                time.sleep(0.01)
            reader.poll(3 * INTERVAL_MS / 1000 + 0.3)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        assert process.returncode == 0, f"{context}: exit {process.returncode}\n{tail(log)}"
        reader.drain()
        records = reader.records
    finally:
        feeder.join(timeout=60)
        reader.close()
    assert feeder.error is None, f"{context}: producing the input failed: {feeder.error!r}"

    assert not (tmp_path / "dead.jsonl").exists(), f"{context}: dead letters"
    got = Counter(records)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"{context}, kills at {moments}: {len(records)} records of {total}; "
        f"{sum(missing.values())} missing {list(missing)[:5]}, "
        f"{sum(extra.values())} extra {list(extra)[:5]}"
    )
    for key in {k for _, k in sent}:  # each key's counts in order, in its single partition
        counts = [v for k, v in records if k == key]
        assert counts == [f"count {key}={n}" for n in range(1, len(counts) + 1)], context
