"""Savepoints into and out of a clustered job, on a real broker.

Round trip: a single-process job (Kafka ingress -> messages hopping between addresses ->
exactly-once Kafka egress) takes a savepoint and is killed; ``statefun run --workers 2
--from-savepoint`` continues it clustered, state intact; the stopped clustered job's savepoint
(``statefun savepoint create --cluster``) continues in one process again. Every output of the
three runs arrives once (``read_committed``) and the state equals the model at each hand-over.
And the seeding itself: several seeders at once seed once; a job with other state is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from statefun._exceptions import ConfigurationError
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import cluster_config, ensure_topics
from statefun.cluster._changelog import read_changelog, restore_partitions
from statefun.cluster._config import ClusterConfig
from statefun.cluster._exchange import WorkerTransactions, exchange_row
from statefun.cluster._savepoint_export import write_savepoint
from statefun.cluster._savepoints import (
    SavepointContents,
    read_savepoint,
    seed_changelog,
    seed_from_savepoint,
)
from statefun.cluster._status import group_ownership
from statefun.module import load_module
from statefun.module._specs import (
    FunctionTarget,
    HttpEndpointSpec,
    KafkaEgressSpec,
    ModuleSpec,
)
from statefun.runtime._envelope import Envelope
from statefun.sdk import IntType
from statefun.sdk._types import TypedValue
from statefun.state.memory import MemoryStateBackend
from tests._support import free_port
from tests.integration.test_cluster_workers import Cluster, model_counts, read_outputs, state_counts

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
STATEFUN = [sys.executable, "-m", "statefun"]


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)


def _single_process(cluster: Cluster, folder: Path, *extra: str) -> tuple[Any, Path, int]:
    """``statefun run`` of the job in one process, with an admin port."""
    folder.mkdir()
    port = free_port()
    args = [*STATEFUN, "run", str(cluster.module), "--quiet", *extra]
    for name, value in {
        "checkpoint_dir": str(folder / "checkpoints"),
        "savepoint_dir": str(folder / "savepoints"),
        "admin_port": str(port),
    }.items():
        args += ["--set", f"{name}={value}"]
    log = folder / "run.log"
    with log.open("wb") as err:
        process = subprocess.Popen(args, cwd=folder, stdout=subprocess.DEVNULL, stderr=err)
    _wait_http(f"http://127.0.0.1:{port}/status", process, log)
    return process, log, port


def _feed_slowly(cluster: Cluster, first: int, count: int) -> None:
    for start in range(first, first + count, 50):
        cluster.feed(start, 50)
        time.sleep(0.03)


def _savepoint_state(path: Path) -> dict[tuple[str, str], int]:
    metadata = json.loads((path / "_metadata").read_text())
    state = MemoryStateBackend()
    state.restore(path / "state", metadata["state"], None)
    return {
        key: int(IntType.serializer().deserialize(values["count"].value))
        for kg in state.key_groups()
        for key, values in state.items(kg)
    }


def _stop(process: subprocess.Popen[bytes], log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, log.read_text()[-3000:]


def _wait_members(config: ClusterConfig, count: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        _, owners = group_ownership(config)
        if len(owners) == count and all(o.partitions for o in owners):
            return
        assert time.monotonic() < deadline, f"members: {owners}"
        time.sleep(0.3)


def test_savepoint_round_trip_through_a_clustered_job(tmp_path: Path, bootstrap: str) -> None:
    cluster = Cluster(tmp_path, bootstrap)
    module = load_module(cluster.module)
    cluster_settings = Settings.load(cluster.settings("again"), environ={})
    # 1. one process; no periodic checkpoint, so the savepoint is the only commit of output
    single, log, port = _single_process(
        cluster,
        tmp_path / "one",
        "--set",
        "checkpoint_interval_ms=600000",
        "--set",
        "idle_checkpoint_delay_ms=0",
    )
    # the savepoint's cut while records still come in: messages in flight, positions midway
    feeding = threading.Thread(target=_feed_slowly, args=(cluster, 0, 1500))
    feeding.start()
    time.sleep(1.0)
    made = subprocess.run(
        [*STATEFUN, "savepoint", "create", "--admin-url", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    single.send_signal(signal.SIGKILL)  # nothing after the savepoint reaches Kafka
    single.wait(10)
    feeding.join()
    first = Path(made.stdout.strip())
    metadata = json.loads((first / "_metadata").read_text())
    print(f"savepoint: {metadata['messages']} message(s) in flight at its cut")

    # 2. clustered, two workers, seeded from it by the supervisor
    args = [*STATEFUN, "run", str(cluster.module), "--workers", "2", "--from-savepoint"]
    args.append(str(first))
    for name, value in cluster.settings("node").items():
        args += ["--set", f"{name}={value}"]
    log = tmp_path / "supervisor.log"
    with log.open("wb") as err:
        supervisor = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_members(cluster.config, 2)
        cluster.feed(1500, 1000)
        seen = read_outputs(cluster.bootstrap, cluster.output, 2500, 120)
        assert set(seen) == {str(seq) for seq in range(2500)}
        assert [value for value, n in seen.items() if n > 1] == []
        # no savepoint of a running clustered job: it would not be one cut
        with pytest.raises(ConfigurationError, match=r"has 2 running worker\(s\)"):
            write_savepoint(module, cluster_settings, cluster.config, tmp_path / "early")
    finally:
        _stop(supervisor, log)
    assert "seeded from" in log.read_text()
    assert state_counts(cluster.config) == model_counts(2500)
    # a worker started with the same savepoint does not seed again: it goes on from the state
    args = [*STATEFUN, "worker", str(cluster.module), "--from-savepoint", str(first)]
    args += [f"--set={n}={v}" for n, v in cluster.settings("again").items()]
    log = tmp_path / "again.log"
    with log.open("wb") as err:
        worker = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_members(cluster.config, 1)
    finally:
        _stop(worker, log)
    assert "was seeded from this savepoint before" in log.read_text()
    assert state_counts(cluster.config) == model_counts(2500)

    # 3. the stopped clustered job's savepoint, into one process again
    made = subprocess.run(
        [*STATEFUN, "savepoint", "create", "--cluster", str(cluster.module), "--dir"]
        + [str(tmp_path / "out")]
        + [f"--set={n}={v}" for n, v in cluster.settings("export").items()],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    second = Path(made.stdout.strip())
    exported = json.loads((second / "_metadata").read_text())
    print(f"clustered savepoint: {exported['messages']} message(s) in flight")
    assert second.parent == tmp_path / "out" and second.name.startswith("sp-")
    assert _savepoint_state(second) == model_counts(2500)
    # a job with state of its own is refused another savepoint
    with pytest.raises(ConfigurationError, match=r"has state already \(from the savepoint"):
        seed_from_savepoint(module, cluster_settings, cluster.config, second)
    single, log, _ = _single_process(cluster, tmp_path / "again", "--from-savepoint", str(second))
    try:
        cluster.feed(2500, 500)
        seen = read_outputs(cluster.bootstrap, cluster.output, 3000, 120)
        assert set(seen) == {str(seq) for seq in range(3000)}
        assert [value for value, n in seen.items() if n > 1] == []
    finally:
        _stop(single, log)


def _new_job(bootstrap: str, name: str, partitions: int) -> tuple[Settings, ClusterConfig]:
    """A clustered job's settings and config, its topics made."""
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": bootstrap,
            "cluster.job_id": f"{name}-{uuid.uuid4().hex[:8]}",
            "cluster.partitions": str(partitions),
            "max_parallelism": str(2 * partitions),
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    ensure_topics(config)
    return settings, config


def test_seeders_at_once_seed_once(tmp_path: Path, bootstrap: str) -> None:
    settings, config = _new_job(bootstrap, "seed", 4)
    value = {"n": TypedValue("io.statefun.types/int", bytes([8, 5]))}
    contents = SavepointContents(
        Path("sp"),
        state=[(kg, ("example/counter", f"k{kg}"), value) for kg in range(8)],
        identity={"id": 7, "created_ms": 1, "metadata_crc32c": 2, "path": "sp"},
    )
    # the savepoint's egress transaction had not reached Kafka: the seed commits it, once
    out = f"{config.job_id}-out"
    egress = KafkaEgressSpec("test/out", bootstrap, "exactly-once")
    module = ModuleSpec(egresses=(egress,))
    contents.sinks = {
        "test/out": {
            "format": 2,
            "transactions": [[3, uuid.uuid4().hex, [[out, "k", b"from the savepoint", None]]]],
        }
    }
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        seeds = [pool.submit(seed_changelog, config, module, contents) for _ in range(4)]
        outcomes = [seed.result() for seed in seeds]
    assert sorted(outcomes) == [False, False, False, True]
    assert read_outputs(bootstrap, out, 1, 20) == {"from the savepoint": 1}
    _, records = read_changelog(config, range(config.partitions))
    assert records == 1 + 8 + config.partitions  # one seed record, 8 addresses, 4 cuts
    restored = restore_partitions(config, range(config.partitions))
    assert sorted(key for _, key, _ in restored.state) == sorted(
        ("example/counter", f"k{kg}") for kg in range(8)
    )
    # a message one worker sent another that the owner had not read: in the savepoint's flight
    sent = Envelope(
        "example/counter", "k3", TypedValue("io.statefun.types/int", bytes([8, 9])), None
    )
    key_group = key_group_for(sent.typename, sent.id, config.max_parallelism)

    async def send() -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            tx.write_rows([exchange_row(config, key_group, sent)])
            assert tx.seal(1, {}, None)
            await tx.commit(1)
        finally:
            await tx.close()

    asyncio.run(send())
    path = write_savepoint(ModuleSpec(), settings, config, tmp_path)
    remote = HttpEndpointSpec(FunctionTarget("example", None), "http://127.0.0.1:1/{function.name}")
    exported = read_savepoint(path, ModuleSpec(endpoints=(remote,)), settings)
    assert [(m.id, m.value.value) for m in exported.messages] == [("k3", bytes([8, 9]))]
    assert sorted(key for _, key, _ in exported.state) == sorted(
        ("example/counter", f"k{kg}") for kg in range(8)
    )

    other = SavepointContents(Path("other"), identity={"id": 8, "path": "other"})
    with pytest.raises(ConfigurationError, match=r"has state already \(from the savepoint sp\)"):
        seed_changelog(config, ModuleSpec(), other)


def test_a_fenced_seeders_commit_fails_and_leaves_no_seed(bootstrap: str) -> None:
    """A seeder fenced by another before its commit: the commit fails, and no seed is left."""
    import kafka

    from statefun.cluster._config import PREFIX
    from statefun.cluster._savepoints import _commit_seed, seeded_from

    _, config = _new_job(bootstrap, "fenced", 2)
    contents = SavepointContents(Path("sp"), identity={"id": 1, "path": "sp"})

    def seeder() -> Any:
        return kafka.KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"{PREFIX}.{config.job_id}.seed"
        )

    fenced, successor = seeder(), seeder()
    try:
        fenced.init_transactions()
        successor.init_transactions()
        with pytest.raises(kafka.errors.KafkaError):
            _commit_seed(config, ModuleSpec(), contents, fenced)
    finally:
        fenced.close(timeout=5)
        successor.close(timeout=5)
    assert seeded_from(config) is None
