"""The memory backend's snapshots reuse the packed section of each key group that nothing wrote
since the previous snapshot: every snapshot file must still hold exactly the state at its cut,
whichever way the state was written (``put``, or the slice loop's own writes into the dicts it
gets from ``unshared_groups`` and then tells ``written``), and whenever it is written."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statefun.sdk._types import TypedValue
from statefun.state import memory
from statefun.state.memory import MemoryStateBackend, MemoryStateSnapshot, read_memory_snapshot

INT = "io.statefun.types/int"
Model = dict[tuple[int, tuple[str, str]], bytes]


def values(value: bytes) -> dict[str, Any]:
    return {"n": TypedValue(INT, value)}


def read(snapshot: MemoryStateSnapshot, folder: Path) -> Model:
    manifest = snapshot.write(folder)
    return {
        (key_group, key): found["n"].value
        for key_group, key, found in read_memory_snapshot(folder, manifest, None)
    }


_ops = st.lists(
    st.one_of(
        # (how, key group, id, value: b"" deletes)
        st.tuples(
            st.sampled_from(["put", "direct"]),
            st.integers(0, 3),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([b"", b"1", b"2", b"3"]),
        ),
        st.just(("snapshot",)),  # taken now, written at once
        st.just(("cut",)),  # taken now, written after the next operations
        st.just(("write",)),  # the oldest cut not written yet, written now
        st.just(("clear",)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_every_snapshot_file_holds_the_state_at_its_cut(ops: list[tuple[Any, ...]]) -> None:
    backend = MemoryStateBackend()
    model: Model = {}
    cuts: list[tuple[MemoryStateSnapshot, Model]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = (Path(tmp) / str(n) for n in itertools.count())
        for op in ops + [("write",)] * 40:
            if op[0] in ("put", "direct"):
                how, key_group, id_, value = op
                key = ("t/f", id_)
                groups = backend.unshared_groups() if how == "direct" else None
                group = None if groups is None else groups.get(key_group)
                if group is not None and value:  # as the slice loop writes
                    group[key] = values(value)
                    backend.written({key_group})
                else:
                    backend.put(key_group, key, values(value) if value else {})
                if value:
                    model[(key_group, key)] = value
                else:
                    model.pop((key_group, key), None)
            elif op[0] == "snapshot":
                snapshot = backend.snapshot()
                assert read(snapshot, next(folders)) == model
                snapshot.release()
            elif op[0] == "cut":
                cuts.append((backend.snapshot(), dict(model)))
            elif op[0] == "write" and cuts:
                snapshot, at_cut = cuts.pop(0)
                assert read(snapshot, next(folders)) == at_cut
                snapshot.release()
            elif op[0] == "clear":
                backend.clear()
                model.clear()
        snapshot = backend.snapshot()
        assert read(snapshot, next(folders)) == model


def test_a_snapshot_packs_only_the_key_groups_written_since_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = MemoryStateBackend()
    for key_group in range(8):
        for i in range(100):
            backend.put(key_group, ("t/f", f"k{i}"), values(b"1"))
    packed: list[int] = []
    pack_entries = memory.pack_entries

    def counting(entries: Any, count: int) -> bytes:
        packed.append(count)
        return pack_entries(entries, count)

    monkeypatch.setattr(memory, "pack_entries", counting)

    def written(name: str) -> Model:
        snapshot = backend.snapshot()
        try:
            return read(snapshot, tmp_path / name)
        finally:
            snapshot.release()

    first = written("1")
    assert sum(packed) == 800
    assert written("2") == first  # nothing written since: every section kept
    assert sum(packed) == 800
    backend.put(3, ("t/f", "k7"), values(b"2"))
    groups = backend.unshared_groups()
    assert groups is not None
    groups[5][("t/f", "k9")] = values(b"3")  # as the slice loop writes, and tells
    backend.written({5})
    third = written("3")
    assert sum(packed) == 1000  # key groups 3 and 5 again
    assert third == {**first, (3, ("t/f", "k7")): b"2", (5, ("t/f", "k9")): b"3"}
    assert (tmp_path / "2" / memory.STATE_FILE).read_bytes() == (
        tmp_path / "1" / memory.STATE_FILE
    ).read_bytes()


def test_sections_past_the_cache_bound_are_packed_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "PACKED_CACHE_BYTES", 0)
    backend = MemoryStateBackend()
    backend.put(0, ("t/f", "a"), values(b"1"))
    for name in ("1", "2"):
        snapshot = backend.snapshot()
        assert read(snapshot, tmp_path / name) == {(0, ("t/f", "a")): b"1"}
        snapshot.release()
    assert backend._packed == {}


def test_a_snapshot_written_late_never_leaves_its_sections_to_a_newer_one(tmp_path: Path) -> None:
    backend = MemoryStateBackend()
    backend.put(0, ("t/f", "a"), values(b"1"))
    older = backend.snapshot()
    backend.put(0, ("t/f", "a"), values(b"2"))
    newer = backend.snapshot()
    assert read(older, tmp_path / "older") == {(0, ("t/f", "a")): b"1"}
    assert read(newer, tmp_path / "newer") == {(0, ("t/f", "a")): b"2"}
    older.release()
    newer.release()


def test_a_restore_replaces_the_sections_kept(tmp_path: Path) -> None:
    backend = MemoryStateBackend()
    backend.put(0, ("t/f", "a"), values(b"1"))
    snapshot = backend.snapshot()
    manifest = snapshot.write(tmp_path / "first")
    snapshot.release()
    backend.put(0, ("t/f", "a"), values(b"2"))
    snapshot = backend.snapshot()
    assert read(snapshot, tmp_path / "second") == {(0, ("t/f", "a")): b"2"}
    snapshot.release()
    backend.clear()
    backend.restore(tmp_path / "first", manifest)
    snapshot = backend.snapshot()
    assert read(snapshot, tmp_path / "third") == {(0, ("t/f", "a")): b"1"}
    snapshot.release()
