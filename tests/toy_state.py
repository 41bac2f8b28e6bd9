"""A toy state backend: a dict of dicts, snapshots as one msgpack file.

It follows docs/architecture.md's "How to add a state backend": a ``StateBackend``, a
snapshot, a reader, and one registration line (``register(NAME, KIND)``). The state contract
suite (tests/unit/test_state_contract.py) runs against it, and a job runs on it
(tests/integration/test_toy_state_backend.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack

from statefun._checksums import file_sum
from statefun._files import fsync_dir, write_synced
from statefun.state._codec import values_from_wire, values_to_wire
from statefun.state._registry import BackendKind, read_snapshot, register
from statefun.state.base import AddressKey, StateBackend, StateSnapshot, StateValues

NAME = "toy"
FILE = "toy-state.msgpack"


class ToyStateBackend(StateBackend):
    def __init__(self) -> None:
        self._groups: dict[int, dict[AddressKey, StateValues]] = {}

    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        group = self._groups.get(key_group)
        return None if group is None else group.get(key)

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        group = self._groups.setdefault(key_group, {})
        if values:
            group[key] = values
        else:
            group.pop(key, None)

    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        return iter(list(self._groups.get(key_group, {}).items()))

    def key_groups(self) -> list[int]:
        return sorted(kg for kg, group in self._groups.items() if group)

    def snapshot(self) -> StateSnapshot:
        # values dicts are replaced on write, never changed in place: a shallow copy is a cut
        return _ToySnapshot({kg: dict(group) for kg, group in self._groups.items() if group})

    def restore(
        self,
        directory: Path,
        manifest: Mapping[str, Any],
        key_groups: Collection[int] | None = None,
    ) -> None:
        for key_group, key, values in read_snapshot(directory, manifest, key_groups):
            self.put(key_group, key, values)

    def clear(self) -> None:
        self._groups = {}


class _ToySnapshot(StateSnapshot):
    def __init__(self, groups: dict[int, dict[AddressKey, StateValues]]) -> None:
        self._groups = groups

    def write(self, directory: Path, previous: Path | None = None) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        rows = [
            [kg, key[0], key[1], values_to_wire(values)]
            for kg, group in sorted(self._groups.items())
            for key, values in group.items()
        ]
        write_synced(directory / FILE, msgpack.packb(rows, use_bin_type=True))
        fsync_dir(directory)
        return {
            "backend": NAME,
            "key_groups": sorted(self._groups),
            "entries": len(rows),
            "checksums": {FILE: list(file_sum(directory / FILE))},
        }

    def release(self) -> None:
        self._groups = {}


def read_toy_snapshot(
    directory: Path, manifest: Mapping[str, Any], key_groups: Collection[int] | None
) -> Iterator[tuple[int, AddressKey, dict[str, Any]]]:
    wanted = None if key_groups is None else set(key_groups)
    rows = msgpack.unpackb((directory / FILE).read_bytes(), raw=False)
    for key_group, typename, id_, wire in rows:
        if wanted is None or key_group in wanted:
            yield key_group, (typename, id_), values_from_wire(wire)


KIND = BackendKind(lambda _state_dir: ToyStateBackend(), read_toy_snapshot)
register(NAME, KIND)
