"""Processes and Kafka plumbing shared by tests/jvm and bench/statefun_jvm_vs_pystatefun.py.

Runs, as separate processes on 127.0.0.1:

* ``python -m statefun serve TARGET`` (remote functions; :func:`start_serve`);
* ``python -m statefun run module.yaml`` (this runtime; :func:`start_pystatefun`), ready when
  its admin server answers ``/status``;
* ``bench/peers/statefun-jvm/run.sh module.yaml`` (Apache StateFun 3.3.0 on Flink 1.16.2;
  :func:`start_statefun_jvm`), ready when Flink's REST API reports the job RUNNING.

and a few kafka-python helpers: create topics, end offsets, a read_committed reader from given
offsets. Every process writes its output to a log file; :class:`Proc` stops it with SIGTERM
(then SIGKILL) and can show the log's tail in an error message.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import free_port

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

ROOT = Path(__file__).resolve().parent.parent
PEER_DIR = ROOT / "bench" / "peers" / "statefun-jvm"
RUN_SH = PEER_DIR / "run.sh"
STATEFUN = [sys.executable, "-m", "statefun"]
HOST = "127.0.0.1"


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read() or b"null")


def missing_jvm_tools() -> str | None:
    """Why the StateFun JVM peer cannot run here (None: java and mvn are on PATH)."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not on PATH: the StateFun JVM runtime needs Java 17 + Maven"
        )
    return None


def java_version() -> str:
    """``java -version``'s first line, as run.sh's JVM reports it."""
    java = Path("/usr/lib/jvm/java-17-openjdk-amd64/bin/java")
    binary = str(java) if java.exists() else (shutil.which("java") or "java")
    done = subprocess.run([binary, "-version"], capture_output=True, text=True, check=False)
    lines = (done.stderr or done.stdout).splitlines()
    return lines[1].strip() if len(lines) > 1 else (lines[0] if lines else "?")


@dataclass
class Proc:
    """A child process in its own session, its output in ``log``."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False

    @classmethod
    def start(
        cls, name: str, command: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                list(command),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        return cls(name, process, log)

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def failure(self, what: str) -> RuntimeError:
        code = self.process.poll()
        state = "running" if code is None else f"exited with {code}"
        return RuntimeError(f"{self.name} ({state}): {what}\n--- end of {self.log}:\n{self.tail()}")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.stopped = True
        return self.process.returncode


def wait_until(
    proc: Proc, ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not proc.alive():
            raise proc.failure(f"exited while waiting for {what}")
        try:
            if ready():
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise proc.failure(f"not {what} after {timeout:.0f} s")
        time.sleep(interval)


def start_serve(target: str, port: int, log: Path, timeout: float = 30.0) -> Proc:
    """``statefun serve TARGET --port PORT``; returns once /health answers."""
    proc = Proc.start(
        f"statefun serve {target}",
        [*STATEFUN, "--log-level", "warning", "serve", target, "--port", str(port)],
        log,
    )

    def up() -> bool:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2):
            return True

    wait_until(proc, up, timeout, "up")
    return proc


def start_pystatefun(
    module: Path,
    log: Path,
    *,
    settings: Mapping[str, object] | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> tuple[Proc, int]:
    """``statefun run MODULE`` with an admin port (and ``env`` added to the environment);
    returns once ``/status`` answers."""
    admin_port = free_port()
    sets: list[str] = []
    for key, value in {**(settings or {}), "admin_port": admin_port}.items():
        sets += ["--set", f"{key}={value}"]
    proc = Proc.start("statefun run", [*STATEFUN, "run", str(module), *sets], log, env=env)
    wait_until(proc, lambda: bool(pystatefun_status(admin_port) is not None), timeout, "ready")
    return proc, admin_port


def pystatefun_status(admin_port: int) -> Any:
    return _get_json(f"http://{HOST}:{admin_port}/status")


def pystatefun_checkpoints(admin_port: int) -> int:
    checkpoints = pystatefun_status(admin_port).get("checkpoints") or {}
    return int(checkpoints.get("completed") or 0)


@dataclass
class JvmPeer:
    proc: Proc
    rest_port: int
    job_id: str = ""

    def rest(self, path: str) -> Any:
        return _get_json(f"http://{HOST}:{self.rest_port}{path}")

    def running_job(self) -> str:
        for job in self.rest("/jobs/overview").get("jobs", []):
            if job.get("state") == "RUNNING":
                return str(job["jid"])
        return ""

    def checkpoints(self) -> int:
        """Completed checkpoints of the running job."""
        counts = self.rest(f"/jobs/{self.job_id}/checkpoints").get("counts", {})
        return int(counts.get("completed", 0))

    def failures(self) -> list[str]:
        """The job's failures so far (Flink restarts the job after each), newest first."""
        history = self.rest(f"/jobs/{self.job_id}/exceptions").get("exceptionHistory") or {}
        return [str(e.get("exceptionName", "?")) for e in history.get("entries", [])]


def start_statefun_jvm(
    module: Path,
    log: Path,
    *,
    heap: str = "512m",
    checkpoint_ms: int = 1000,
    conf: Iterable[str] = (),
    timeout: float = 240.0,
) -> JvmPeer:
    """run.sh MODULE; returns once the job is RUNNING (builds with Maven first if needed)."""
    rest_port = free_port()
    env = {
        "STATEFUN_CHECKPOINT_DIR": str(log.parent / "statefun-jvm-checkpoints"),
        "STATEFUN_HEAP": heap,
        "STATEFUN_REST_PORT": str(rest_port),
        "STATEFUN_CHECKPOINT_MS": str(checkpoint_ms),
        "STATEFUN_LOG_LEVEL": os.environ.get("STATEFUN_LOG_LEVEL", "WARN"),
    }
    proc = Proc.start("StateFun JVM", [str(RUN_SH), str(module), *conf], log, env=env)
    peer = JvmPeer(proc, rest_port)

    def running() -> bool:
        peer.job_id = peer.running_job()
        return bool(peer.job_id)

    wait_until(proc, running, timeout, "RUNNING", interval=0.25)
    return peer


def wait_checkpoints(
    proc: Proc, completed: Callable[[], int], at_least: int, timeout: float
) -> None:
    wait_until(proc, lambda: completed() >= at_least, timeout, f"{at_least} checkpoint(s) done")


# -- Kafka ---------------------------------------------------------------------------------------


def create_topics(bootstrap: str, names: Iterable[str], partitions: int = 1) -> None:
    """Create the topics that do not exist yet."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        wanted = [n for n in names if n not in existing]
        if wanted:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in wanted]
                )
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> end offset (the high watermark) of every partition of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: int(o) for tp, o in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def producer(bootstrap: str, **config: Any) -> Any:
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", **config)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[str, bytes]]) -> None:
    out = producer(bootstrap)
    try:
        for key, value in records:
            out.send(topic, key=key.encode(), value=value)
        out.flush(timeout=30)
    finally:
        out.close()


@dataclass
class Received:
    key: str | None
    value: bytes
    at: float  # time.time() when this reader got it


@dataclass
class Reader:
    """Reads ``topics`` with isolation.level=read_committed from the given start offsets
    (default: their current ends) on a thread, keeping every record and its arrival time."""

    bootstrap: str
    topics: Sequence[str]
    starts: Mapping[str, Mapping[int, int]] | None = None
    records: dict[str, list[Received]] = field(default_factory=dict)
    on_record: Callable[[str, Received], None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Reader:
        self.records = {t: [] for t in self.topics}
        # It keeps every record, so collections walk a growing old generation: with the default
        # thresholds the reader took 40% of a core at 60k records/s, with these 22% (per-process
        # CPU during a hot-key backlog) - CPU the measured runtime needs.
        gc.set_threshold(100_000, 50, 1_000)
        self._thread = threading.Thread(target=self._run, name="egress-reader", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the egress reader did not start")
        self._raise()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"egress reader failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                isolation_level="read_committed",
                enable_auto_commit=False,
                fetch_max_wait_ms=20,
                max_poll_records=5000,
            )
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()
            return
        # The reader shares the 2 cores with the runtime it measures: with kafka-python's own
        # batch reader it took 56% of a core at 60k records/s, with the ingress's lean one 40%.
        from statefun.ingress._kafka_fetch import install

        install(consumer)
        try:
            assigned = []
            for topic in self.topics:
                parts = consumer.partitions_for_topic(topic) or set()
                assigned += [TopicPartition(topic, p) for p in parts]
            consumer.assign(assigned)
            if self.starts is None:
                ends = consumer.end_offsets(assigned)
                for tp in assigned:
                    consumer.seek(tp, ends[tp])
            else:
                for tp in assigned:
                    consumer.seek(tp, self.starts.get(tp.topic, {}).get(tp.partition, 0))
            for tp in assigned:
                consumer.position(tp)
            self._ready.set()
            while not self._stop.is_set():
                for tp, batch in consumer.poll(timeout_ms=50).items():
                    now = time.time()
                    got = [
                        Received(None if r.key is None else r.key.decode(), r.value, now)
                        for r in batch
                    ]
                    with self.lock:
                        self.records[tp.topic] += got
                    if self.on_record is not None:
                        for record in got:
                            self.on_record(tp.topic, record)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
        finally:
            consumer.close()

    def count(self, topic: str) -> int:
        with self.lock:
            return len(self.records[topic])

    def wait_for(
        self,
        done: Callable[[Reader], bool],
        timeout: float,
        what: str,
        watch: Proc | None = None,
        failures: Callable[[], list[str]] | None = None,
    ) -> None:
        """Wait until ``done(self)``; fail early if ``watch`` exits or ``failures()`` (checked
        every second) reports any."""
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + 1.0
        while not done(self):
            self._raise()
            if watch is not None and not watch.alive():
                raise watch.failure(f"exited while waiting for {what}")
            if failures is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                failed = failures()
                if failed:
                    message = f"failed {len(failed)}x while waiting for {what}: {failed[:3]}"
                    raise watch.failure(message) if watch else RuntimeError(message)
            if time.monotonic() > deadline:
                seen = {t: [(r.key, r.value) for r in rs] for t, rs in self.snapshot().items()}
                message = f"timed out after {timeout:.0f} s waiting for {what}; read: {seen}"
                if watch is not None:
                    raise watch.failure(message)
                raise TimeoutError(message)
            time.sleep(0.05)

    def snapshot(self) -> dict[str, list[Received]]:
        with self.lock:
            return {t: list(rs) for t, rs in self.records.items()}
