"""Checksums of checkpoint files: CRC-32C, computed while the bytes stream past.

A checkpoint records, for each file it consists of, ``[size, crc32c]`` (``FileSum``). Writers
hash what they write as they write it (``HashingWriter``), so no extra pass over the data is
needed; files copied or linked from elsewhere are hashed while copied, or carry the checksum
they were written with. ``file_sum`` reads a file back (verification, and the rare file whose
checksum is not known). CRC-32C runs at several GB/s with the CPU's instructions (the ``crc32c``
package): it finds damage - torn, truncated or changed
files - not tampering.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "ALGORITHM",
    "PREFIX",
    "FileSum",
    "HashingWriter",
    "crc32c",
    "describe_mismatch",
    "file_sum",
]

ALGORITHM = "crc32c"
#: the third element of a checkpoint's ``[size, crc32c, PREFIX]``: the checksum is of the first
#: ``size`` bytes of a file that later checkpoints append to (a RocksDB chain's changelog)
PREFIX = "prefix"
#: (size in bytes, CRC-32C)
FileSum = tuple[int, int]
_READ = 1 << 20
_function: Callable[..., int] | None = None


def _crc32c() -> Callable[..., int]:
    # Imported on first use: the package's import reads package metadata (~15 ms), which
    # every ``statefun`` command would pay otherwise.
    global _function
    if _function is None:
        import crc32c as package

        _function = package.crc32c
    return _function


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """The CRC-32C of ``data``, continuing from ``value``."""
    return _crc32c()(data, value)


class HashingWriter:
    """Writes to ``out`` and keeps the size and CRC-32C of everything written."""

    __slots__ = ("_crc", "_out", "crc", "size")

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._crc = _crc32c()
        self.crc = 0
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        # Keeping the GIL (microseconds per chunk): a writer thread that gives it away waits
        # up to the switch interval to take it back while the event loop is busy.
        self.crc = self._crc(data, self.crc, gil_release_mode=0)
        self.size += len(data)
        return self._out.write(data)

    def tell(self) -> int:
        return self.size

    @property
    def sum(self) -> FileSum:
        return self.size, self.crc


def file_sum(path: Path, limit: int | None = None) -> FileSum:
    """The size and CRC-32C of the file at ``path`` (read in 1 MiB blocks), or of its first
    ``limit`` bytes (fewer if it is shorter)."""
    crc = 0
    size = 0
    function = _crc32c()
    with path.open("rb") as data:
        while block := data.read(_READ if limit is None else min(_READ, limit - size)):
            crc = function(block, crc)
            size += len(block)
    return size, crc


def describe_mismatch(expected: FileSum, found: FileSum) -> str | None:
    """What is wrong with a file whose (size, crc) is ``found``; None if it is as expected."""
    if found[0] != expected[0]:
        return f"{found[0]} bytes, {expected[0]} expected (truncated or changed)"
    if found[1] != expected[1]:
        return f"checksum mismatch (crc32c {found[1]:08x}, {expected[1]:08x} expected)"
    return None
