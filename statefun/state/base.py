"""The state backend interface.

State is kept per address, grouped by key group so that a snapshot can be split by key-group
ranges when the parallelism changes. The values of one address are a small dict from state
name to a typed value (anything with ``typename``, ``has_value`` and ``value``). A backend
never hands out a dict that it will mutate later, and never mutates a dict given to ``put``
after the call: callers may keep either.

Snapshots (checkpoints) happen in two steps so that processing stalls only briefly:

1. ``snapshot()`` at the checkpoint's cut, on the event loop: O(key groups) or less, never
   O(state). It fixes the state as it is at that instant; later ``put`` calls do not change it.
2. ``StateSnapshot.write(directory, previous)`` in a worker thread while processing goes on:
   writes the data under ``directory`` and returns a small JSON/msgpack-able manifest
   (``write_unsynced``: the same, leaving the fsyncs to the caller).
   ``previous`` is the directory of the last completed checkpoint's state, if any: a backend
   may share unchanged files with it (hard links) instead of writing them again.
   ``release()`` then lets the backend forget the snapshot (call it in every case).

``restore(directory, manifest, key_groups)`` loads a written snapshot into a backend, keeping
only the key groups asked for (another parallelism may own another subset). The key group of
each address is read from the snapshot, never recomputed. Restoring several snapshots into
one backend merges them (rescaling from several owners of disjoint key groups).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["AddressKey", "StateBackend", "StateSnapshot", "StateValues", "drain"]

#: (function typename, id)
AddressKey = tuple[str, str]
#: state name -> typed value
StateValues = Mapping[str, Any]


def drain(steps: Generator[None, None, list[str]]) -> list[str]:
    """Run every step of ``StateBackend.ids_in_steps`` at once; its page."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return list(done.value)


class StateSnapshot(abc.ABC):
    """The state at one checkpoint's cut, not yet written anywhere."""

    @abc.abstractmethod
    def write(self, directory: Path, previous: Path | None = None) -> dict[str, Any]:
        """Write the snapshot under ``directory`` (blocking; run it in a worker thread).

        Returns the manifest that ``StateBackend.restore`` takes back: plain data (str, int,
        bool, lists, str-keyed dicts), with ``backend`` naming the format and ``checksums``
        listing every file under ``directory`` (linked ones included) as ``name -> [size,
        crc32c]``, computed while writing (``statefun._checksums``); the checkpoint moves
        them into its metadata.
        """

    def write_unsynced(
        self, directory: Path, previous: Path | None = None
    ) -> tuple[dict[str, Any], list[Path]]:
        """As ``write``, but leaving the fsyncs of the files and folders it names to the
        caller, which must make each durable (``statefun._files.fsync_path``) before relying
        on the snapshot. A checkpoint fsyncs them together with its own files, so that the file
        system commits them at once. By default: ``write``, leaving nothing."""
        return self.write(directory, previous), []

    @abc.abstractmethod
    def release(self) -> None:
        """Let the backend drop what it keeps for this snapshot (idempotent)."""


class StateBackend(abc.ABC):
    """Keyed state of the addresses whose key groups this process owns."""

    @abc.abstractmethod
    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        """The values of ``key``, or None if it has none."""

    @abc.abstractmethod
    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        """Replace the values of ``key`` (an empty mapping deletes them)."""

    @abc.abstractmethod
    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        """Every address with values in ``key_group`` (``put`` while iterating is allowed)."""

    def ids(self, key_group: int, typename: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` ids of the function type ``typename`` that hold values in
        ``key_group``, in the order of their UTF-8 bytes (Python's ``str`` order), only those
        after ``after`` (None: from the first). A page of a listing: the caller walks the key
        groups in order. Backends override this generic one (every address of the group)."""
        found = sorted(
            id_
            for (kind, id_), _values in self.items(key_group)
            if kind == typename and (after is None or id_ > after)
        )
        return found[:limit]

    def ids_in_steps(
        self, key_group: int, typename: str, after: str | None, limit: int
    ) -> Generator[None, None, list[str]]:
        """``ids`` as steps of bounded work (a generator: each ``next`` does one, and its
        return value is the page), so that a caller on the event loop can let the loop run
        between them; what is written meanwhile may or may not be in the page. Backends
        override this default (one step)."""
        return self.ids(key_group, typename, after, limit)
        yield  # (a generator)

    @abc.abstractmethod
    def key_groups(self) -> list[int]:
        """The key groups that hold state."""

    @abc.abstractmethod
    def snapshot(self) -> StateSnapshot:
        """Fix the current state for a checkpoint; cheap (see the module docstring)."""

    @abc.abstractmethod
    def restore(
        self,
        directory: Path,
        manifest: Mapping[str, Any],
        key_groups: Collection[int] | None = None,
    ) -> None:
        """Add the state written by ``StateSnapshot.write`` (``None``: every key group).

        Meant for a backend that is empty or holds other key groups than the snapshot's.
        Any backend reads the format of any other (``manifest["backend"]``).
        """

    def clear(self) -> None:
        """Drop every key group's state: undoes a ``restore`` that failed half-way (a damaged
        checkpoint), before an older checkpoint is restored instead. Slow here (every address
        is deleted); backends override it."""
        for key_group in self.key_groups():
            for key, _values in self.items(key_group):
                self.put(key_group, key, {})

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
