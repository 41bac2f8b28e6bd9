"""In-memory state: a dict per key group, holding a dict of values per address.

Snapshots are copy-on-write per key group: ``snapshot()`` keeps references to the current
per-key-group dicts and marks those groups shared (O(key groups)); the next ``put`` into a
shared group copies that group's dict first, once per snapshot. Values dicts are never
changed in place, so the snapshot's groups stay as they were at the cut while a worker thread
writes them out: one file (``state.msgpack``, one fsync), a section per key group - a header
``{"key_group": g, "chunks": n}`` and n msgpack chunks of ``[typename, id, values]``.
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


class MemoryStateBackend(StateBackend):
    """The default backend. Values dicts are replaced on write, never changed in place."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[AddressKey, StateValues]] = {}
        #: key groups whose dict a live snapshot references: copy before the next write
        self._shared: set[int] = set()
        self._live: list[MemoryStateSnapshot] = []
        self._lock = threading.Lock()  # guards _live (release() may run in another thread)

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

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
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

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> MemoryStateSnapshot:
        groups = {k: v for k, v in self._groups.items() if v}
        snap = MemoryStateSnapshot(self, groups)
        with self._lock:  # with the marks: a release() in a worker must not clear them
            self._shared = set(groups)
            self._live.append(snap)
        return snap

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
        self, backend: MemoryStateBackend, groups: dict[int, dict[AddressKey, StateValues]]
    ) -> None:
        self._backend: MemoryStateBackend | None = backend
        self._groups = groups

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
        with synced_file(path) if sync else unsynced_file(path) as file:
            out = HashingWriter(file)  # the checksum, computed as the bytes are written
            for key_group in sorted(groups):
                group = groups[key_group]
                if not group:
                    continue
                left = len(group)
                out.write(msgpack.packb({"key_group": key_group, "chunks": -(-left // CHUNK)}))
                # The group's dict is never changed once shared: iterate it in place.
                entries = iter(group.items())
                while left:
                    count = min(left, CHUNK)
                    out.write(pack_entries(entries, count))
                    left -= count
                    since_yield += count
                    if since_yield >= CHUNK:
                        # Let the event loop have the GIL now and then: not per key group,
                        # as taking it back costs up to the switch interval each time.
                        since_yield = 0
                        time.sleep(0)
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
