"""Key groups: a stable hash of an address, and Flink's assignment of key-group ranges.

``key_group = hash(address) mod max_parallelism``; subtask ``i`` of ``p`` owns the contiguous
range Flink gives it, so state can be re-split when the parallelism changes. The hash must be
the same in every process and every run: Python's built-in ``hash()`` of a str is not.
"""

from __future__ import annotations

import zlib

__all__ = ["key_group_for", "key_group_range", "subtask_for_key_group"]


def _fmix32(h: int) -> int:
    # murmur3's finalizer: spreads crc32's bits so that close ids land in distant groups.
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_group_for(typename: str, id_: str, max_parallelism: int) -> int:
    """The key group of the address (typename, id), in [0, max_parallelism)."""
    h = zlib.crc32(id_.encode("utf-8"), zlib.crc32(typename.encode("utf-8")))
    return _fmix32(h) % max_parallelism


def subtask_for_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The subtask that owns ``key_group`` (Flink's operator index for a key group)."""
    return key_group * parallelism // max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups owned by ``subtask`` (Flink's range for an operator index)."""
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)
