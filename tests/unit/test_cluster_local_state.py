"""A clustered worker's local RocksDB copy without a broker: when a copy is trusted, how
changelog records become its entries, that only committed writes reach RocksDB (marks with
them, in one batch), and that a copy of another job, without a header or damaged is wiped."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

pytest.importorskip("rocksdict")

from statefun.cluster._config import ClusterConfig
from statefun.cluster._local_state import (
    HEADER_KEY,
    MARGIN_MS,
    LocalCopy,
    Mark,
    TrackedRocksDBState,
    catch_up_from,
    copy_path,
    cut_key,
    local_entries,
    mark_key,
)
from statefun.sdk import TypedValue
from statefun.state._codec import encode_key, encode_values

Record = namedtuple("Record", "key value offset")
DAY_MS = 86_400_000


def _config(job: str = "shop", partitions: int = 4) -> ClusterConfig:
    return ClusterConfig(
        bootstrap_servers="127.0.0.1:9",
        job_id=job,
        worker_id="w0",
        partitions=partitions,
        max_parallelism=128,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=3_000,
        transaction_timeout_ms=60_000,
        replication_factor=1,
    )


def _values(n: int) -> dict[str, TypedValue]:
    return {"count": TypedValue("io.statefun.types/int", str(n).encode())}


def _decide(mark: Mark | None, **changes: object) -> tuple[int | None, str]:
    args: dict[str, object] = {
        "beginning": 0,
        "end": 500,
        "topic_id": "T",
        "now": 1_000_000.0,
        "retention_ms": DAY_MS,
        "transaction_timeout_ms": 60_000,
    }
    args.update(changes)
    return catch_up_from(mark, **args)  # type: ignore[arg-type]


def test_a_mark_is_trusted_only_while_the_changelog_still_holds_what_it_missed() -> None:
    fresh = Mark(120, 1_000_000.0 - 3600, "T")
    assert _decide(fresh) == (120, "caught up")
    assert _decide(Mark(500, 1_000_000.0, "T")) == (500, "caught up")  # at the end: read nothing
    assert _decide(Mark(120, 1_000_000.0, "")) == (120, "caught up")  # id unknown: offsets only
    assert _decide(None) == (None, "no local copy")
    assert "made again" in str(_decide(Mark(120, 1_000_000.0, "U"))[1])
    start, why = _decide(Mark(501, 1_000_000.0, "T"))
    assert start is None and "past the partition's end 500" in why
    start, why = _decide(Mark(120, 1_000_000.0, "T"), beginning=200)
    assert start is None and "before the partition's beginning 200" in why
    assert _decide(fresh, retention_ms=None)[0] is None
    # tombstones written after `at` (less the transaction timeout) are kept for the retention:
    # trusted up to retention - transaction timeout - margin, not a millisecond more
    limit_s = (DAY_MS - 60_000 - MARGIN_MS) / 1000
    assert _decide(Mark(120, 1_000_000.0 - limit_s, "T"))[0] == 120
    start, why = _decide(Mark(120, 1_000_000.0 - limit_s - 1, "T"))
    assert start is None and "delete.retention.ms 86400000" in why
    assert _decide(Mark(120, 1_000_000.0 + MARGIN_MS / 1000 + 1, "T"))[0] is None  # clock back
    assert _decide(fresh, retention_ms=60_000)[0] is None  # a short retention trusts nothing


def test_marks_round_trip_and_a_damaged_one_is_none() -> None:
    mark = Mark(7, 12.5, "abc")
    assert Mark.decode(mark.encode()) == mark
    assert Mark.decode(None) is None
    assert Mark.decode(b"\xc1garbage") is None
    assert Mark.decode(b"\x93\x01") is None  # cut short


def test_changelog_records_become_the_copys_entries() -> None:
    value = encode_values(_values(3))
    records = [
        Record(b"2:s:65:cluster/hop\x1fa:b", value, 10),  # an id holding ':'
        Record(b"2:s:66:ns/x\x1f7", None, 11),  # a tombstone
        Record(b"2:s:66:ns/x\x1f8", b"", 12),  # an empty value (earlier versions): no state
        Record(b"2:c", b"cut", 13),
        Record(b"0:seed", b"savepoint", 14),  # not state
    ]
    assert local_entries(2, records) == [
        (encode_key(65, ("cluster/hop", "a:b")), value),
        (encode_key(66, ("ns/x", "7")), None),
        (encode_key(66, ("ns/x", "8")), None),
        (cut_key(2), b"cut"),
    ]


def test_only_committed_writes_reach_rocksdb_with_their_marks(tmp_path: Path) -> None:
    config = _config()
    path = copy_path(str(tmp_path), config)
    state = TrackedRocksDBState(path, config)
    assert state.wiped == ""
    copy = LocalCopy(state, config)
    state.put(1, ("t/f", "a"), _values(1))
    cut = copy.cut()
    state.put(1, ("t/f", "b"), _values(2))  # after the cut: not in this checkpoint
    assert state.take_changed() == {(1, ("t/f", "a")), (1, ("t/f", "b"))}
    assert state.get_raw(encode_key(1, ("t/f", "a"))) is None  # in memory until the commit
    copy._pending = {0: Mark(40, 5.0, "T")}
    rows = [("changelog", "0:c", b"cut0", None), ("changelog", "0:s:1:t/f\x1fa", b"x", None)]
    asyncio.run(copy.committed(cut, rows, proven=True))
    assert state.get_raw(encode_key(1, ("t/f", "a"))) == encode_values(_values(1))
    assert state.mark(0) == Mark(40, 5.0, "T") and state.cut_value(0) == b"cut0"
    assert state.get(1, ("t/f", "b")) == _values(2)  # the running job still reads it
    copy.close()  # as the epoch ends: what no commit wrote through is dropped
    state = TrackedRocksDBState(path, config)
    assert state.get(1, ("t/f", "a")) == _values(1)
    assert state.get(1, ("t/f", "b")) is None
    # a checkpoint that did not commit (nothing to commit) writes through, but no mark
    copy = LocalCopy(state, config)
    copy._pending = {0: Mark(90, 6.0, "T")}
    asyncio.run(copy.committed(copy.cut(), [], proven=False))
    assert state.mark(0) == Mark(40, 5.0, "T")
    copy.close()


def test_a_partition_is_wiped_alone(tmp_path: Path) -> None:
    config = _config()  # 4 partitions of 128 key groups: 32 each
    state = TrackedRocksDBState(copy_path(str(tmp_path), config), config)
    for key_group in (0, 31, 32, 63, 64, 127):
        state.restore_put(key_group, ("t/f", str(key_group)), _values(key_group))
    for partition in range(4):
        state.write_batch([(mark_key(partition), Mark(1, 1.0).encode())])
    state.wipe(config, 1)
    assert [state.get(k, ("t/f", str(k))) is not None for k in (0, 31, 32, 63, 64, 127)] == [
        True,
        True,
        False,
        False,
        True,
        True,
    ]
    assert [state.mark(p) is not None for p in range(4)] == [True, False, True, True]
    state.own(range(32, 128))
    assert state.key_groups() == [64, 127]  # owned ones only, never the copy's own keys
    assert state.ids(0, "t/f", None, 10) == [] and state.ids(64, "t/f", None, 10) == ["64"]
    state.close()


def _one_address(tmp_path: Path) -> tuple[ClusterConfig, Path, TrackedRocksDBState]:
    """A copy holding the address (5, t/f x), open."""
    config = _config()
    path = copy_path(str(tmp_path), config)
    state = TrackedRocksDBState(path, config)
    state.restore_put(5, ("t/f", "x"), _values(5))
    return config, path, state


def test_a_copy_of_another_job_without_header_or_damaged_is_wiped(tmp_path: Path) -> None:
    config, path, state = _one_address(tmp_path)
    state.close()
    other = dataclasses.replace(config, job_id="other")
    state = TrackedRocksDBState(path, other)  # (the same folder, another job)
    assert "made for job 'shop'" in state.wiped
    assert state.get(5, ("t/f", "x")) is None
    state.close()
    state = TrackedRocksDBState(path, _config(partitions=8))  # another partitioning
    assert "made for job 'other'" in state.wiped and "'partitions': 4" in state.wiped
    state.restore_put(5, ("t/f", "y"), _values(1))
    state.write_batch([(HEADER_KEY, b"\xc1")])  # damaged
    state.close()
    state = TrackedRocksDBState(path, _config(partitions=8))
    assert state.wiped == "its header is damaged" and state.get(5, ("t/f", "y")) is None
    state.close()
    for name in (path / "db").iterdir():  # RocksDB's own files damaged
        if name.name.startswith(("CURRENT", "MANIFEST")):
            name.write_bytes(b"garbage")
    state = TrackedRocksDBState(path, _config(partitions=8))
    assert state.wiped.startswith("RocksDB could not open it")
    state.close()


def test_a_second_process_on_one_copy_is_refused_not_wiped(tmp_path: Path) -> None:
    from statefun._exceptions import ConfigurationError

    config, path, state = _one_address(tmp_path)
    with pytest.raises(ConfigurationError, match="in use by another process"):
        TrackedRocksDBState(path, config)
    state.close()
    state = TrackedRocksDBState(path, config)
    assert state.wiped == "" and state.get(5, ("t/f", "x")) == _values(5)
    state.close()


def test_what_was_written_through_survives_a_killed_process(tmp_path: Path) -> None:
    """The copy is written with RocksDB's write-ahead log: a SIGKILLed worker's commits are
    there after the restart, each with its mark (one batch), even before any flush."""
    script = f"""
import asyncio, os
from pathlib import Path
from statefun.cluster._local_state import LocalCopy, Mark, TrackedRocksDBState
from tests.unit.test_cluster_local_state import _config, _values
config = _config()
state = TrackedRocksDBState(Path({str(tmp_path)!r}), config)
copy = LocalCopy(state, config)
for n in range(3):
    state.put(2, ("t/f", str(n)), _values(n))
    copy._pending = {{0: Mark(10 + n, 1.0)}}
    asyncio.run(copy.committed(copy.cut(), [], proven=True))
state.put(2, ("t/f", "late"), _values(9))  # never committed
os._exit(0)  # no close, no flush: as a SIGKILL
"""
    root = Path(__file__).parents[2]
    subprocess.run([sys.executable, "-c", script], check=True, cwd=root, timeout=60)
    state = TrackedRocksDBState(tmp_path, _config())
    assert [state.get(2, ("t/f", str(n))) for n in range(3)] == [_values(n) for n in range(3)]
    assert state.get(2, ("t/f", "late")) is None
    assert state.mark(0) == Mark(12, 1.0)
    state.close()


def test_an_epochs_copy_is_per_job_and_worker(tmp_path: Path) -> None:
    config = _config()
    assert copy_path(str(tmp_path), config) == tmp_path / "cluster" / "shop" / "w0"
