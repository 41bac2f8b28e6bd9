"""The state backend contract: every test runs on the memory and the RocksDB backend."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statefun.runtime._dispatcher import ExpiringValue, _live_values
from statefun.sdk._types import TypedValue
from statefun.state.base import AddressKey, StateBackend
from statefun.state.memory import MemoryStateBackend

rocksdb = pytest.importorskip("statefun.state.rocksdb")

INT = "io.statefun.types/int"
STR = "io.statefun.types/string"

Make = Callable[..., StateBackend]


def _make(kind: str, path: Path) -> StateBackend:
    if kind == "memory":
        return MemoryStateBackend()
    # A tiny write buffer so that the tests go through RocksDB itself, not only the buffer.
    backend: StateBackend = rocksdb.RocksDBStateBackend(path, flush_every=3)
    return backend


@pytest.fixture(params=["memory", "rocksdb"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    created: list[StateBackend] = []

    def new(kind: str = request.param) -> StateBackend:
        backend = _make(kind, tmp_path / f"backend-{len(created)}")
        created.append(backend)
        return backend

    yield new
    for backend in created:
        backend.close()


@pytest.fixture
def backend(make: Make) -> StateBackend:
    return make()


def tv(value: bytes | None, typename: str = INT) -> TypedValue:
    return TypedValue(typename, value)


def plain(values: Any) -> dict[str, tuple[Any, ...]] | None:
    """Comparable form of a values dict, with the class and deadline of each value."""
    if values is None:
        return None
    return {
        name: (
            type(v).__name__,
            v.typename,
            v.has_value,
            bytes(v.value),
            getattr(v, "deadline_ms", None),
        )
        for name, v in values.items()
    }


def dump(backend: StateBackend) -> dict[int, dict[AddressKey, Any]]:
    return {
        kg: {key: plain(values) for key, values in backend.items(kg)} for kg in backend.key_groups()
    }


def fill(backend: StateBackend, n: int, groups: int = 8, tag: bytes = b"v") -> None:
    for i in range(n):
        backend.put(i % groups, ("ns/fn", f"id-{i}"), {"x": tv(tag + str(i).encode())})


# -- get / put / delete / items / key_groups ----------------------------------------------------


def test_get_put_delete(backend: StateBackend) -> None:
    key = ("ns/fn", "a")
    assert backend.get(3, key) is None
    backend.put(3, key, {"seen": tv(b"\x01"), "name": tv(b"ann", STR)})
    assert plain(backend.get(3, key)) == plain({"seen": tv(b"\x01"), "name": tv(b"ann", STR)})
    assert backend.get(4, key) is None  # the key group is part of the key
    backend.put(3, key, {"seen": tv(b"\x02")})  # replaces, does not merge
    assert plain(backend.get(3, key)) == plain({"seen": tv(b"\x02")})
    backend.put(3, key, {})  # empty: deleted
    assert backend.get(3, key) is None
    backend.put(3, ("ns/fn", "never"), {})  # deleting what is not there is fine
    assert backend.key_groups() == []


def test_get_gives_a_dict_the_caller_may_keep(backend: StateBackend) -> None:
    key = ("ns/fn", "a")
    given = {"x": tv(b"1")}
    backend.put(0, key, given)
    kept = backend.get(0, key)
    backend.put(0, key, {"x": tv(b"2")})
    for i in range(10):  # push it through the RocksDB write buffer too
        backend.put(1, ("ns/fn", str(i)), {"x": tv(b"0")})
    assert plain(kept) == plain({"x": tv(b"1")})
    assert plain(given) == plain({"x": tv(b"1")})
    assert plain(backend.get(0, key)) == plain({"x": tv(b"2")})


def test_items_and_key_groups(backend: StateBackend) -> None:
    fill(backend, 40, groups=5)
    assert backend.key_groups() == [0, 1, 2, 3, 4]
    items = dict(backend.items(2))
    assert sorted(items) == sorted(("ns/fn", f"id-{i}") for i in range(2, 40, 5))
    assert plain(items[("ns/fn", "id-7")]) == plain({"x": tv(b"v7")})
    for key, _ in backend.items(4):  # put while iterating, as restore's cleanup does
        backend.put(4, key, {})
    assert backend.key_groups() == [0, 1, 2, 3]
    assert list(backend.items(4)) == []
    assert list(backend.items(99)) == []


def test_same_id_different_types_and_unicode(backend: StateBackend) -> None:
    backend.put(7, ("ns/a", "x"), {"v": tv(b"a")})
    backend.put(7, ("ns/ab", ""), {"v": tv(b"b")})
    backend.put(7, ("ns/a", "é/∑"), {"v": tv(b"c")})
    for i in range(5):
        backend.put(8, ("ns/z", str(i)), {"v": tv(b"z")})
    assert plain(backend.get(7, ("ns/a", "x"))) == plain({"v": tv(b"a")})
    assert plain(backend.get(7, ("ns/ab", ""))) == plain({"v": tv(b"b")})
    assert plain(backend.get(7, ("ns/a", "é/∑"))) == plain({"v": tv(b"c")})
    assert len(list(backend.items(7))) == 3


# -- values round-trip, TTL ---------------------------------------------------------------------


ODD_VALUES = {
    "absent": tv(None),  # has_value=False must survive
    "empty": tv(b""),  # present, empty bytes
    "big": tv(bytes(range(256)) * 300, "com.example/blob"),
    "ttl": ExpiringValue(tv(b"\x07"), 1_700_000_000_123),
    "ttl-absent": ExpiringValue(tv(None, STR), 2**53 + 1),
}


def test_values_round_trip(make: Make, tmp_path: Path) -> None:
    backend = make()
    key = ("ns/fn", "odd")
    backend.put(1, key, ODD_VALUES)
    fill(backend, 10)  # through the write buffer into RocksDB
    got = backend.get(1, key)
    assert plain(got) == plain(ODD_VALUES)
    assert got is not None
    assert got["absent"].has_value is False
    assert type(got["ttl"]) is ExpiringValue
    assert got["ttl"].deadline_ms == 1_700_000_000_123
    snap = backend.snapshot()
    manifest = snap.write(tmp_path / "chk", None)
    snap.release()
    restored = make()
    restored.restore(tmp_path / "chk", manifest)
    assert plain(restored.get(1, key)) == plain(ODD_VALUES)


def test_ttl_behaves_the_same(backend: StateBackend) -> None:
    """The dispatcher's expiry check (type(v) is ExpiringValue) sees stored values as put."""
    key = ("ns/fn", "ttl")
    backend.put(
        0,
        key,
        {
            "keep": ExpiringValue(tv(b"k"), 2_000),
            "drop": ExpiringValue(tv(b"d"), 1_000),
            "plain": tv(b"p"),
        },
    )
    fill(backend, 10)
    live = _live_values(backend.get(0, key), now=1_500)
    assert sorted(live) == ["keep", "plain"]
    assert live["keep"].deadline_ms == 2_000
    assert _live_values(backend.get(0, key), now=2_000).keys() == {"plain"}


# -- snapshots ---------------------------------------------------------------------------------


def test_snapshot_isolation(make: Make, tmp_path: Path) -> None:
    backend = make()
    fill(backend, 30, groups=3)
    backend.put(1, ("ns/fn", "gone-later"), {"x": tv(b"here")})
    expected = dump(backend)
    snap = backend.snapshot()
    # After the cut: changes, deletions, new key groups: none of it is in the snapshot.
    backend.put(0, ("ns/fn", "id-0"), {"x": tv(b"changed")})
    backend.put(1, ("ns/fn", "gone-later"), {})
    backend.put(5, ("ns/fn", "new"), {"x": tv(b"new")})
    fill(backend, 30, groups=3, tag=b"after")
    after = dump(backend)
    manifest = snap.write(tmp_path / "chk", None)
    snap.release()
    assert dump(backend) == after  # writing does not change the live state
    restored = make()
    restored.restore(tmp_path / "chk", manifest)
    assert dump(restored) == expected
    assert restored.get(5, ("ns/fn", "new")) is None


def test_writes_during_write_are_not_in_the_snapshot(make: Make, tmp_path: Path) -> None:
    """write() runs in a worker thread while the event loop goes on writing."""
    backend = make()
    fill(backend, 2_000, groups=16)
    expected = dump(backend)
    snap = backend.snapshot()
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(snap.write(tmp_path / "chk", None)))
    worker.start()
    for round_ in range(3):
        fill(backend, 2_000, groups=16, tag=b"r%d-" % round_)
        backend.put(3, ("ns/fn", "id-3"), {})
    worker.join()
    snap.release()
    restored = make()
    restored.restore(tmp_path / "chk", result)
    assert dump(restored) == expected
    assert backend.get(3, ("ns/fn", "id-3")) is None
    assert plain(backend.get(4, ("ns/fn", "id-4"))) == plain({"x": tv(b"r2-4")})


def test_consecutive_snapshots_and_a_released_unwritten_one(make: Make, tmp_path: Path) -> None:
    backend = make()
    fill(backend, 20)
    first = backend.snapshot()
    first.write(tmp_path / "one", None)
    first.release()
    backend.put(0, ("ns/fn", "id-0"), {"x": tv(b"two")})
    abandoned = backend.snapshot()
    abandoned.release()  # never written: its changes are not lost
    backend.put(1, ("ns/fn", "id-1"), {"x": tv(b"three")})
    expected = dump(backend)
    third = backend.snapshot()
    manifest = third.write(tmp_path / "three", tmp_path / "one")
    third.release()
    restored = make()
    restored.restore(tmp_path / "three", manifest)
    assert dump(restored) == expected
    assert dump(backend) == expected


def test_restore_a_subset_of_key_groups(make: Make, tmp_path: Path) -> None:
    backend = make()
    fill(backend, 64, groups=16)
    snap = backend.snapshot()
    manifest = snap.write(tmp_path / "chk", None)
    snap.release()
    everything = dump(backend)

    low = make()
    low.restore(tmp_path / "chk", manifest, range(0, 8))
    assert low.key_groups() == list(range(8))
    assert dump(low) == {kg: everything[kg] for kg in range(8)}

    # Rescaling the other way: two owners' snapshots merged into one backend.
    high = make()
    high.restore(tmp_path / "chk", manifest, {9, 15, 100})
    assert high.key_groups() == [9, 15]
    merged = make()
    for part in (range(0, 5), range(5, 16)):
        merged.restore(tmp_path / "chk", manifest, part)
    assert dump(merged) == everything


@pytest.mark.parametrize("source", ["memory", "rocksdb"])
def test_restore_across_backends(make: Make, tmp_path: Path, source: str) -> None:
    origin = make(source)
    fill(origin, 50)
    origin.put(2, ("ns/fn", "odd"), ODD_VALUES)
    snap = origin.snapshot()
    manifest = snap.write(tmp_path / "chk", None)
    snap.release()
    target = make()
    target.restore(tmp_path / "chk", manifest, range(0, 4))
    assert dump(target) == {kg: v for kg, v in dump(origin).items() if kg < 4}


def test_manifest_is_plain_data(backend: StateBackend, tmp_path: Path) -> None:
    import json

    import msgpack

    fill(backend, 10)
    snap = backend.snapshot()
    manifest = snap.write(tmp_path / "chk", None)
    snap.release()
    assert json.loads(json.dumps(manifest)) == manifest
    assert msgpack.unpackb(msgpack.packb(manifest)) == manifest
    assert manifest["backend"] in ("memory", "rocksdb")


# -- RocksDB: incremental checkpoints ----------------------------------------------------------


def test_rocksdb_checkpoints_are_incremental(tmp_path: Path) -> None:
    backend = rocksdb.RocksDBStateBackend(tmp_path / "db")
    try:
        fill(backend, 5_000, groups=32)
        first = backend.snapshot()
        one = first.write(tmp_path / "chk-1", None)
        first.release()
        assert one["reused_files"] == 0
        assert any(f["name"].endswith(".sst") for f in one["files"])

        backend.put(3, ("ns/fn", "id-3"), {"x": tv(b"changed")})
        expected = dump(backend)
        second = backend.snapshot()
        two = second.write(tmp_path / "chk-2", tmp_path / "chk-1")
        second.release()

        # A previous checkpoint that was copied (other inodes) is recognised too.
        shutil.copytree(tmp_path / "chk-2", tmp_path / "copied")
        backend.put(4, ("ns/fn", "id-4"), {})
        third = backend.snapshot()
        three = third.write(tmp_path / "chk-3", tmp_path / "copied")
        third.release()
    finally:
        backend.close()

    def copied_sst_bytes(manifest: dict[str, Any]) -> int:
        return sum(
            f["size"] for f in manifest["files"] if f["name"].endswith(".sst") and not f["reused"]
        )

    ssts_one = {f["name"] for f in one["files"] if f["name"].endswith(".sst")}
    reused = {f["name"] for f in two["files"] if f["reused"]}
    assert reused and reused <= ssts_one
    assert two["reused_bytes"] > 0
    assert two["copied_bytes"] < one["copied_bytes"] / 2
    assert copied_sst_bytes(two) < copied_sst_bytes(one) / 10
    assert {f["name"] for f in three["files"] if f["reused"]} >= reused
    assert copied_sst_bytes(three) < copied_sst_bytes(one) / 10
    names = {f["name"] for f in two["files"]}
    assert names == {p.name for p in (tmp_path / "chk-2").iterdir()}

    shutil.rmtree(tmp_path / "chk-1")  # each checkpoint folder stands on its own
    restored = rocksdb.RocksDBStateBackend(tmp_path / "restored")
    try:
        restored.restore(tmp_path / "chk-2", two)
        assert dump(restored) == expected
        assert plain(restored.get(3, ("ns/fn", "id-3"))) == plain({"x": tv(b"changed")})
    finally:
        restored.close()


def test_rocksdb_snapshots_are_written_in_order(tmp_path: Path) -> None:
    backend = rocksdb.RocksDBStateBackend(tmp_path / "db")
    try:
        fill(backend, 10)
        early = backend.snapshot()
        fill(backend, 10, tag=b"late")
        late = backend.snapshot()
        late.write(tmp_path / "late", None)
        with pytest.raises(RuntimeError, match="later one was written first"):
            early.write(tmp_path / "early", None)
    finally:
        backend.close()


def test_rocksdb_close_and_reopen(tmp_path: Path) -> None:
    backend = rocksdb.RocksDBStateBackend(tmp_path / "db")
    fill(backend, 10)
    backend.snapshot().release()
    backend.put(0, ("ns/fn", "last"), {"x": tv(b"1")})
    expected = dump(backend)
    backend.close()
    reopened = rocksdb.RocksDBStateBackend(tmp_path / "db", keep_existing=True)
    try:
        assert dump(reopened) == expected
    finally:
        reopened.close()
    fresh = rocksdb.RocksDBStateBackend(tmp_path / "db")
    try:
        assert fresh.key_groups() == []
    finally:
        fresh.close()


def test_memory_snapshot_is_copy_on_write(tmp_path: Path) -> None:
    backend = MemoryStateBackend()
    fill(backend, 20, groups=4)
    before = {kg: dict(backend.items(kg)) for kg in range(4)}
    snap = backend.snapshot()
    group_1 = backend._groups[1]
    backend.put(0, ("ns/fn", "id-0"), {"x": tv(b"new")})
    backend.put(0, ("ns/fn", "id-4"), {"x": tv(b"new")})
    assert backend._groups[1] is group_1  # untouched groups are not copied
    manifest = snap.write(tmp_path / "chk", None)
    assert manifest["key_groups"] == [0, 1, 2, 3]
    snap.release()
    assert not backend._shared
    restored = MemoryStateBackend()
    restored.restore(tmp_path / "chk", manifest)
    assert {kg: dict(restored.items(kg)).keys() for kg in range(4)} == {
        kg: v.keys() for kg, v in before.items()
    }
    assert plain(restored.get(0, ("ns/fn", "id-0"))) == plain({"x": tv(b"v0")})
