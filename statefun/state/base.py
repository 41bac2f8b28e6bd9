"""The state backend interface.

State is kept per address, grouped by key group so that a snapshot can be split by key-group
ranges when the parallelism changes. The values of one address are a small dict from state
name to a typed value (anything with ``typename``, ``has_value`` and ``value``). A backend
never hands out a dict that it will mutate later, and never mutates a dict given to ``put``
after the call: callers may keep either.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["AddressKey", "StateBackend", "StateValues"]

#: (function typename, id)
AddressKey = tuple[str, str]
#: state name -> typed value
StateValues = Mapping[str, Any]


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
        """Every address with values in ``key_group``."""

    @abc.abstractmethod
    def key_groups(self) -> list[int]:
        """The key groups that hold state."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
