"""The state backends by name: how to make one, and how to read a snapshot it wrote.

A checkpoint's state manifest names the backend that wrote it (``manifest["backend"]``);
``read_snapshot`` picks that backend's reader, so any backend restores any other's
snapshots without the backends importing each other. A backend module is imported on
first use (RocksDB needs the ``rocksdb`` extra): the table below names it by string.

Adding a backend: one module holding a ``StateBackend`` and a ``SnapshotReader``, and one
entry in ``_KINDS`` (or ``register(name, BackendKind(...))`` at run time).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from statefun.state.base import AddressKey, StateBackend

__all__ = ["BackendKind", "SnapshotReader", "create_backend", "read_snapshot", "register"]

#: (snapshot folder, its manifest, the key groups wanted or None for all) -> every address
#: of those key groups with its values (key group, address, values)
SnapshotReader = Callable[
    [Path, Mapping[str, Any], Collection[int] | None],
    Iterator[tuple[int, AddressKey, dict[str, Any]]],
]


class BackendKind(NamedTuple):
    """A state backend: ``create(state_dir)`` makes one; ``read_snapshot`` reads what its
    snapshots wrote (into any backend)."""

    create: Callable[[str], StateBackend]
    read_snapshot: SnapshotReader


#: name -> the kind, or ``"module:attribute"`` where it is (imported on first use)
_KINDS: dict[str, BackendKind | str] = {
    "memory": "statefun.state.memory:KIND",
    "rocksdb": "statefun.state.rocksdb:KIND",
}


def register(name: str, kind: BackendKind) -> None:
    """Add (or replace) the backend ``name``."""
    _KINDS[name] = kind


def names() -> list[str]:
    return sorted(_KINDS)


def kind(name: str) -> BackendKind:
    """The backend ``name``; ``ValueError`` naming the known ones when there is none."""
    found = _KINDS.get(name)
    if found is None:
        raise ValueError(f"unknown state backend {name!r} (known: {', '.join(names())})")
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        if not isinstance(found, BackendKind):
            raise TypeError(f"{module}:{attribute} is not a BackendKind")
        _KINDS[name] = found
    return found


def create_backend(name: str, state_dir: str) -> StateBackend:
    """A new, empty backend ``name`` (``state_dir``: where a disk-based one keeps its data)."""
    return kind(name).create(state_dir)


def read_snapshot(
    directory: Path, manifest: Mapping[str, Any], key_groups: Collection[int] | None
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    """Every address in ``key_groups`` (None: all) of the snapshot in ``directory``, read by
    the backend that wrote it (``manifest["backend"]``)."""
    backend = manifest.get("backend")
    if not isinstance(backend, str) or backend not in _KINDS:
        raise ValueError(
            f"a state snapshot of an unknown backend {backend!r} (known: {', '.join(names())})"
        )
    return kind(backend).read_snapshot(directory, manifest, key_groups)
