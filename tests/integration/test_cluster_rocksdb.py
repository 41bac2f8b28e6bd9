"""Two ``statefun worker`` processes with ``state_backend=rocksdb`` on a real broker: every
output once and the state (in the changelog, and as each worker's admin port reads it from its
RocksDB copy) equal to the model; a worker SIGKILLed and restarted with its folder reads only
what the changelog gained since its marks; a copy whose marks are past the partition's end or
too old, a copy of another job and a deleted folder are wiped and read whole."""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

pytest.importorskip("rocksdict")

from statefun._keygroups import key_group_for
from statefun.cluster._changelog import read_changelog
from statefun.cluster._local_state import (
    HEADER_KEY,
    Mark,
    TrackedRocksDBState,
    copy_path,
    header_of,
    mark_key,
)
from statefun.sdk import IntType, TypedValue
from tests.integration.test_cluster_admin import AdminCluster
from tests.integration.test_cluster_workers import (
    ADDRESSES,
    _partitions_of,
    model_counts,
    read_outputs,
    state_counts,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
GHOST = 10**6


class RocksCluster(AdminCluster):
    """Workers keeping their state in RocksDB, under their folder's ``.statefun/state``."""

    def settings(self, worker: str) -> dict[str, str]:
        return {**super().settings(worker), "state_backend": "rocksdb"}

    def copy(self, worker: str) -> TrackedRocksDBState:
        """The worker's copy, opened here (the worker must not be running)."""
        config = dataclasses.replace(self.config, worker_id=worker)
        path = copy_path(str(self.folder(worker) / ".statefun" / "state"), config)
        assert (path / "db").is_dir(), path
        return TrackedRocksDBState(path, config)

    def settled(self, seconds: float = 60) -> dict[str, set[int]]:
        """Each worker's partitions, once the two own disjoint halves of all eight."""
        deadline = time.monotonic() + seconds
        while True:
            self.wait_assigned(["w0", "w1"], seconds)
            owned = {w: _owned(self.log(w).read_text()) for w in ("w0", "w1")}
            if owned["w0"] | owned["w1"] == set(range(8)) and not owned["w0"] & owned["w1"]:
                return owned
            assert time.monotonic() < deadline, owned
            time.sleep(0.3)

    def wait_owner_of_all(self, worker: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while _owned(self.log(worker).read_text()) != set(range(8)):
            assert time.monotonic() < deadline, "the other worker never took over"
            time.sleep(0.3)

    def copy_lines(self, worker: str) -> list[str]:
        return [
            line
            for line in self.log(worker).read_text(errors="replace").splitlines()
            if "local copy" in line
        ]

    def check(self, fed: int, owned: dict[str, set[int]]) -> None:
        """Every output once; the changelog's state and each owner's RocksDB copy (read on
        its admin port) equal the model."""
        seen = read_outputs(self.bootstrap, self.output, fed, 120)
        assert set(seen) == {str(seq) for seq in range(fed)}
        assert [value for value, n in seen.items() if n > 1] == []
        model = model_counts(fed)
        time.sleep(1)  # the last checkpoint's state
        assert state_counts(self.config) == model
        for id_ in map(str, range(ADDRESSES)):
            status, found = self.state(self.owner(owned, id_), id_)
            assert status == 200, (id_, found)
            assert found["values"]["count"]["value"] == model[("cluster/hop", id_)], id_

    def state(
        self, worker: str, id_: str, follow: bool = True, seconds: float = 60
    ) -> tuple[int, Any]:
        """(status, body) of ``cluster/hop/<id_>``'s state on ``worker``'s admin port, asked
        again while its key groups are being reassigned (503); ``follow``: of the owner a 421
        names (else the 421 is the answer)."""
        deadline = time.monotonic() + seconds
        while True:
            status, found, _ = self.get(worker, f"/state/cluster/hop/{id_}")
            if status not in (421, 503) or time.monotonic() > deadline:
                return status, found
            if status == 421:
                if not follow:
                    return status, found
                worker = found["owner"]
            else:
                time.sleep(0.2)

    def owner(self, owned: dict[str, set[int]], id_: str) -> str:
        partition = self.config.partition_of(key_group_for("cluster/hop", id_, 128))
        return next(w for w, partitions in owned.items() if partition in partitions)


@pytest.fixture
def cluster(tmp_path: Path, bootstrap: str) -> Iterator[RocksCluster]:
    made = RocksCluster(tmp_path, bootstrap)
    try:
        yield made
    finally:
        made.close()


def _owned(log: str) -> set[int]:
    """The partitions of the worker's last assignment (none between two)."""
    try:
        return _partitions_of(log)
    except (ValueError, IndexError):
        return set()


def _ghost(cluster: RocksCluster, partition: int) -> tuple[int, str]:
    """An address of ``partition`` the job never writes: (key group, id)."""
    for n in range(10_000):
        id_ = f"ghost-{n}"
        key_group = key_group_for("cluster/hop", id_, 128)
        if cluster.config.partition_of(key_group) == partition:
            return key_group, id_
    raise AssertionError("no ghost id")


def _haunt(copy: TrackedRocksDBState, key_group: int, id_: str) -> None:
    data = IntType.serializer().serialize(GHOST)
    copy.restore_put(key_group, ("cluster/hop", id_), {"count": TypedValue(IntType.typename, data)})


def _seconds(lines: list[str]) -> str:
    return " + ".join(re.findall(r"in (\d+\.\d+ s)", " ".join(lines)))


def _caught_up(lines: list[str]) -> int:
    found = re.findall(r"caught up from their marks with (\d+) record", " ".join(lines))
    return sum(int(n) for n in found)


def test_rocksdb_workers_catch_up_from_their_marks_or_restore_fully(
    cluster: RocksCluster,
) -> None:
    for worker in ("w0", "w1"):
        cluster.start(worker)
    owned = cluster.settled()
    cluster.feed(0, 1500)
    cluster.check(1500, owned)
    mine = sorted(owned["w1"])

    # SIGKILL, the folder kept: the changelog is read from the marks only (w0 owns and
    # writes the partitions meanwhile)
    cluster.kill("w1")
    cluster.wait_owner_of_all("w0")
    cluster.feed(1500, 1000)
    read_outputs(cluster.bootstrap, cluster.output, 2500, 60)
    cluster.start("w1")
    owned = cluster.settled()
    assert sorted(owned["w1"]) == mine  # (the range assignor orders members by client id)
    cluster.check(2500, owned)
    lines = cluster.copy_lines("w1")
    assert lines and not any("restored fully" in line for line in lines), lines
    caught_up = _caught_up(lines)
    full = read_changelog(cluster.config, mine)[1]
    print(
        f"\nrestart with the folder kept: {caught_up} changelog record(s) read of {full} "
        f"({_seconds(lines)})"
    )
    assert 0 < caught_up < full

    # marks past the partition's end (a topic made again) and too old: wiped, read whole
    cluster.kill("w1")
    copy = cluster.copy("w1")
    past, old = mine[0], mine[1]
    ghosts = [_ghost(cluster, past), _ghost(cluster, old)]
    for key_group, id_ in ghosts:
        _haunt(copy, key_group, id_)
    aged = copy.mark(old)
    assert aged is not None
    copy.write_batch(
        [
            (mark_key(past), Mark(10**9, time.time()).encode()),
            (mark_key(old), Mark(aged.offset, aged.at - 3 * 86_400, aged.topic_id).encode()),
        ]
    )
    copy.close()
    cluster.feed(2500, 500)
    cluster.start("w1")
    owned = cluster.settled()
    cluster.check(3000, owned)
    text = " ".join(cluster.copy_lines("w1"))
    assert f"{past}: its offset 1000000000 is past the partition's end" in text, text
    assert re.search(rf"{old}: it is \d+ s old; compaction may have dropped tombstones", text)
    assert "caught up from their marks" in text  # the other two
    for _, id_ in ghosts:
        assert cluster.state("w1", id_, follow=False)[0] == 404, id_

    # a copy of another job: wiped whole
    cluster.kill("w1")
    copy = cluster.copy("w1")
    key_group, id_ = _ghost(cluster, mine[2])
    _haunt(copy, key_group, id_)
    header = {**header_of(cluster.config), "job": "another-job"}
    copy.write_batch([(HEADER_KEY, msgpack.packb(header))])
    copy.close()
    cluster.start("w1")
    owned = cluster.settled()
    cluster.check(3000, owned)
    log = cluster.log("w1").read_text()
    assert "wiped: it was made for job 'another-job'" in log
    assert not any("caught up" in line for line in cluster.copy_lines("w1"))
    assert cluster.state("w1", id_, follow=False)[0] == 404

    # the folder deleted: every partition read whole
    cluster.kill("w1")
    shutil.rmtree(cluster.folder("w1"))
    cluster.feed(3000, 300)
    cluster.start("w1")
    owned = cluster.settled()
    cluster.check(3300, owned)
    lines = cluster.copy_lines("w1")
    text = " ".join(lines)
    assert "restored fully" in text and "no local copy" in text and "caught up" not in text
    print(f"restart with the folder deleted: every record read ({_seconds(lines)})")
