"""The HTTP ingress of a clustered job, on a real broker, two ``statefun worker`` processes and
real HTTP on 127.0.0.1: each worker serves the ingress on its own port; requests sent to one
worker for addresses the other owns (and to the owner) take effect once, fire-and-forget
messages are acknowledged only once committed, and a call's reply reaches the worker holding
the connection. A worker SIGKILLed while requests stream in loses no acknowledged message and
duplicates no egress record."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from statefun._kafka import import_kafka
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics
from tests.integration.test_cluster_workers import (
    _assigned_last,
    _partitions_of,
    read_outputs,
    state_counts,
)

kafka = import_kafka()
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
FNS = Path(__file__).parent / "fns" / "cluster_http_fns.py"
PARTITIONS = 8
WORKERS = ("w0", "w1")


def _free_port_pair() -> int:
    """A port P with P and P + 1 free on 127.0.0.1 (worker i serves P + i)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port >= 65535:
            continue
        try:
            with socket.socket() as one, socket.socket() as two:
                one.bind(("127.0.0.1", port))
                two.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two consecutive free ports")


class HttpCluster:
    """Two workers of one job whose module has an HTTP ingress and a Kafka egress."""

    def __init__(self, tmp: Path, bootstrap: str) -> None:
        self.tmp = tmp
        self.bootstrap = bootstrap
        self.job_id = f"chttp-{uuid.uuid4().hex[:8]}"
        self.output = f"{self.job_id}-out"
        self.port = _free_port_pair()
        self.module = tmp / "module.yaml"
        self.module.write_text(
            "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: chttp/*\n"
            f"  module: {FNS}:functions\n---\n"
            "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: chttp/http\n"
            f"  port: {self.port}\n  replyTimeout: 20s\n---\n"
            "kind: io.statefun.kafka.v1/egress\nspec:\n  id: chttp/out\n"
            f"  address: {bootstrap}\n  deliverySemantic: exactly-once\n"
        )
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()
        config = cluster_config(Settings.load(self.settings("test", 0), environ={}))
        assert config is not None
        self.config: ClusterConfig = config
        ensure_topics(config)

    def settings(self, worker: str, index: int) -> dict[str, str]:
        return {
            "cluster.bootstrap_servers": self.bootstrap,
            "cluster.job_id": self.job_id,
            "cluster.worker_id": worker,
            "cluster.partitions": str(PARTITIONS),
            "cluster.session_timeout_ms": "6000",
            "cluster.heartbeat_interval_ms": "1000",
            "cluster.port_offset": str(index),
            "checkpoint_interval_ms": "300",
        }

    def url(self, worker: str) -> str:
        return f"http://127.0.0.1:{self.port + WORKERS.index(worker)}"

    def log(self, worker: str) -> Path:
        return self.tmp / f"{worker}-{self.starts[worker]}.log"

    def start(self, worker: str) -> None:
        folder = self.tmp / worker
        folder.mkdir(exist_ok=True)
        self.starts[worker] += 1
        args = [sys.executable, "-m", "statefun", "worker", str(self.module)]
        for name, value in self.settings(worker, WORKERS.index(worker)).items():
            args += ["--set", f"{name}={value}"]
        with self.log(worker).open("wb") as err:
            self.workers[worker] = subprocess.Popen(
                args, cwd=folder, stdout=subprocess.DEVNULL, stderr=err
            )

    def wait_assigned(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while True:
            logs = {w: self.log(w).read_text(errors="replace") for w in self.workers}
            if all(_assigned_last(text) for text in logs.values()):
                return
            for worker, process in self.workers.items():
                assert process.poll() is None, f"{worker} exited: {logs[worker][-2000:]}"
            assert time.monotonic() < deadline, f"no assignment: {logs}"
            time.sleep(0.2)

    def owner(self, typename: str, id_: str) -> str:
        """The worker whose last assignment holds the address's key group."""
        partition = self.config.partition_of(
            key_group_for(typename, id_, self.config.max_parallelism)
        )
        for worker in self.workers:
            if partition in _partitions_of(self.log(worker).read_text()):
                return worker
        raise AssertionError(f"no worker owns partition {partition}")

    def close(self) -> None:
        for process in self.workers.values():
            process.send_signal(signal.SIGKILL)
            process.wait(10)


@pytest.fixture
def cluster(tmp_path: Path, bootstrap: str) -> Iterator[HttpCluster]:
    made = HttpCluster(tmp_path, bootstrap)
    try:
        for worker in WORKERS:
            made.start(worker)
        made.wait_assigned()
        yield made
    finally:
        made.close()


def post(url: str, body: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a text POST; (0, reason) when the connection failed."""
    request = urllib.request.Request(
        url,
        data=body.encode(),
        headers={"Content-Type": "text/plain", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return 0, str(error)


def test_requests_to_either_worker_take_effect_once_and_replies_find_their_caller(
    cluster: HttpCluster,
) -> None:
    ids = [str(n) for n in range(40)]
    owners = {id_: cluster.owner("chttp/record", id_) for id_ in ids}
    assert set(owners.values()) == set(WORKERS)  # both own some of them
    other = {w: next(o for o in WORKERS if o != w) for w in WORKERS}
    # each message to the worker that does not own its address, every third to the owner
    sends = [(seq, ids[seq % len(ids)], owners[ids[seq % len(ids)]]) for seq in range(300)]
    targets = [(seq, id_, owner if seq % 3 == 0 else other[owner]) for seq, id_, owner in sends]

    took: dict[str, list[float]] = {"messages": [], "call": []}

    def timed(route: str, url: str, body: str) -> tuple[int, str]:
        began = time.monotonic()
        answer = post(url, body)
        took[route].append(time.monotonic() - began)
        return answer

    def send(item: tuple[int, str, str]) -> tuple[int, str]:
        seq, id_, worker = item
        url = f"{cluster.url(worker)}/messages/chttp/record/{id_}"
        return timed("messages", url, f"{seq}:{cluster.output}")

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, targets))
    assert [a for a in answers if a != (202, "accepted")] == []
    seen = read_outputs(cluster.bootstrap, cluster.output, 300, 60)
    assert seen == Counter({str(seq): 1 for seq in range(300)})

    # calls: the connection's worker gets the reply of the function on the owner
    call_owners = {id_: cluster.owner("chttp/call", id_) for id_ in ids}
    calls = [(id_, worker) for id_ in ids[:20] for worker in WORKERS]

    def ask(item: tuple[str, str]) -> tuple[str, str, tuple[int, str]]:
        id_, worker = item
        answer = timed("call", f"{cluster.url(worker)}/call/chttp/call/{id_}", f"from-{worker}")
        return id_, worker, answer

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, calls))
    # a reply is released only after the checkpoint holding its effects committed: the state
    # of every address called is in the changelog already
    states = {k[1]: n for k, n in state_counts(cluster.config).items() if k[0] == "chttp/call"}
    assert states == dict.fromkeys(ids[:20], 2)
    failed = [(i, w, call_owners[i], b) for i, w, (status, b) in replies if status != 200]
    assert failed == []  # (id, connection's worker, function's worker, why)
    for id_, worker, (_, body) in replies:
        got_id, count, text = body.split(":")
        assert (got_id, text) == (id_, f"from-{worker}")
        assert count in ("1", "2")
    for id_ in ids[:20]:  # the function ran once per call: counts 1 and 2
        counts = sorted(b.split(":")[1] for i, _, (_, b) in replies if i == id_)
        assert counts == ["1", "2"], id_
    for route, times in took.items():
        times.sort()
        p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
        print(
            f"\n/{route}: {len(times)} requests, p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
        )
    crossed = sum(1 for id_, worker in calls if call_owners[id_] != worker)
    assert crossed >= 10  # replies that came through the replies topic
    logs = {w: cluster.log(w).read_text() for w in WORKERS}
    assert all("Traceback" not in text for text in logs.values()), logs

    status, body = post(
        f"{cluster.url('w0')}/messages/chttp/record/1",
        f"x:{cluster.output}",
        {"Idempotency-Key": "k1"},
    )
    assert status == 501 and "Idempotency-Key is not supported" in body


class Sender(threading.Thread):
    """Streams fire-and-forget messages to one worker; remembers which were acknowledged."""

    def __init__(self, cluster: HttpCluster, worker: str, first: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.worker, self.next = cluster, worker, first
        self.acked: list[int] = []
        self.failed: list[tuple[int, int, str]] = []
        self.stop_sending = threading.Event()

    def run(self) -> None:
        url = self.cluster.url(self.worker)
        while not self.stop_sending.is_set():
            seq = self.next
            self.next += 1
            status, body = post(
                f"{url}/messages/chttp/record/{seq % 37}", f"{seq}:{self.cluster.output}"
            )
            if status == 202:
                self.acked.append(seq)
            else:
                self.failed.append((seq, status, body[:200]))
                time.sleep(0.05)


def test_a_killed_worker_loses_no_acknowledged_message(cluster: HttpCluster) -> None:
    senders = [
        Sender(cluster, worker, first + thread * 100_000)
        for worker, first in (("w0", 0), ("w1", 1_000_000))
        for thread in range(3)
    ]
    for sender in senders:
        sender.start()
    time.sleep(3)
    killed = cluster.workers.pop("w1")
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    time.sleep(2)
    cluster.start("w1")
    cluster.wait_assigned()
    time.sleep(3)
    for sender in senders:
        sender.stop_sending.set()
        sender.join(40)
    acked = [seq for sender in senders for seq in sender.acked]
    sent = sum(len(sender.acked) + len(sender.failed) for sender in senders)
    assert len(acked) > 50 and any(seq >= 1_000_000 for seq in acked)
    wanted = {str(seq) for seq in acked}
    seen = read_outputs(cluster.bootstrap, cluster.output, len(acked), 90, wanted)
    assert [seq for seq in acked if str(seq) not in seen] == []  # none acknowledged is lost
    assert [value for value, n in seen.items() if n > 1] == []  # none twice
    print(
        f"\n{len(acked)} acknowledged of {sent} sent; {len(seen)} in the egress; "
        f"failed: {Counter(status for s in senders for _, status, _ in s.failed)}"
    )
