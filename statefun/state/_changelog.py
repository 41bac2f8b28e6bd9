"""The changelog of the RocksDB state backend: deltas, and the chain they form.

Interfaces: ``append_delta(path, changes, before)`` appends one delta to a chain's changelog
file and ``read_log`` reads a prefix of one back (``write_delta``/``read_delta``: the one-file
deltas of format 2, still read); a ``Chain`` is the files a checkpoint of the RocksDB backend
consists of - the last materialization (a RocksDB checkpoint) and the changelog of the deltas
written since - and ``Chain.link`` hard-links them from the previous checkpoint folder into
the next.

A delta holds every address changed between two snapshots as RocksDB stores it: the key is
``_codec.encode_key``, the value ``_codec.encode_values`` or nil for a deletion. So replaying
a delta into RocksDB is one ``put``/``delete`` per entry, with no decoding::

    {"format": 1, "entries": n, "chunks": c}    header (a msgpack map)
    [key, value, key, value, ...]                c chunks of up to CHUNK pairs (flat arrays)

A chain's deltas are appended one after another to one file, ``delta-<chain token>.msgpack``
(the token is random per materialization, so a name is never reused for other contents). Each
checkpoint hard-links the file and records how many bytes of it are its own (``size``) with
the CRC-32C of those bytes: a later checkpoint appends to the same inode, and an earlier one
reads only its prefix. So a checkpoint links a fixed number of files whatever the chain's
length (one file per delta cost a link, a metadata entry and an unlink per delta and
checkpoint), and a delta's bytes are one append, made durable by the checkpoint's own round
of fsyncs. Only the process that wrote a chain appends to it; after a restore or a failed
write the next checkpoint materializes and starts a new chain, so a torn tail left by a crash
is never appended to (nor read: it lies past every complete checkpoint's prefix).

A checkpoint folder must be complete on its own (older folders are deleted), so each one
holds every file of its chain. ``link`` hard-links them from the previous checkpoint after
checking that each is the very file this chain wrote (same device, inode and size as
remembered). If the previous folder lacks one, holds another, or links do not work there,
``link`` links nothing and the caller materializes instead.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from statefun._checksums import FileSum, HashingWriter
from statefun._exceptions import CheckpointDamagedError
from statefun._files import synced_file, unsynced_file

__all__ = [
    "Chain",
    "Identity",
    "append_delta",
    "file_identity",
    "read_delta",
    "read_log",
    "write_delta",
]

FORMAT = 1
#: entries per msgpack chunk of a delta file
CHUNK = 2048

#: (st_dev, st_ino, st_size): which file a name stands for
Identity = tuple[int, int, int]


def file_identity(path: Path) -> Identity:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size


def write_delta(path: Path, changes: Mapping[bytes, bytes | None], sync: bool = True) -> FileSum:
    """Write ``changes`` (raw key -> raw value, None: deleted) to ``path`` as a one-delta file
    (format 2 of the backend; tests), fsynced with ``sync``; its size and checksum."""
    with synced_file(path) if sync else unsynced_file(path) as file:
        out = HashingWriter(file)
        _pack_delta(out, changes)
    return out.sum


def _pack_delta(out: HashingWriter, changes: Mapping[bytes, bytes | None]) -> None:
    packer = msgpack.Packer(use_bin_type=True)
    left = len(changes)
    pairs = iter(changes.items())
    out.write(packer.pack({"format": FORMAT, "entries": left, "chunks": -(-left // CHUNK)}))
    while left:
        count = min(left, CHUNK)
        out.write(packer.pack([x for pair in itertools.islice(pairs, count) for x in pair]))
        left -= count


def append_delta(
    path: Path, changes: Mapping[bytes, bytes | None], before: FileSum | None
) -> FileSum:
    """Append ``changes`` as one delta to the changelog file ``path`` (``before``: its size and
    CRC-32C so far; None: a new file), not fsynced; the size and CRC-32C of the whole file
    after it (continued from ``before`` as the bytes are written, no read-back)."""
    try:
        with path.open("ab" if before is not None else "xb") as file:
            out = HashingWriter(file)
            if before is not None:
                size = os.fstat(file.fileno()).st_size
                if size != before[0]:  # the chain's own file, never appended elsewhere
                    raise RuntimeError(f"{path}: {size} bytes, {before[0]} expected")
                out.size, out.crc = before
            _pack_delta(out, changes)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return out.sum


class _Prefix:
    """The first ``left`` bytes of a binary file (what ``msgpack.Unpacker`` reads)."""

    __slots__ = ("_file", "left")

    def __init__(self, file: BinaryIO, left: int) -> None:
        self._file = file
        self.left = left

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self._file.read(n)
        self.left -= len(data)
        return data


def read_log(
    path: Path, size: int, deltas: int, prefixes: Collection[bytes] | None = None
) -> Iterator[tuple[bytes, bytes | None]]:
    """The (raw key, raw value or None) pairs of the first ``deltas`` deltas of the changelog
    file ``path``, in its first ``size`` bytes (what a checkpoint holds of a file later
    checkpoints append to), those whose key starts with one of ``prefixes`` (None: all)."""
    try:
        with path.open("rb") as data:
            found = os.fstat(data.fileno()).st_size
            if found < size:
                raise CheckpointDamagedError(
                    str(path), f"{found} bytes, {size} expected (truncated)"
                )
            prefix = _Prefix(data, size)
            unpacker = msgpack.Unpacker(prefix, raw=False, max_buffer_size=0)
            for _ in range(deltas):
                yield from _records(unpacker, prefixes)
            if prefix.left or unpacker.tell() != size:
                raise ValueError(f"{size - unpacker.tell()} bytes past its {deltas} deltas")
    except CheckpointDamagedError:
        raise
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:  # whatever the bytes make msgpack raise
        raise CheckpointDamagedError(str(path), f"does not decode: {exc}") from exc


def _records(
    unpacker: msgpack.Unpacker, prefixes: Collection[bytes] | None
) -> Iterator[tuple[bytes, bytes | None]]:
    """The pairs of the next delta ``unpacker`` reads (its header, then its chunks)."""
    header = next(unpacker, None)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"not a delta of format {FORMAT}")
    seen = 0
    for _ in range(int(header["chunks"])):
        flat = next(unpacker, None)
        if not isinstance(flat, list):
            break
        seen += len(flat) // 2
        for i in range(0, len(flat), 2):
            key = flat[i]
            if prefixes is None or key[:2] in prefixes:
                yield key, flat[i + 1]
    if seen != header["entries"]:
        raise ValueError(f"truncated delta ({seen} of {header['entries']} entries)")


def read_delta(
    path: Path, prefixes: Collection[bytes] | None = None
) -> Iterator[tuple[bytes, bytes | None]]:
    """The (raw key, raw value or None) pairs of a one-delta file (format 2), those whose key
    starts with one of ``prefixes`` (two-byte key-group prefixes; None: all)."""
    try:
        with path.open("rb") as data:
            yield from _records(msgpack.Unpacker(data, raw=False, max_buffer_size=0), prefixes)
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:  # whatever the bytes make msgpack raise
        raise CheckpointDamagedError(str(path), f"does not decode: {exc}") from exc


@dataclass(frozen=True)
class Chain:
    """The files of the last checkpoint written: a materialization, then its changelog."""

    #: names this chain's changelog file (random per materialization)
    token: str
    #: {"name", "size"} of each file of the materialized RocksDB checkpoint
    base: tuple[dict[str, Any], ...]
    #: {"name", "size", "deltas", "entries"} of the changelog file, None before a delta
    log: Mapping[str, Any] | None = None
    #: file name -> the identity of that file in the checkpoint folders (hard links share it)
    identities: Mapping[str, Identity] = field(default_factory=dict)
    #: file name -> (size, crc32c) it was written with (the changelog: so far): carried into
    #: each checkpoint that links the file, so that every checkpoint lists all its files
    checksums: Mapping[str, FileSum] = field(default_factory=dict)

    @property
    def delta_bytes(self) -> int:
        return 0 if self.log is None else int(self.log["size"])

    @property
    def delta_count(self) -> int:
        return 0 if self.log is None else int(self.log["deltas"])

    @property
    def log_name(self) -> str:
        return f"delta-{self.token}.msgpack"

    def names(self) -> list[str]:
        return [f["name"] for f in self.base] + ([] if self.log is None else [self.log_name])

    def with_delta(self, total: FileSum, entries: int, identity: Identity) -> Chain:
        """This chain with one more delta appended to its changelog, now ``total`` (size and
        CRC-32C of the whole file), holding ``entries`` changes."""
        name = self.log_name
        before = self.log or {"deltas": 0, "entries": 0}
        log = {
            "name": name,
            "size": total[0],
            "deltas": int(before["deltas"]) + 1,
            "entries": int(before["entries"]) + entries,
        }
        return replace(
            self,
            log=log,
            identities={**self.identities, name: identity},
            checksums={**self.checksums, name: total},
        )

    def link(self, previous: Path, directory: Path) -> bool:
        """Hard-link every file of the chain from ``previous`` into ``directory``: True, or
        False with nothing linked if ``previous`` does not hold all of them (the same files).
        """
        linked: list[Path] = []
        try:
            for name in self.names():
                target = directory / name
                os.link(previous / name, target)
                linked.append(target)
                if file_identity(target) != self.identities.get(name):
                    raise FileNotFoundError(f"{previous / name} is another file")
        except OSError:
            for target in linked:
                target.unlink(missing_ok=True)
            return False
        return True
