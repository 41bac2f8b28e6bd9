"""A write-ahead log for the HTTP ingress: what makes an HTTP request replayable.

A message is acknowledged only once it is durable here. Records are appended to segment files
(``wal-<first sequence number>.log``) and fsynced in groups: every request that arrived while
the previous fsync ran shares the next one. Each record is framed as
``length (4 bytes) | crc32 (4 bytes) | msgpack [seq, typename, id, caller, type, has, value]``,
followed by ``[key, fingerprint, accepted_ms]`` when the request carried an ``Idempotency-Key``
(records without it, as older segments hold, have seven fields); a torn record at the end of
the last segment (a crash during a write) is cut off on open.

The checkpoint keeps the sequence number of the last record handed to the runtime; after a
restart every later record is replayed. Segments whose records are all covered by the oldest
of the last ``retained`` complete checkpoints are deleted: a restart that falls back past a
damaged newest checkpoint to an older retained one still finds every record after that one's
cut (``trim`` is told each completed checkpoint's sequence number, in order; after a restart
nothing is deleted until ``retained`` checkpoints have completed again).
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from statefun._files import fsync_dir

__all__ = ["WriteAheadLog", "frame", "read_frames"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_SEGMENT_BYTES = 64 << 20


def frame(record: list[Any]) -> bytes:
    """One record as it is stored: length, crc32, msgpack body."""
    body: bytes = msgpack.packb(record, use_bin_type=True)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def read_frames(path: Path) -> Iterator[tuple[int, list[Any]]]:
    """(offset after the record, record) of each whole, intact record of a file, up to the
    first torn or damaged one."""
    with path.open("rb") as f:
        data = f.read()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        body = data[offset + _HEADER.size : offset + _HEADER.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            return
        offset += _HEADER.size + length
        yield offset, msgpack.unpackb(body, raw=False)


def _segment_start(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])


class WriteAheadLog:
    """Append-only, fsynced in groups; blocking methods run in a worker thread."""

    def __init__(
        self, directory: Path, segment_bytes: int = _SEGMENT_BYTES, retained: int = 3
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        #: sequence numbers of the last ``retained`` completed checkpoints, oldest first
        self._checkpointed: deque[int] = deque(maxlen=max(1, retained))
        self.last_seq = 0
        self._file: Any = None
        self._size = 0

    def open(self) -> None:
        """Find the last record (cutting off a torn tail) and open the last segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        segments = self.segments()
        if segments:
            last = segments[-1]
            good, last_seq = self._scan(last)
            if good < last.stat().st_size:
                log.warning("WAL %s: cutting off a torn record at byte %d", last, good)
                with last.open("r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            if last_seq:
                self.last_seq = last_seq
            elif len(segments) > 1:
                self.last_seq = self._scan(segments[-2])[1]
            else:
                self.last_seq = _segment_start(last) - 1
            self._file = last.open("ab")
            self._size = good
        else:
            self._new_segment()

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("wal-*.log"), key=_segment_start)

    def _new_segment(self) -> None:
        if self._file is not None:
            self._file.close()
        path = self.directory / f"wal-{self.last_seq + 1:012d}.log"
        self._file = path.open("ab")
        self._size = 0
        fsync_dir(self.directory)

    def append(self, records: list[list[Any]]) -> int:
        """Append records (each without its sequence number), fsync once; the last seq."""
        if self._size >= self.segment_bytes:
            self._new_segment()
        chunks = []
        for record in records:
            self.last_seq += 1
            chunks.append(frame([self.last_seq, *record]))
        data = b"".join(chunks)
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._size += len(data)
        return self.last_seq

    def read_after(self, seq: int) -> Iterator[list[Any]]:
        """Every record with a sequence number above ``seq``, in order: [seq, ...fields]."""
        for segment in self.segments():
            for _, record in self._records(segment):
                if record[0] > seq:
                    yield record

    def trim(self, up_to_seq: int) -> int:
        """A checkpoint covering the records <= ``up_to_seq`` completed: delete the segments
        that hold only records the oldest of the last ``retained`` checkpoints covers; how
        many were deleted."""
        self._checkpointed.append(up_to_seq)
        if len(self._checkpointed) < (self._checkpointed.maxlen or 1):
            return 0
        up_to_seq = self._checkpointed[0]
        segments = self.segments()
        deleted = 0
        for current, following in itertools.pairwise(segments):
            if _segment_start(following) - 1 <= up_to_seq:
                current.unlink(missing_ok=True)
                deleted += 1
            else:
                break
        return deleted

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def _records(path: Path) -> Iterator[tuple[int, list[Any]]]:
        """(offset after the record, record) of each whole, intact record of a segment."""
        return read_frames(path)

    def _scan(self, path: Path) -> tuple[int, int]:
        """(bytes of whole records, last seq in them) of a segment."""
        good = last = 0
        for end, record in self._records(path):
            good, last = end, record[0]
        return good, last
