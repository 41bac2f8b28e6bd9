"""In-memory state: a dict per key group, holding a dict of values per address.

Snapshots are copy-on-write per key group: ``snapshot()`` keeps references to the current
per-key-group dicts and marks those groups shared (O(key groups)); the next ``put`` into a
shared group copies that group's dict first, once per snapshot. Values dicts are never
changed in place, so the snapshot's groups stay as they were at the cut while a worker thread
writes them out: one file (``state.msgpack``, one fsync), a section per key group - a header
``{"key_group": g, "chunks": n}`` and n msgpack chunks of ``[typename, id, values]``.

Every snapshot is complete, but a key group that nothing wrote since the previous snapshot
has the same section as then: the backend keeps each group's packed section (up to
``PACKED_CACHE_BYTES`` in all) and a snapshot writes those bytes again instead of packing the
group anew. Writes mark their group (``put``; the slice loop, which writes the dicts itself,
tells ``written``), and ``snapshot()`` drops the sections of the groups marked since the
previous one. Sections are kept per generation (one per snapshot, and per ``clear`` and
``restore``): a worker still writing an older snapshot never stores its sections as current.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Collection, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack

from statefun._checksums import HashingWriter
from statefun._exceptions import CheckpointDamagedError
from statefun._files import fsync_dir, synced_file, unsynced_file
from statefun.state._codec import pack_entries, values_from_wire
from statefun.state._registry import BackendKind, read_snapshot
from statefun.state.base import (
    AddressKey,
    StateBackend,
    StateSnapshot,
    StateValues,
    drain,
)

__all__ = ["KIND", "MemoryStateBackend", "MemoryStateSnapshot", "read_memory_snapshot"]

log = logging.getLogger(__name__)

FORMAT = 2
STATE_FILE = "state.msgpack"
#: addresses per msgpack chunk of a key-group file (the GIL is free between chunks)
CHUNK = 2048
#: addresses of a key group sorted per step of ``ids_in_steps``
IDS_STEP = 512
#: the packed sections of unchanged key groups kept for the next snapshot, at most
PACKED_CACHE_BYTES = 64 * 1024 * 1024


class MemoryStateBackend(StateBackend):
    """The default backend. Values dicts are replaced on write, never changed in place."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[AddressKey, StateValues]] = {}
        #: key groups whose dict a live snapshot references: copy before the next write
        self._shared: set[int] = set()
        self._live: list[MemoryStateSnapshot] = []
        #: guards _live, _packed and _generation (snapshots are written, and released, in
        #: other threads)
        self._lock = threading.Lock()
        #: key groups written since the last snapshot (their packed sections are stale)
        self._stale_groups: set[int] = set()
        #: key group -> its packed section, as the snapshots of ``_generation`` write it
        self._packed: dict[int, bytes] = {}
        self._packed_bytes = 0
        self._generation = 0

    def unshared_groups(self) -> dict[int, dict[AddressKey, StateValues]] | None:
        """The key groups' live dicts while no snapshot shares any of them, else None.

        For a caller that, within one synchronous step of the event loop, reads them and
        stores a non-empty value for a key of a group that exists directly (what ``get`` and
        ``put`` then do, without their calls: the dispatchers' slice loop); anything else goes
        through ``put``. Only ``snapshot``, which runs on the event loop, shares groups, so the
        answer holds for the whole step (a release in another thread only ends a sharing)."""
        return None if self._shared else self._groups

    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        group = self._groups.get(key_group)
        return None if group is None else group.get(key)

    def written(self, key_groups: Collection[int]) -> None:
        """``key_groups`` were written through ``unshared_groups``' dicts (not ``put``)."""
        self._stale_groups.update(key_groups)

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        self._stale_groups.add(key_group)
        group = self._groups.get(key_group)
        shared = self._shared
        if shared and key_group in shared:
            # Copy-on-write: the snapshot keeps the old dict.
            group = self._groups[key_group] = dict(group or {})
            shared.discard(key_group)
        if values:
            if group is None:
                group = self._groups[key_group] = {}
            group[key] = values
        elif group is not None:
            group.pop(key, None)

    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        return iter(list(self._groups.get(key_group, {}).items()))

    def ids(self, key_group: int, typename: str, after: str | None, limit: int) -> list[str]:
        return drain(self.ids_in_steps(key_group, typename, after, limit))

    def ids_in_steps(
        self, key_group: int, typename: str, after: str | None, limit: int
    ) -> Generator[None, None, list[str]]:
        """Sorts the group's ids ``IDS_STEP`` at a time and merges each run into the
        smallest ``limit`` so far (a step each): never one sort of a whole large group (a
        million addresses in 128 groups: 7,800 each)."""
        group = self._groups.get(key_group)
        if not group or limit <= 0:
            return []
        keys = list(group)  # a copy: the event loop may write between steps
        smallest: list[str] = []
        for start in range(0, len(keys), IDS_STEP):
            if start:
                yield
            run = [
                id_
                for kind, id_ in keys[start : start + IDS_STEP]
                if kind == typename and (after is None or id_ > after)
            ]
            if run:
                smallest += run
                smallest.sort()  # a sorted list and a run: Timsort merges them
                del smallest[limit:]
        return smallest

    def key_groups(self) -> list[int]:
        return sorted(k for k, v in self._groups.items() if v)

    def clear(self) -> None:
        # Live snapshots keep their own references to the groups they hold.
        self._groups = {}
        self._shared = set()
        self._forget_packed()

    def _forget_packed(self) -> None:
        """Every packed section is stale (the groups were replaced)."""
        with self._lock:
            self._generation += 1
            self._packed = {}
            self._packed_bytes = 0

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> MemoryStateSnapshot:
        groups = {k: v for k, v in self._groups.items() if v}
        stale, self._stale_groups = self._stale_groups, set()
        with self._lock:  # with the marks: a release() in a worker must not clear them
            self._shared = set(groups)
            self._generation += 1
            packed = self._packed
            for key_group in stale:
                section = packed.pop(key_group, None)
                if section is not None:
                    self._packed_bytes -= len(section)
            snap = MemoryStateSnapshot(self, groups, self._generation)
            self._live.append(snap)
        return snap

    def _section(self, generation: int, key_group: int) -> bytes | None:
        """The packed section of ``key_group`` for a snapshot of ``generation``, if kept."""
        with self._lock:
            return self._packed.get(key_group) if generation == self._generation else None

    def _keep_section(self, generation: int, key_group: int, section: bytes) -> None:
        """Keep ``section`` for the next snapshots, if it is still current and there is room."""
        with self._lock:
            if generation != self._generation or key_group in self._packed:
                return
            if self._packed_bytes + len(section) > PACKED_CACHE_BYTES:
                return
            self._packed[key_group] = section
            self._packed_bytes += len(section)

    def _release(self, snap: MemoryStateSnapshot) -> None:
        with self._lock:
            if snap in self._live:
                self._live.remove(snap)
            if not self._live:
                # Rebinding is atomic: a put on the event loop sees the old set or the new one,
                # and at worst copies a group once more.
                self._shared = set()

    def restore(
        self,
        directory: Path,
        manifest: Mapping[str, Any],
        key_groups: Collection[int] | None = None,
    ) -> None:
        """Load a snapshot (any format); the cyclic GC is paused meanwhile.

        Restoring creates millions of long-lived objects and nothing to collect: the GC's
        full collections would only walk them again and again (about twice the time).
        """
        started = time.perf_counter()
        self._forget_packed()
        entries = read_snapshot(directory, manifest, key_groups)
        count = 0
        groups = self._groups
        collecting = gc.isenabled()
        gc.disable()
        try:
            for key_group, key, values in entries:
                group = groups.get(key_group)
                if group is None or key_group in self._shared:
                    group = groups[key_group] = dict(group or {})
                    self._shared.discard(key_group)
                group[key] = values
                count += 1
        finally:
            if collecting:
                gc.enable()
        log.info(
            "restored %d address(es) from %s in %.3f s",
            count,
            directory,
            time.perf_counter() - started,
        )


class MemoryStateSnapshot(StateSnapshot):
    """The per-key-group dicts as they were at the cut."""

    def __init__(
        self,
        backend: MemoryStateBackend,
        groups: dict[int, dict[AddressKey, StateValues]],
        generation: int,
    ) -> None:
        self._backend: MemoryStateBackend | None = backend
        self._groups = groups
        self._generation = generation  # (of the backend's packed sections)

    def write(self, directory: Path, previous: Path | None = None) -> dict[str, Any]:
        """All key groups into one file, fsynced once (see the module docstring).

        ``previous`` is not used: every checkpoint of the memory backend is complete.
        """
        return self._write(directory, sync=True)[0]

    def write_unsynced(
        self, directory: Path, previous: Path | None = None
    ) -> tuple[dict[str, Any], list[Path]]:
        return self._write(directory, sync=False)

    def _write(self, directory: Path, sync: bool) -> tuple[dict[str, Any], list[Path]]:
        if self._backend is None:
            raise RuntimeError("this state snapshot was released")
        directory.mkdir(parents=True, exist_ok=True)
        total_entries = 0
        written: list[int] = []
        groups = self._groups
        since_yield = 0
        path = directory / STATE_FILE
        backend, generation = self._backend, self._generation
        with synced_file(path) if sync else unsynced_file(path) as file:
            out = HashingWriter(file)  # the checksum, computed as the bytes are written
            for key_group in sorted(groups):
                group = groups[key_group]
                if not group:
                    continue
                section = backend._section(generation, key_group)
                if section is None:  # written since the last snapshot (or not kept)
                    left = len(group)
                    parts = [msgpack.packb({"key_group": key_group, "chunks": -(-left // CHUNK)})]
                    # The group's dict is never changed once shared: iterate it in place.
                    entries = iter(group.items())
                    while left:
                        count = min(left, CHUNK)
                        parts.append(pack_entries(entries, count))
                        left -= count
                        since_yield += count
                        if since_yield >= CHUNK:
                            # Let the event loop have the GIL now and then: not per key group,
                            # as taking it back costs up to the switch interval each time.
                            since_yield = 0
                            time.sleep(0)
                    section = b"".join(parts)
                    backend._keep_section(generation, key_group, section)
                out.write(section)
                total_entries += len(group)
                written.append(key_group)
            total_bytes = out.tell()
        if sync:
            fsync_dir(directory)
        manifest = {
            "backend": "memory",
            "format": FORMAT,
            "key_groups": written,
            "entries": total_entries,
            "bytes": total_bytes,
            "checksums": {STATE_FILE: list(out.sum)},
        }
        return manifest, [] if sync else [path, directory]

    def release(self) -> None:
        backend, self._backend = self._backend, None
        self._groups = {}
        if backend is not None:
            backend._release(self)


def read_memory_snapshot(
    directory: Path, manifest: Mapping[str, Any], key_groups: Collection[int] | None
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    """Every address of a memory-format snapshot in ``key_groups`` (None: all)."""
    if manifest.get("backend") != "memory" or manifest.get("format") != FORMAT:
        raise ValueError(
            f"not a memory state snapshot (format {FORMAT}): "
            f"{manifest.get('backend')!r} format {manifest.get('format')!r}"
        )
    wanted = None if key_groups is None else set(key_groups)
    path = directory / STATE_FILE
    try:
        with path.open("rb") as data:
            size = os.fstat(data.fileno()).st_size
            if manifest.get("bytes") is not None and size != manifest["bytes"]:
                raise CheckpointDamagedError(
                    str(path), f"{size} bytes, {manifest['bytes']} expected (truncated or changed)"
                )
            unpacker = msgpack.Unpacker(data, raw=False, max_buffer_size=0)
            entries = 0
            # Iterating an Unpacker stops quietly at a record cut short: the counts tell.
            for header in unpacker:
                key_group = int(header["key_group"])  # the stored key group is the truth
                keep = wanted is None or key_group in wanted
                for _ in range(int(header["chunks"])):
                    chunk = next(unpacker, None)
                    if chunk is None:
                        raise ValueError(f"key group {key_group}: ends before its last chunk")
                    entries += len(chunk)
                    if keep:
                        for typename, id_, wire in chunk:
                            yield key_group, (typename, id_), values_from_wire(wire)
            if unpacker.tell() != size:
                raise ValueError(f"a record cut short at byte {unpacker.tell()} of {size}")
            if manifest.get("entries") is not None and entries != manifest["entries"]:
                raise ValueError(f"{entries} addresses, {manifest['entries']} expected")
    except CheckpointDamagedError:
        raise
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:  # whatever the bytes make msgpack or the decoding raise
        raise CheckpointDamagedError(str(path), f"does not decode: {exc!r}") from exc


#: the registry's entry (``state/_registry.py``)
KIND = BackendKind(lambda _state_dir: MemoryStateBackend(), read_memory_snapshot)
