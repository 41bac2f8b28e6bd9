"""Idempotency keys through savepoints, on a real broker and real HTTP: keys answered by a
single-process job answer the same after its savepoint seeds a clustered job, and keys of the
clustered job answer the same after its savepoint (``statefun savepoint create --cluster``)
starts a single-process job again; none of the repeats runs a function again."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.test_cluster_http import HttpCluster, keyed_post
from tests.integration.test_cluster_savepoints import _single_process, _stop, _wait_members
from tests.integration.test_cluster_workers import read_outputs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
STATEFUN = [sys.executable, "-m", "statefun"]


def _savepoint(port: int) -> Path:
    made = subprocess.run(
        [*STATEFUN, "savepoint", "create", "--admin-url", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(made.stdout.strip())


def _until_answered(url: str, body: str, key: str) -> tuple[int, str, bool]:
    """The answer to a keyed request, sent again while the job is not ready (503/0)."""
    deadline = time.monotonic() + 60
    while True:
        answer = keyed_post(url, body, key)
        if answer[0] not in (0, 503) or time.monotonic() > deadline:
            return answer
        time.sleep(0.3)


def test_keys_answer_the_same_from_one_process_to_a_cluster_and_back(
    tmp_path: Path, bootstrap: str
) -> None:
    cluster = HttpCluster(tmp_path, bootstrap, names=("w0",))
    url = cluster.url("w0")  # (one process and the clustered worker serve the same port)
    record = f"{url}/messages/chttp/record/m1"
    # 1. one process answers three keys; the first two reach its key log (checkpoints complete)
    single, log, port = _single_process(cluster, tmp_path / "one")  # type: ignore[arg-type]
    try:
        assert _until_answered(f"{url}/call/chttp/call/i1", "x", "k1") == (200, "i1:1:x", False)
        assert keyed_post(record, f"7:{cluster.output}", "k2") == (202, "accepted", False)
        time.sleep(1.5)
        assert keyed_post(f"{url}/call/chttp/call/i2", "y", "k3") == (200, "i2:1:y", False)
        first = _savepoint(port)
    finally:
        _stop(single, log)
    assert read_outputs(bootstrap, cluster.output, 1, 60) == Counter({"7": 1})

    # 2. a clustered job seeded from it answers them the same, and runs nothing again
    args = [*STATEFUN, "worker", str(cluster.module), "--from-savepoint", str(first)]
    args += [f"--set={n}={v}" for n, v in cluster.settings("w0", 0).items()]
    worker_log = tmp_path / "worker.log"
    with worker_log.open("wb") as err:
        worker = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_members(cluster.config, 1)
        assert _until_answered(f"{url}/call/chttp/call/i1", "x", "k1") == (200, "i1:1:x", True)
        assert keyed_post(record, f"7:{cluster.output}", "k2") == (202, "accepted", True)
        assert keyed_post(f"{url}/call/chttp/call/i2", "y", "k3") == (200, "i2:1:y", True)
        status, body, _ = keyed_post(f"{url}/call/chttp/call/i1", "other", "k1")
        assert status == 422 and "was used for another request" in body
        assert keyed_post(f"{url}/call/chttp/call/i1", "z", "k4") == (200, "i1:2:z", False)
    finally:
        _stop(worker, worker_log)
    text = worker_log.read_text()
    assert "3 idempotency key(s)" in text, text[-3000:]

    # 3. its savepoint starts one process again: the keys of both answer the same
    made = subprocess.run(
        [*STATEFUN, "savepoint", "create", "--cluster", str(cluster.module), "--dir"]
        + [str(tmp_path / "out")]
        + [f"--set={n}={v}" for n, v in cluster.settings("export", 0).items()],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    second = Path(made.stdout.strip())
    again, log, _ = _single_process(  # type: ignore[arg-type]
        cluster,  # type: ignore[arg-type]
        tmp_path / "again",
        "--from-savepoint",
        str(second),
    )
    try:
        assert _until_answered(f"{url}/call/chttp/call/i1", "z", "k4") == (200, "i1:2:z", True)
        assert keyed_post(f"{url}/call/chttp/call/i1", "x", "k1") == (200, "i1:1:x", True)
        assert keyed_post(record, f"7:{cluster.output}", "k2") == (202, "accepted", True)
        assert keyed_post(f"{url}/call/chttp/call/i1", "w", "k5") == (200, "i1:3:w", False)
    finally:
        _stop(again, log)
    assert read_outputs(bootstrap, cluster.output, 1, 30) == Counter({"7": 1})
