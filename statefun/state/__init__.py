"""Keyed state backends: where each address's state values live.

``base.StateBackend`` is the interface; ``memory.MemoryStateBackend`` the default.
"""

from statefun.state.base import AddressKey, StateBackend, StateValues
from statefun.state.memory import MemoryStateBackend

__all__ = ["AddressKey", "MemoryStateBackend", "StateBackend", "StateValues"]
