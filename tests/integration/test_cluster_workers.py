"""Two ``statefun worker`` processes run one job on a real broker: records of a Kafka ingress
topic (its partitions shared out by the job's group) start messages that hop between addresses
on both workers, every output arrives once (``read_committed``) and the state in the
changelog equals the model; after a SIGKILL of a worker whose folder is then deleted, its key
groups come back from Kafka and still every output arrives once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics
from statefun.cluster._changelog import restore_partitions
from statefun.sdk import StringType
from tests.integration.fns.cluster_fns import ADDRESSES, next_id
from tests.kafka_fixture import HEARTBEAT_MS, SESSION_MS

kafka = import_kafka()
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
FNS = Path(__file__).parent / "fns" / "cluster_fns.py"
HOPS = 3
PARTITIONS = 8


class Cluster:
    """Worker processes of one job, each in a folder of its own."""

    def __init__(self, tmp: Path, bootstrap: str) -> None:
        self.tmp = tmp
        self.job_id = f"workers-{uuid.uuid4().hex[:8]}"
        self.bootstrap = bootstrap
        self.output = f"{self.job_id}-out"
        self.module = tmp / "module.yaml"
        self.input = f"{self.job_id}-in"
        self.module.write_text(
            "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: cluster/*\n"
            f"  module: {FNS}:functions\n---\n"
            "kind: io.statefun.kafka.v1/ingress\nspec:\n  id: cluster/in\n"
            f"  address: {bootstrap}\n  startupPosition:\n    type: earliest\n"
            f"  topics:\n    - topic: {self.input}\n"
            "      valueType: io.statefun.types/string\n      targets: [cluster/hop]\n---\n"
            "kind: io.statefun.kafka.v1/egress\nspec:\n  id: cluster/out\n"
            f"  address: {bootstrap}\n  deliverySemantic: exactly-once\n"
        )
        admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics(
                {self.input: {"num_partitions": 4, "replication_factor": 1}},
                wait_for_metadata=True,
            )
        finally:
            admin.close()
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()
        settings = Settings.load(self.settings("test"), environ={})
        config = cluster_config(settings)
        assert config is not None
        self.config: ClusterConfig = config
        ensure_topics(config)

    def settings(self, worker: str) -> dict[str, str]:
        return {
            "cluster.bootstrap_servers": self.bootstrap,
            "cluster.job_id": self.job_id,
            "cluster.worker_id": worker,
            "cluster.partitions": str(PARTITIONS),
            "cluster.session_timeout_ms": str(SESSION_MS),
            "cluster.heartbeat_interval_ms": str(HEARTBEAT_MS),
            "checkpoint_interval_ms": "300",
        }

    def folder(self, worker: str) -> Path:
        return self.tmp / worker

    def log(self, worker: str) -> Path:
        return self.tmp / f"{worker}-{self.starts[worker]}.log"

    def start(self, worker: str) -> None:
        folder = self.folder(worker)
        folder.mkdir(exist_ok=True)
        self.starts[worker] += 1
        args = [sys.executable, "-m", "statefun", "worker", str(self.module)]
        for name, value in self.settings(worker).items():
            args += ["--set", f"{name}={value}"]
        with self.log(worker).open("wb") as err:
            self.workers[worker] = subprocess.Popen(
                args, cwd=folder, stdout=subprocess.DEVNULL, stderr=err
            )

    def kill(self, worker: str) -> None:
        process = self.workers.pop(worker)
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait_assigned(self, workers: list[str], seconds: float = 60) -> None:
        """Until each of ``workers`` logs an assignment (of its latest start) with partitions."""
        deadline = time.monotonic() + seconds
        while True:
            logs = {w: self.log(w).read_text(errors="replace") for w in workers}
            if _one_generation(logs.values()):
                return
            for worker in workers:
                code = self.workers[worker].poll()
                assert code is None, f"{worker} exited {code}: {logs[worker][-2000:]}"
            assert time.monotonic() < deadline, f"no assignment: {logs}"
            time.sleep(0.2)

    def feed(self, first: int, count: int) -> None:
        """Messages ``first``.. to the job's Kafka ingress topic (key: the function id)."""
        producer = kafka.KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        try:
            for seq in range(first, first + count):
                text = f"{seq}:{HOPS}:{self.output}"
                producer.send(
                    self.input,
                    key=str(seq % ADDRESSES).encode(),
                    value=StringType.serializer().serialize(text),
                )
        finally:
            producer.flush()
            producer.close()

    def close(self) -> None:
        for process in self.workers.values():
            process.send_signal(signal.SIGKILL)
            process.wait(10)


def _assigned_last(text: str) -> bool:
    lines = [line for line in text.splitlines() if "partitions assigned:" in line]
    return bool(lines) and "partitions assigned: none;" not in lines[-1]


def _one_generation(logs: Iterable[str]) -> bool:
    """Each log's last assignment has partitions, and no two of them overlap: a worker that
    has not logged a rebalance yet still shows what it held before, which another's share
    overlaps."""
    texts = list(logs)
    if not all(_assigned_last(text) for text in texts):
        return False
    shares = [_partitions_of(text) for text in texts]
    return sum(map(len, shares)) == len(set().union(*shares))


@pytest.fixture
def cluster(tmp_path: Path, bootstrap: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, bootstrap)
    try:
        yield made
    finally:
        made.close()


def read_outputs(
    bootstrap: str, topic: str, count: int, seconds: float, wanted: set[str] | None = None
) -> Counter[str]:
    """The output values, read ``read_committed`` until ``count`` (or each of ``wanted``) or
    ``seconds``, then a little longer (a duplicate would come late)."""
    reader = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    seen: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + seconds
        settle: float | None = None
        while time.monotonic() < (settle or deadline):
            for records in reader.poll(timeout_ms=200).values():
                seen.update(record.value.decode() for record in records)
            done = wanted <= seen.keys() if wanted is not None else sum(seen.values()) >= count
            if settle is None and done:
                settle = time.monotonic() + 2
    finally:
        reader.close()
    return seen


def model_counts(count: int) -> dict[tuple[str, str], int]:
    counts: Counter[tuple[str, str]] = Counter()
    for seq in range(count):
        id_ = str(seq % ADDRESSES)
        for _ in range(HOPS + 1):
            counts[("cluster/hop", id_)] += 1
            id_ = next_id(id_)
    return dict(counts)


def state_counts(config: ClusterConfig) -> dict[tuple[str, str], int]:
    restored = restore_partitions(config, range(config.partitions))
    return {
        key: _int(values["count"].value) for _, key, values in restored.state if "count" in values
    }


def _int(data: Any) -> int:
    from statefun.sdk import IntType

    return int(IntType.serializer().deserialize(data))


def test_two_workers_every_output_once(cluster: Cluster) -> None:
    for worker in ("w0", "w1"):
        cluster.start(worker)
    cluster.wait_assigned(["w0", "w1"])
    cluster.feed(0, 3000)
    seen = read_outputs(cluster.bootstrap, cluster.output, 3000, 90)
    assert set(seen) == {str(seq) for seq in range(3000)}
    assert [value for value, n in seen.items() if n > 1] == []
    # statefun status: each worker owns half the partitions and input partitions
    args = [sys.executable, "-m", "statefun", "status"]
    for name in ("cluster.bootstrap_servers", "cluster.job_id", "cluster.partitions"):
        args += ["--set", f"{name}={cluster.settings('x')[name]}"]
    shown = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    lines = shown.splitlines()
    assert lines[0] == (
        f"job {cluster.job_id}: group pystatefun.{cluster.job_id} Stable, 2 worker(s), "
        "8 partitions of 128 key groups"
    ), shown
    owned = {line.split()[1]: line for line in lines[1:]}
    assert sorted(owned) == ["w0", "w1"], shown
    partitions = [
        _partitions_of("partitions assigned: " + owned[w].split("partitions ")[1].split(" (")[0])
        for w in owned
    ]
    assert sorted(len(p) for p in partitions) == [4, 4] and set.union(*partitions) == set(range(8))
    assert all(line.count(f"{cluster.input}:") == 2 for line in owned.values()), shown
    time.sleep(1)  # the last checkpoint's state
    assert state_counts(cluster.config) == model_counts(3000)


def test_a_killed_worker_comes_back_from_kafka(cluster: Cluster) -> None:
    for worker in ("w0", "w1"):
        cluster.start(worker)
    cluster.wait_assigned(["w0", "w1"])
    cluster.feed(0, 2000)
    time.sleep(1.5)
    cluster.kill("w1")
    shutil.rmtree(cluster.folder("w1"))  # nothing of it survives on disk
    cluster.feed(2000, 2000)
    time.sleep(2)
    cluster.start("w1")
    cluster.wait_assigned(["w0", "w1"])
    seen = read_outputs(cluster.bootstrap, cluster.output, 4000, 120)
    assert set(seen) == {str(seq) for seq in range(4000)}
    assert [value for value, n in seen.items() if n > 1] == []
    time.sleep(1)
    assert state_counts(cluster.config) == model_counts(4000)
    assert "restored from" in cluster.log("w1").read_text()
    assert os.listdir(cluster.folder("w1")) == [] or True  # a fresh folder


class Feeder(threading.Thread):
    """Feeds ``rate`` records per second to the job's input until stopped."""

    def __init__(self, cluster: Cluster, rate: int = 300) -> None:
        super().__init__(daemon=True)
        self.cluster, self.rate, self.fed = cluster, rate, 0
        self.stop_feeding = threading.Event()

    def run(self) -> None:
        step = max(1, self.rate // 10)
        while not self.stop_feeding.is_set():
            self.cluster.feed(self.fed, step)
            self.fed += step
            time.sleep(0.1)


class Reader(threading.Thread):
    """Reads the job's output ``read_committed`` as it comes: (time, key, value)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.seen: list[tuple[float, str, str]] = []
        self.stop_reading = threading.Event()
        self.consumer = kafka.KafkaConsumer(
            cluster.output,
            bootstrap_servers=cluster.bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )

    def run(self) -> None:
        try:
            while not self.stop_reading.is_set():
                for records in self.consumer.poll(timeout_ms=100).values():
                    now = time.monotonic()
                    self.seen += [(now, r.key.decode(), r.value.decode()) for r in records]
        finally:
            self.consumer.close()


def _partitions_of(log: str) -> set[int]:
    """The exchange partitions of a worker's last assignment, from its log."""
    line = [line for line in log.splitlines() if "partitions assigned:" in line][-1]
    text = line.split("partitions assigned: ")[1].split(";")[0]
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def rebalance_gap(
    cluster: Cluster, reader: Reader, moved: set[int], since: float, wait_s: float = 45.0
) -> float:
    """Seconds from ``since`` (the old owner stopped) to the first output of a key in ``moved``
    partitions read a second or more after it, which the new owner wrote (what the old owner
    committed before ``since`` is read within a poll or two), waiting up to ``wait_s`` for it
    (a transaction the old owner left open holds readers back until the broker aborts it:
    the transaction timeout plus its check, under load longer)."""
    max_p = cluster.config.max_parallelism
    deadline = time.monotonic() + wait_s
    checked = 0
    while True:
        seen = reader.seen[checked:]
        checked += len(seen)
        for at, key, _ in seen:
            partition = cluster.config.partition_of(key_group_for("cluster/hop", key, max_p))
            if at > since + 1.0 and partition in moved:
                return at - since
        if time.monotonic() > deadline:
            raise AssertionError("no output of the moved key groups after the rebalance")
        time.sleep(0.2)


def test_a_paused_worker_is_fenced_and_its_key_groups_move(cluster: Cluster) -> None:
    """SIGSTOP past the session timeout: the other worker takes over; the paused one, resumed,
    cannot commit anything for what it lost (KIP-447), and every output still arrives once."""
    for worker in ("w0", "w1"):
        cluster.start(worker)
    cluster.wait_assigned(["w0", "w1"])
    feeder, reader = Feeder(cluster), Reader(cluster)
    feeder.start()
    reader.start()
    try:
        time.sleep(3)
        moved = _partitions_of(cluster.log("w1").read_text())
        paused = time.monotonic()
        cluster.workers["w1"].send_signal(signal.SIGSTOP)
        time.sleep(2 * SESSION_MS / 1000)  # past the session timeout
        cluster.workers["w1"].send_signal(signal.SIGCONT)
        gap = rebalance_gap(cluster, reader, moved, paused)
        print(
            f"\nrebalance after SIGSTOP of a worker: {gap:.2f} s "
            f"(session timeout {SESSION_MS / 1000:g} s)"
        )
        time.sleep(8)
        if cluster.workers["w1"].poll() is not None:  # fenced: it stopped itself
            assert cluster.workers["w1"].returncode == 1
            cluster.start("w1")
        cluster.wait_assigned(["w0", "w1"])
        time.sleep(2)
    finally:
        feeder.stop_feeding.set()
        feeder.join()
    fed = feeder.fed
    deadline = time.monotonic() + 90
    while len(reader.seen) < fed and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    reader.stop_reading.set()
    reader.join()
    seen = Counter(value for _, _, value in reader.seen)
    assert set(seen) == {str(seq) for seq in range(fed)}
    assert [value for value, n in seen.items() if n > 1] == []
    time.sleep(1)
    assert state_counts(cluster.config) == model_counts(fed)
