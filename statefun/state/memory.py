"""In-memory state: a dict per key group, holding a dict of values per address."""

from __future__ import annotations

from collections.abc import Iterator

from statefun.state.base import AddressKey, StateBackend, StateValues

__all__ = ["MemoryStateBackend"]


class MemoryStateBackend(StateBackend):
    """The default backend. Values dicts are replaced on write, never changed in place."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[AddressKey, StateValues]] = {}

    def get(self, key_group: int, key: AddressKey) -> StateValues | None:
        group = self._groups.get(key_group)
        return None if group is None else group.get(key)

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        group = self._groups.get(key_group)
        if values:
            if group is None:
                group = self._groups[key_group] = {}
            group[key] = values
        elif group is not None:
            group.pop(key, None)

    def items(self, key_group: int) -> Iterator[tuple[AddressKey, StateValues]]:
        return iter(list(self._groups.get(key_group, {}).items()))

    def key_groups(self) -> list[int]:
        return sorted(k for k, v in self._groups.items() if v)
