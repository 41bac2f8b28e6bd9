"""The HTTP ingress of a clustered job, on a real broker, two ``statefun worker`` processes and
real HTTP on 127.0.0.1: each worker serves the ingress on its own port; requests sent to one
worker for addresses the other owns (and to the owner) take effect once, fire-and-forget
messages are acknowledged only once committed, and a call's reply reaches the worker holding
the connection. Idempotency keys answer a repeat on either worker with the first outcome, also
after the key's owner died. A worker SIGKILLed while requests stream in loses no acknowledged
message and duplicates no egress record. While a rebalance is held open (a member
SIGSTOPped), requests are answered 503 with Retry-After within the wait bound, and none of
those is in the egress."""

from __future__ import annotations

import signal
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
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

import pytest

from statefun._kafka import import_kafka
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics
from statefun.cluster._keys import KEY_TYPENAME, key_id
from tests._support import free_ports
from tests.integration.test_cluster_workers import (
    _assigned_last,
    _one_generation,
    _partitions_of,
    read_outputs,
    state_counts,
)
from tests.kafka_fixture import HEARTBEAT_MS, SESSION_MS

kafka = import_kafka()
pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
FNS = Path(__file__).parent / "fns" / "cluster_http_fns.py"
PARTITIONS = 8
WORKERS = ("w0", "w1")


class HttpCluster:
    """Workers of one job whose module has an HTTP ingress and a Kafka egress."""

    def __init__(
        self,
        tmp: Path,
        bootstrap: str,
        names: tuple[str, ...] = WORKERS,
        reply_timeout: str = "20s",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.bootstrap = bootstrap
        self.names = names
        self.extra = extra or {}
        self.job_id = f"chttp-{uuid.uuid4().hex[:8]}"
        self.output = f"{self.job_id}-out"
        self.port = free_ports(len(names))  # worker i serves port + i
        self.module = tmp / "module.yaml"
        self.module.write_text(
            "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: chttp/*\n"
            f"  module: {FNS}:functions\n---\n"
            "kind: io.pystatefun.http.v1/ingress\nspec:\n  id: chttp/http\n"
            f"  port: {self.port}\n  replyTimeout: {reply_timeout}\n---\n"
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
            "cluster.session_timeout_ms": str(SESSION_MS),
            "cluster.heartbeat_interval_ms": str(HEARTBEAT_MS),
            "cluster.port_offset": str(index),
            "checkpoint_interval_ms": "300",
            **self.extra,
        }

    def url(self, worker: str) -> str:
        return f"http://127.0.0.1:{self.port + self.names.index(worker)}"

    def log(self, worker: str) -> Path:
        return self.tmp / f"{worker}-{self.starts[worker]}.log"

    def start(self, worker: str) -> None:
        folder = self.tmp / worker
        folder.mkdir(exist_ok=True)
        self.starts[worker] += 1
        args = [sys.executable, "-m", "statefun", "worker", str(self.module)]
        for name, value in self.settings(worker, self.names.index(worker)).items():
            args += ["--set", f"{name}={value}"]
        with self.log(worker).open("wb") as err:
            self.workers[worker] = subprocess.Popen(
                args, cwd=folder, stdout=subprocess.DEVNULL, stderr=err
            )

    def wait_assigned(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while True:
            logs = {w: self.log(w).read_text(errors="replace") for w in self.workers}
            if _one_generation(logs.values()):
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
    except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException) as error:
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


def keyed_post(url: str, body: str, key: str) -> tuple[int, str, bool]:
    """(status, body, whether Idempotent-Replayed) of a text POST with an Idempotency-Key."""
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "text/plain", "Idempotency-Key": key}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, text, headers = error.code, error.read(), error.headers
    except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException) as error:
        return 0, str(error), False
    return status, text.decode().strip(), headers.get("Idempotent-Replayed") == "true"


def _key_owned_by(cluster: HttpCluster, worker: str, prefix: str) -> str:
    """An Idempotency-Key of the ingress whose key address ``worker`` owns."""
    return next(
        key
        for key in (f"{prefix}-{n}" for n in range(1000))
        if cluster.owner(KEY_TYPENAME, key_id("chttp/http", key)) == worker
    )


def test_idempotency_keys_answer_repeats_on_either_worker_and_after_the_owner_dies(
    cluster: HttpCluster,
) -> None:
    """A repeat on the other worker gets the first answer and runs nothing again; another body
    under the key is a 422; the key's owner SIGKILLed, a retry on the survivor is replayed from
    the changelog."""
    w0, w1 = (cluster.url(w) for w in WORKERS)
    call_key = _key_owned_by(cluster, "w1", "call")  # the key's worker is not the request's
    first = keyed_post(f"{w0}/call/chttp/call/i1", "x", call_key)
    assert first == (200, "i1:1:x", False)
    assert keyed_post(f"{w1}/call/chttp/call/i1", "x", call_key) == (200, "i1:1:x", True)
    assert keyed_post(f"{w0}/call/chttp/call/i1", "x", call_key) == (200, "i1:1:x", True)
    status, body, _ = keyed_post(f"{w1}/call/chttp/call/i1", "other", call_key)
    assert status == 422 and "was used for another request" in body

    message_key = _key_owned_by(cluster, "w0", "message")
    for url, replayed in ((w1, False), (w0, True), (w1, True)):
        sent = keyed_post(f"{url}/messages/chttp/record/m1", f"7:{cluster.output}", message_key)
        assert sent == (202, "accepted", replayed)
    assert keyed_post(f"{w1}/messages/chttp/record/m2", f"8:{cluster.output}", "fresh")[0] == 202
    seen = read_outputs(cluster.bootstrap, cluster.output, 2, 60)
    assert seen == Counter({"7": 1, "8": 1})  # the repeats sent nothing

    killed = cluster.workers.pop("w1")  # the call key's owner
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    answers = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # 503/504 while the group notices and rebalances
        answers.append(keyed_post(f"{w0}/call/chttp/call/i1", "x", call_key))
        if answers[-1][0] == 200:
            break
        time.sleep(0.5)
    assert answers[-1] == (200, "i1:1:x", True), answers
    assert {a[0] for a in answers} <= {200, 503, 504}, answers
    counts = state_counts(cluster.config)
    assert counts[("chttp/call", "i1")] == 1  # the function ran once
    print(f"\nretries on the survivor until the owner's successor answered: {len(answers)}")
    log = cluster.log("w0").read_text()
    assert "Traceback" not in log, log[-3000:]


@dataclass
class Answered:
    seq: int
    route: str
    status: int
    body: str
    retry_after: str | None
    took: float


def timed_post(url: str, body: str) -> tuple[int, str, str | None, float]:
    """(status, body, Retry-After, seconds) of a text POST; status 0: no answer."""
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "text/plain"}
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text, retry = response.status, response.read().decode(), None
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
        retry = error.headers.get("Retry-After")
    except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException) as error:
        status, text, retry = 0, str(error), None
    return status, text.strip(), retry, time.monotonic() - began


class Streamer(threading.Thread):
    """Streams requests of one route to one worker, remembering every answer."""

    def __init__(self, cluster: HttpCluster, worker: str, route: str, first: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.worker, self.route, self.next = cluster, worker, route, first
        self.answers: list[Answered] = []
        self.stop_sending = threading.Event()

    def run(self) -> None:
        base = self.cluster.url(self.worker)
        while not self.stop_sending.is_set():
            seq = self.next
            self.next += 1
            if self.route == "messages":
                url, body = (
                    f"{base}/messages/chttp/record/{seq % 37}",
                    f"{seq}:{self.cluster.output}",
                )
            else:
                url, body = f"{base}/call/chttp/call/{seq % 37}", str(seq)
            answered = Answered(seq, self.route, *timed_post(url, body))
            self.answers.append(answered)
            if answered.status not in (200, 202):
                time.sleep(0.05)  # (a worker away refuses connections at once)


def test_a_killed_worker_loses_no_acknowledged_message(cluster: HttpCluster) -> None:
    senders = [
        Streamer(cluster, worker, "messages", first + thread * 100_000)
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
    answers = [a for sender in senders for a in sender.answers]
    acked = [a.seq for a in answers if a.status == 202]
    assert len(acked) > 50 and any(seq >= 1_000_000 for seq in acked)
    wanted = {str(seq) for seq in acked}
    seen = read_outputs(cluster.bootstrap, cluster.output, len(acked), 90, wanted)
    assert [seq for seq in acked if str(seq) not in seen] == []  # none acknowledged is lost
    assert [value for value, n in seen.items() if n > 1] == []  # none twice
    print(
        f"\n{len(acked)} acknowledged of {len(answers)} sent; {len(seen)} in the egress; "
        f"failed: {Counter(a.status for a in answers if a.status != 202)}"
    )


def _assignments(cluster: HttpCluster, worker: str) -> int:
    return cluster.log(worker).read_text(errors="replace").count("partitions assigned:")


def test_requests_during_a_held_rebalance_are_refused_within_the_bound(
    tmp_path: Path, bootstrap: str
) -> None:
    """w1 is SIGSTOPped and w2 joins: the group's rebalance waits for w1 until its session
    times out, and w0 has no assignment meanwhile. Its requests are answered 503 with
    Retry-After within cluster_http_wait_ms (calls within replyTimeout); every 202 is in the
    egress once and no 503 is there at all."""
    wait_s, reply_s, session_s = 1.5, 4.0, 2 * SESSION_MS // 1000  # held past reply_s
    cluster = HttpCluster(
        tmp_path,
        bootstrap,
        names=("w0", "w1", "w2"),
        reply_timeout=f"{reply_s:g}s",
        extra={
            "cluster.http_wait_ms": str(int(wait_s * 1000)),
            "cluster.session_timeout_ms": str(session_s * 1000),
        },
    )
    streamers = [
        *(Streamer(cluster, "w0", "messages", n * 100_000) for n in range(3)),
        Streamer(cluster, "w0", "call", 900_000),
    ]
    try:
        for worker in ("w0", "w1"):
            cluster.start(worker)
        cluster.wait_assigned()
        for streamer in streamers:
            streamer.start()
        time.sleep(2)
        before = _assignments(cluster, "w0")
        cluster.workers["w1"].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        cluster.start("w2")  # a join: the rebalance waits for w1 until its session ends
        deadline = stopped_at + session_s + 60
        while _assignments(cluster, "w0") <= before or not _assigned_last(
            cluster.log("w0").read_text()
        ):
            assert time.monotonic() < deadline, cluster.log("w0").read_text()[-3000:]
            time.sleep(0.2)
        held = time.monotonic() - stopped_at
        time.sleep(2)
        for streamer in streamers:
            streamer.stop_sending.set()
        for streamer in streamers:
            streamer.join(reply_s + 30)
        acked = {str(a.seq) for st in streamers for a in st.answers if a.status == 202}
        seen = read_outputs(cluster.bootstrap, cluster.output, len(acked), 90, acked)
    finally:
        if "w1" in cluster.workers:
            cluster.workers["w1"].send_signal(signal.SIGCONT)
        cluster.close()
    answers = [a for streamer in streamers for a in streamer.answers]
    messages = [a for a in answers if a.route == "messages"]
    calls = [a for a in answers if a.route == "call"]
    by_status = Counter((a.route, a.status) for a in answers)
    refused = [a for a in messages if a.status == 503 and "had no assignment" in a.body]
    print(
        f"\nrebalance held {held:.1f} s; answers {dict(by_status)}; slowest /messages "
        f"{max(a.took for a in messages):.2f} s, /call {max(a.took for a in calls):.2f} s"
    )
    assert refused, by_status  # the bound was reached while the group rebalanced
    assert all(a.retry_after == "1" for a in answers if a.status == 503)
    assert all(wait_s <= a.took < wait_s + 1.5 for a in refused), [a.took for a in refused]
    # nothing waits long: the bound, then a commit (before: the whole rebalance)
    assert max(a.took for a in messages) < wait_s + 3.5
    assert {a.status for a in messages} <= {202, 503}, by_status
    assert {a.status for a in calls} <= {200, 503, 504}, by_status
    assert max(a.took for a in calls) < reply_s + 1.5
    assert sorted(acked - set(seen)) == []  # no 202 is lost
    assert [value for value, n in seen.items() if n > 1] == []  # none twice
    not_accepted = {str(a.seq) for a in messages if a.status == 503}
    assert sorted(not_accepted & set(seen)) == []  # a 503 was not sent
