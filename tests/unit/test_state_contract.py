"""The state backend contract: every test runs on the memory, the RocksDB and a toy backend
(``tests/toy_state.py``, a dict-backed one registered by that module). Without ``rocksdict``
only the RocksDB cases skip."""

from __future__ import annotations

import json
import random
import shutil
import threading
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from statefun._checksums import file_sum
from statefun.sdk._types import TypedValue
from statefun.state._changelog import write_delta
from statefun.state._codec import encode_key, encode_values
from statefun.state._expiring import ExpiringValue
from statefun.state._expiring import live_values as _live_values
from statefun.state._registry import create_backend
from statefun.state.base import AddressKey, StateBackend
from statefun.state.memory import MemoryStateBackend
from tests import toy_state

try:
    from statefun.state import rocksdb
except ImportError:  # rocksdict is not installed: the rocksdb cases skip
    rocksdb = None  # type: ignore[assignment]

needs_rocksdb = pytest.mark.skipif(rocksdb is None, reason="rocksdict is not installed")
ROCKSDB = pytest.param("rocksdb", marks=needs_rocksdb)

INT = "io.statefun.types/int"
STR = "io.statefun.types/string"

Make = Callable[..., StateBackend]


def _make(kind: str, path: Path) -> StateBackend:
    if kind != "rocksdb":
        return create_backend(kind, str(path))
    # A tiny write buffer so that the tests go through RocksDB itself, not only the buffer.
    backend: StateBackend = rocksdb.RocksDBStateBackend(path, flush_every=3)
    return backend


@pytest.fixture(params=["memory", ROCKSDB, toy_state.NAME])
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


@pytest.mark.parametrize("source", ["memory", ROCKSDB, toy_state.NAME])
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
    assert manifest["backend"] in ("memory", "rocksdb", toy_state.NAME)


# -- RocksDB: incremental checkpoints ----------------------------------------------------------


@needs_rocksdb
def test_rocksdb_materializations_share_sst_files(tmp_path: Path) -> None:
    # max_deltas=0: every checkpoint materializes (a RocksDB checkpoint), never a delta.
    backend = rocksdb.RocksDBStateBackend(tmp_path / "db", max_deltas=0)
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
    assert [m["materialized"] for m in (one, two, three)] == [True, True, True]
    assert [m["reason"] for m in (one, two, three)] == ["first", "count", "count"]
    assert two["log"] is None and three["log"] is None
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


# -- RocksDB: changelog (deltas between materializations) ---------------------------------------

#: (key group, address) -> value of state "x", or absent
Model = dict[tuple[int, AddressKey], bytes]


def change(backend: StateBackend, model: Model, rng: random.Random, step: int, n: int) -> None:
    """``n`` random puts, overwrites and deletes over 6 key groups, mirrored in ``model``."""
    for i in range(n):
        where = (rng.randrange(6), ("ns/fn", f"id-{rng.randrange(40)}"))
        if where in model and rng.random() < 0.3:
            backend.put(*where, {})
            del model[where]
        else:
            value = b"%d-%d" % (step, i)
            backend.put(*where, {"x": tv(value)})
            model[where] = value


def expect(model: Model, key_groups: Collection[int] | None = None) -> dict[int, Any]:
    """``model`` as ``dump`` shows it (only ``key_groups``, None: all)."""
    groups: dict[int, dict[AddressKey, Any]] = {}
    for (kg, key), value in model.items():
        if key_groups is None or kg in key_groups:
            groups.setdefault(kg, {})[key] = plain({"x": tv(value)})
    return dict(sorted(groups.items()))


def changelog_backend(path: Path, **kwargs: Any) -> Any:
    # A tiny write buffer: most changes reach RocksDB before the cut (the delta must hold them).
    return rocksdb.RocksDBStateBackend(path, flush_every=3, **kwargs)


def checkpoint(backend: Any, directory: Path, previous: Path | None) -> dict[str, Any]:
    snap = backend.snapshot()
    try:
        manifest: dict[str, Any] = snap.write(directory, previous)
    finally:
        snap.release()
    return manifest


def restored_dump(
    tmp_path: Path,
    kind: str,
    directory: Path,
    manifest: dict[str, Any],
    key_groups: Collection[int] | None = None,
) -> dict[int, Any]:
    target: StateBackend = (
        MemoryStateBackend()
        if kind == "memory"
        else rocksdb.RocksDBStateBackend(tmp_path / f"restored-{uuid.uuid4().hex}")
    )
    try:
        target.restore(directory, manifest, key_groups)
        return dump(target)
    finally:
        target.close()


@needs_rocksdb
def test_rocksdb_changelog_chain_restores_every_cut(tmp_path: Path) -> None:
    rng = random.Random(7)
    model: Model = {}
    backend = changelog_backend(tmp_path / "db", max_deltas=3)
    cuts: list[tuple[Path, dict[str, Any], Model]] = []
    try:
        previous = None
        for step in range(10):
            change(backend, model, rng, step, 60)
            folder = tmp_path / f"chk-{step}"
            manifest = checkpoint(backend, folder, previous)
            cuts.append((folder, manifest, dict(model)))
            previous = folder
        change(backend, model, rng, 99, 60)  # after the last cut: in no checkpoint
        live = dump(backend)
    finally:
        backend.close()
    assert live == expect(model)

    manifests = [m for _, m, _ in cuts]
    assert [m["materialized"] for m in manifests] == [i % 4 == 0 for i in range(10)]
    assert [m["reason"] for m in manifests[::4]] == ["first", "count", "count"]
    assert [m["log"] and m["log"]["deltas"] for m in manifests] == [None, 1, 2, 3] * 2 + [None, 1]
    for i, manifest in enumerate(manifests):
        assert json.loads(json.dumps(manifest)) == manifest
        base = manifests[i - i % 4]
        assert manifest["files"] == [{**f, "reused": True} for f in base["files"]] or i % 4 == 0
        if i % 4:  # a delta appended to the chain's one changelog file, the rest hard-linked
            assert manifest["copied_files"] == 1
            log, before = manifest["log"], manifests[i - 1]["log"]
            if before is not None:
                assert log["name"] == before["name"] and log["size"] > before["size"]
                assert manifest["copied_bytes"] == log["size"] - before["size"]
            assert manifest["checksums"][log["name"]] == [log["size"], ANY, "prefix"]
            folder = cuts[i][0]
            assert {p.name for p in folder.iterdir()} == {
                *(f["name"] for f in manifest["files"]),
                log["name"],
            }
            # one inode: the earlier checkpoints hold a prefix of what the later ones do
            sharing = [m for m in manifests if m["log"] and m["log"]["name"] == log["name"]]
            assert (folder / log["name"]).stat().st_nlink == len(sharing)

    for folder, manifest, at_cut in cuts:
        assert restored_dump(tmp_path, "rocksdb", folder, manifest) == expect(at_cut)
        assert restored_dump(tmp_path, "memory", folder, manifest) == expect(at_cut)

    # Subsets of key groups (rescaling), from a checkpoint with three deltas.
    folder, manifest, at_cut = cuts[7]
    for kind in ("rocksdb", "memory"):
        assert restored_dump(tmp_path, kind, folder, manifest, {1, 4}) == expect(at_cut, {1, 4})
    merged = rocksdb.RocksDBStateBackend(tmp_path / "merged")
    try:
        merged.restore(folder, manifest, range(0, 3))  # into an empty database: installed
        merged.restore(folder, manifest, range(3, 6))  # into a non-empty one: read and merged
        assert dump(merged) == expect(at_cut)
    finally:
        merged.close()

    # Each folder is complete on its own: the others deleted, a delta checkpoint restores.
    for other, _, _ in cuts:
        if other != folder:
            shutil.rmtree(other)
    assert restored_dump(tmp_path, "rocksdb", folder, manifest) == expect(at_cut)
    assert restored_dump(tmp_path, "memory", folder, manifest, {0, 5}) == expect(at_cut, {0, 5})


@needs_rocksdb
def test_rocksdb_changelog_with_pruning(tmp_path: Path) -> None:
    """Only the newest checkpoint is kept, as with checkpoints_retained=1."""
    rng = random.Random(11)
    model: Model = {}
    backend = changelog_backend(tmp_path / "db", max_deltas=4)
    try:
        previous = None
        for step in range(8):
            change(backend, model, rng, step, 40)
            folder = tmp_path / f"chk-{step}"
            manifest = checkpoint(backend, folder, previous)
            if previous is not None:
                shutil.rmtree(previous)
            previous = folder
            assert manifest["materialized"] == (step % 5 == 0)
            assert restored_dump(tmp_path, "rocksdb", folder, manifest) == expect(model)
            assert restored_dump(tmp_path, "memory", folder, manifest) == expect(model)
    finally:
        backend.close()


@pytest.mark.parametrize("flush_every", [3, 1000])  # changes in RocksDB before the cut, or not
@needs_rocksdb
def test_rocksdb_released_unwritten_snapshot_is_in_the_next_delta(
    tmp_path: Path, flush_every: int
) -> None:
    rng = random.Random(3)
    model: Model = {}
    backend = rocksdb.RocksDBStateBackend(tmp_path / "db", flush_every=flush_every)
    try:
        change(backend, model, rng, 0, 50)
        one = checkpoint(backend, tmp_path / "one", None)
        assert one["materialized"]
        change(backend, model, rng, 1, 50)
        backend.put(0, ("ns/fn", "only-in-the-abandoned"), {"x": tv(b"a")})
        model[(0, ("ns/fn", "only-in-the-abandoned"))] = b"a"
        abandoned = backend.snapshot()
        abandoned.release()  # never written
        change(backend, model, rng, 2, 50)
        two = checkpoint(backend, tmp_path / "two", tmp_path / "one")
        assert not two["materialized"]
        assert two["log"]["deltas"] == 1
        assert dump(backend) == expect(model)
    finally:
        backend.close()
    shutil.rmtree(tmp_path / "one")
    assert restored_dump(tmp_path, "rocksdb", tmp_path / "two", two) == expect(model)
    assert restored_dump(tmp_path, "memory", tmp_path / "two", two) == expect(model)


@needs_rocksdb
def test_rocksdb_materializes_when_the_chain_cannot_go_on(tmp_path: Path) -> None:
    rng = random.Random(5)
    model: Model = {}
    backend = changelog_backend(tmp_path / "db")
    manifests: dict[str, dict[str, Any]] = {}

    def take(name: str, previous: str | None) -> dict[str, Any]:
        change(backend, model, rng, len(manifests), 30)
        where = None if previous is None else tmp_path / previous
        manifests[name] = checkpoint(backend, tmp_path / name, where)
        assert restored_dump(tmp_path, "rocksdb", tmp_path / name, manifests[name]) == expect(model)
        return manifests[name]

    try:
        assert take("a", None)["reason"] == "first"
        assert not take("b", "a")["materialized"]
        # "b" never completed (say): its successor's previous is "a", which lacks b's delta.
        assert take("c", "a")["reason"] == "previous-lacks-files"
        assert take("d", None)["reason"] == "no-previous"
        # A previous folder that holds other files under the same names (a copy is enough).
        assert not take("e", "d")["materialized"]
        shutil.copytree(tmp_path / "e", tmp_path / "e-copy")
        assert take("f", "e-copy")["reason"] == "previous-lacks-files"
        assert not take("g", "f")["materialized"]
        # A failed write: the next one materializes (and loses nothing).
        (tmp_path / "blocker").write_bytes(b"")
        change(backend, model, rng, 100, 30)
        failed = backend.snapshot()
        with pytest.raises(OSError):
            failed.write(tmp_path / "blocker" / "state", tmp_path / "g")
        failed.release()
        assert take("h", "g")["reason"] == "failed"
        assert not take("i", "h")["materialized"]
        # After a restore.
        backend.restore(tmp_path / "i", manifests["i"])
        assert take("j", "i")["reason"] == "restored"
        # Nothing changed since: no new delta, the chain as it was.
        assert not take("k", "j")["materialized"]
        unchanged = checkpoint(backend, tmp_path / "l", tmp_path / "k")
        assert unchanged["log"] == manifests["k"]["log"]
        assert unchanged["copied_files"] == 0
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_deltas": 2}, "count"),
        ({"max_delta_bytes": 3_000}, "size"),
        ({"max_delta_keys": 20}, "keys"),
    ],
)
@needs_rocksdb
def test_rocksdb_materialization_thresholds(
    tmp_path: Path, limits: dict[str, int], reason: str
) -> None:
    backend = changelog_backend(tmp_path / "db", **limits)
    model: Model = {}
    rng = random.Random(1)
    got = []
    try:
        previous = None
        for step in range(6):
            # 15 changes per checkpoint (about 1,000 bytes of delta), except one of 60
            change(backend, model, rng, step, 60 if step == 3 else 15)
            folder = tmp_path / f"chk-{step}"
            manifest = checkpoint(backend, folder, previous)
            got.append(manifest["reason"])
            previous = folder
    finally:
        backend.close()
    assert restored_dump(tmp_path, "memory", previous, manifest) == expect(model)
    expected = {
        "count": ["first", None, None, "count", None, None],
        "size": ["first", None, None, None, "size", None],
        "keys": ["first", None, None, "keys", None, None],
    }
    assert got == expected[reason]


@needs_rocksdb
def test_rocksdb_rejects_unknown_formats(tmp_path: Path) -> None:
    backend = changelog_backend(tmp_path / "db")
    try:
        fill(backend, 10)
        manifest = checkpoint(backend, tmp_path / "chk", None)
        assert manifest["format"] == 3
        for kind in ("rocksdb", "memory"):
            with pytest.raises(ValueError, match="format 99 is not supported"):
                restored_dump(tmp_path, kind, tmp_path / "chk", {**manifest, "format": 99})
        # Format 1 (before deltas) is still read.
        old = {**manifest, "format": 1}
        del old["log"]
        assert restored_dump(tmp_path, "rocksdb", tmp_path / "chk", old) == dump(backend)
    finally:
        backend.close()


@needs_rocksdb
def test_rocksdb_reads_format_2_one_file_per_delta(tmp_path: Path) -> None:
    """Checkpoints written before the chain's changelog was one file still restore."""
    backend = changelog_backend(tmp_path / "db")
    try:
        fill(backend, 10)
        manifest = checkpoint(backend, tmp_path / "chk", None)
        assert manifest["materialized"]
    finally:
        backend.close()
    model = MemoryStateBackend()
    fill(model, 10)
    fill(model, 5, tag=b"later")
    expected = dump(model)
    changes = {
        encode_key(i % 8, ("ns/fn", f"id-{i}")): encode_values({"x": tv(b"later%d" % i)})
        for i in range(5)
    }
    name = f"delta-{manifest['chain']}-000001.msgpack"
    size, _ = write_delta(tmp_path / "chk" / name, changes)
    old = {**manifest, "format": 2, "deltas": [{"name": name, "size": size}]}
    del old["log"]
    for kind in ("rocksdb", "memory"):
        assert restored_dump(tmp_path, kind, tmp_path / "chk", old) == expected


@needs_rocksdb
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


@needs_rocksdb
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


# -- checksums of every file, and clear() ---------------------------------------------------------


def assert_checksums_match(directory: Path, manifest: dict[str, Any]) -> None:
    """The manifest lists every file of ``directory`` with its size and CRC-32C (of its first
    ``size`` bytes where the entry says ``prefix``: a file later checkpoints append to)."""
    assert set(manifest["checksums"]) == {p.name for p in directory.iterdir()}
    for name, (size, crc, *prefix) in manifest["checksums"].items():
        assert prefix in ([], ["prefix"]), name
        limit = size if prefix else None
        assert file_sum(directory / name, limit) == (size, crc), name


def test_every_written_file_has_its_checksum(make: Make, tmp_path: Path) -> None:
    backend = make()
    fill(backend, 3_000, groups=16)
    one = checkpoint(backend, tmp_path / "chk-1", None)
    assert_checksums_match(tmp_path / "chk-1", one)
    backend.put(2, ("ns/fn", "id-2"), {"x": tv(b"changed")})
    two = checkpoint(backend, tmp_path / "chk-2", tmp_path / "chk-1")
    assert_checksums_match(tmp_path / "chk-2", two)


@needs_rocksdb
def test_rocksdb_linked_files_carry_their_checksums(tmp_path: Path) -> None:
    """Deltas and materialized files linked from the previous checkpoint keep the checksum
    they were written with; an SST linked from a copied folder is read back."""
    backend = changelog_backend(tmp_path / "db", max_deltas=2)
    try:
        fill(backend, 3_000, groups=16)
        manifests = []
        for i in range(1, 6):
            backend.put(i, ("ns/fn", f"id-{i}"), {"x": tv(b"step %d" % i)})
            previous = None if i == 1 else tmp_path / f"chk-{i - 1}"
            manifests.append(checkpoint(backend, tmp_path / f"chk-{i}", previous))
            assert_checksums_match(tmp_path / f"chk-{i}", manifests[-1])
        assert [m["materialized"] for m in manifests] == [True, False, False, True, False]
        assert any(f["reused"] for f in manifests[3]["files"])  # SSTs shared by links
        shutil.copytree(tmp_path / "chk-5", tmp_path / "copied")
        fresh = rocksdb.RocksDBStateBackend(tmp_path / "db2", max_deltas=0)
        try:
            fresh.restore(tmp_path / "chk-5", manifests[-1])
            other = checkpoint(fresh, tmp_path / "chk-6", tmp_path / "copied")
            assert_checksums_match(tmp_path / "chk-6", other)
        finally:
            fresh.close()
    finally:
        backend.close()


def test_clear_drops_everything(make: Make, tmp_path: Path) -> None:
    backend = make()
    fill(backend, 100, groups=8)
    snap = backend.snapshot()  # frozen buffers go too
    backend.put(1, ("ns/fn", "late"), {"x": tv(b"1")})
    backend.clear()
    snap.release()
    assert backend.key_groups() == []
    assert backend.get(1, ("ns/fn", "late")) is None
    backend.put(1, ("ns/fn", "after"), {"x": tv(b"2")})
    assert plain(backend.get(1, ("ns/fn", "after"))) == plain({"x": tv(b"2")})
    manifest = checkpoint(backend, tmp_path / "chk", None)
    assert restored_dump(tmp_path, "memory", tmp_path / "chk", manifest) == {
        1: {("ns/fn", "after"): plain({"x": tv(b"2")})}
    }


def test_ids_page_through_one_type_in_order(backend: StateBackend) -> None:
    """``ids`` pages through a type's ids of a key group in UTF-8 order, skipping other types,
    deletions and whatever came before ``after``, with writes in the buffers and in RocksDB
    alike (a snapshot freezes the buffer in between)."""
    rng = random.Random(7)
    live: dict[tuple[int, AddressKey], bool] = {}
    snapshot = None
    for step in range(400):
        key_group = rng.randrange(3)
        typename = rng.choice(["shop/cart", "shop/cart2", "shop/c"])
        key = (typename, rng.choice(["a", "b", "ä", "z", "日本", "ab", "a0", ""]) + str(step % 9))
        if rng.random() < 0.3:
            backend.put(key_group, key, {})
            live.pop((key_group, key), None)
        else:
            backend.put(key_group, key, {"n": tv(b"\x08\x01")})
            live[(key_group, key)] = True
        if step == 200:
            snapshot = backend.snapshot()  # frozen buffer (RocksDB): reads still see it
    for key_group in range(4):
        for typename in ("shop/cart", "shop/c"):
            expected = sorted(id_ for (g, (t, id_)) in live if g == key_group and t == typename)
            assert backend.ids(key_group, typename, None, 1000) == expected
            for limit in (1, 2, 5):
                pages: list[str] = []
                after: str | None = None
                while True:
                    page = backend.ids(key_group, typename, after, limit)
                    assert len(page) <= limit
                    if not page:
                        break
                    pages += page
                    after = page[-1]
                assert pages == expected
            if expected:  # an id that holds no state is a cursor like any other
                assert backend.ids(key_group, typename, expected[0] + "\x00", 1000) == expected[1:]
    assert backend.ids(0, "shop/cart", None, 0) == []
    if snapshot is not None:
        snapshot.release()


def test_ids_in_steps_of_a_large_group_with_writes_between_steps(backend: StateBackend) -> None:
    """A large key group is listed in several steps; writes between the steps break nothing,
    and ids that were there before the listing and stay are all listed, in order."""
    for n in range(5000):
        backend.put(
            0, ("shop/cart" if n % 3 else "shop/other", f"id{n:05d}"), {"n": tv(b"\x08\x01")}
        )
    expected = sorted(f"id{n:05d}" for n in range(5000) if n % 3)
    pages: list[str] = []
    after: str | None = None
    steps_taken = 0
    while True:
        steps = backend.ids_in_steps(0, "shop/cart", after, 700)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                page = done.value
                break
            steps_taken += 1
            backend.put(0, ("shop/cart", f"new{steps_taken}"), {"n": tv(b"\x08\x01")})
        if not page:
            break
        pages += page
        after = page[-1]
    assert [p for p in pages if p.startswith("id")] == expected
    assert pages == sorted(pages)
    if not isinstance(backend, toy_state.ToyStateBackend):
        assert steps_taken > 0  # the memory and RocksDB backends do take steps
