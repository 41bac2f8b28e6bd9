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

from pathlib import Path
from typing import BinaryIO

import crc32c

__all__ = ["ALGORITHM", "FileSum", "HashingWriter", "describe_mismatch", "file_sum"]

ALGORITHM = "crc32c"
#: (size in bytes, CRC-32C)
FileSum = tuple[int, int]
_READ = 1 << 20


class HashingWriter:
    """Writes to ``out`` and keeps the size and CRC-32C of everything written."""

    __slots__ = ("_out", "crc", "size")

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.crc = 0
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        # Keeping the GIL (microseconds per chunk): a writer thread that gives it away waits
        # up to the switch interval to take it back while the event loop is busy.
        self.crc = crc32c.crc32c(data, self.crc, gil_release_mode=0)
        self.size += len(data)
        return self._out.write(data)

    def tell(self) -> int:
        return self.size

    @property
    def sum(self) -> FileSum:
        return self.size, self.crc


def file_sum(path: Path) -> FileSum:
    """The size and CRC-32C of the file at ``path`` (read in 1 MiB blocks)."""
    crc = 0
    size = 0
    with path.open("rb") as data:
        while block := data.read(_READ):
            crc = crc32c.crc32c(block, crc)
            size += len(block)
    return size, crc


def describe_mismatch(expected: FileSum, found: FileSum) -> str | None:
    """What is wrong with a file whose (size, crc) is ``found``; None if it is as expected."""
    if found[0] != expected[0]:
        return f"{found[0]} bytes, {expected[0]} expected (truncated or changed)"
    if found[1] != expected[1]:
        return f"checksum mismatch (crc32c {found[1]:08x}, {expected[1]:08x} expected)"
    return None
