"""Keyed state backends: where each address's state values live.

``base.StateBackend`` is the interface; ``memory.MemoryStateBackend`` the default;
``rocksdb.RocksDBStateBackend`` (needs the ``rocksdb`` extra) for state larger than memory.
"""

from statefun.state.base import AddressKey, StateBackend, StateSnapshot, StateValues
from statefun.state.memory import MemoryStateBackend

__all__ = ["AddressKey", "MemoryStateBackend", "StateBackend", "StateSnapshot", "StateValues"]
