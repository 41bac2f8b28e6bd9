"""The changelog of the RocksDB state backend: delta files, and the chain they form.

Interfaces: ``write_delta(path, changes)`` writes one delta file (fsynced) and ``read_delta``
reads it back; a ``Chain`` is the files a checkpoint of the RocksDB backend consists of - the
last materialization (a RocksDB checkpoint) and the deltas written since, oldest first -
and ``Chain.link`` hard-links them from the previous checkpoint folder into the next.

A delta holds every address changed between two snapshots as RocksDB stores it: the key is
``_codec.encode_key``, the value ``_codec.encode_values`` or nil for a deletion. So replaying
a delta into RocksDB is one ``put``/``delete`` per entry, with no decoding::

    {"format": 1, "entries": n, "chunks": c}    header (a msgpack map)
    [key, value, key, value, ...]                c chunks of up to CHUNK pairs (flat arrays)

Delta files are named ``delta-<chain token>-<seq>.msgpack``: the token is random per
materialization, so a name is never reused for other contents.

A checkpoint folder must be complete on its own (older folders are deleted), so each one
holds every file of its chain. The files are immutable: ``link`` hard-links them from the
previous checkpoint after checking that each is the very file this chain wrote (same device,
inode and size as remembered). If the previous folder lacks one, holds another, or links do
not work there, ``link`` links nothing and the caller materializes instead.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgpack

from statefun._checksums import FileSum, HashingWriter
from statefun._exceptions import CheckpointDamagedError
from statefun._files import synced_file

__all__ = ["Chain", "Identity", "file_identity", "read_delta", "write_delta"]

FORMAT = 1
#: entries per msgpack chunk of a delta file
CHUNK = 2048

#: (st_dev, st_ino, st_size): which file a name stands for
Identity = tuple[int, int, int]


def file_identity(path: Path) -> Identity:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size


def write_delta(path: Path, changes: Mapping[bytes, bytes | None]) -> FileSum:
    """Write ``changes`` (raw key -> raw value, None: deleted) to ``path``, fsynced; its size
    and checksum (computed as it is written)."""
    packer = msgpack.Packer(use_bin_type=True)
    left = len(changes)
    pairs = iter(changes.items())
    with synced_file(path) as file:
        out = HashingWriter(file)
        out.write(packer.pack({"format": FORMAT, "entries": left, "chunks": -(-left // CHUNK)}))
        while left:
            count = min(left, CHUNK)
            out.write(packer.pack([x for pair in itertools.islice(pairs, count) for x in pair]))
            left -= count
    return out.sum


def read_delta(
    path: Path, prefixes: Collection[bytes] | None = None
) -> Iterator[tuple[bytes, bytes | None]]:
    """The (raw key, raw value or None) pairs of a delta, those whose key starts with one of
    ``prefixes`` (two-byte key-group prefixes; None: all)."""
    try:
        with path.open("rb") as data:
            unpacker = msgpack.Unpacker(data, raw=False, max_buffer_size=0)
            header = next(unpacker, None)
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError(f"not a delta file of format {FORMAT}")
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
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:  # whatever the bytes make msgpack raise
        raise CheckpointDamagedError(str(path), f"does not decode: {exc}") from exc


@dataclass(frozen=True)
class Chain:
    """The files of the last checkpoint written: a materialization, then deltas."""

    #: names this chain's delta files (random per materialization)
    token: str
    #: {"name", "size"} of each file of the materialized RocksDB checkpoint
    base: tuple[dict[str, Any], ...]
    #: {"name", "size", "entries"} of each delta since, oldest first
    deltas: tuple[dict[str, Any], ...] = ()
    #: file name -> the identity of that file in the checkpoint folders (hard links share it)
    identities: Mapping[str, Identity] = field(default_factory=dict)
    #: file name -> (size, crc32c) it was written with: carried into each checkpoint that
    #: links the file, so that every checkpoint lists the checksums of all its files
    checksums: Mapping[str, FileSum] = field(default_factory=dict)

    @property
    def delta_bytes(self) -> int:
        return sum(int(d["size"]) for d in self.deltas)

    def names(self) -> list[str]:
        return [f["name"] for f in (*self.base, *self.deltas)]

    def next_delta_name(self) -> str:
        return f"delta-{self.token}-{len(self.deltas) + 1:06d}.msgpack"

    def with_delta(self, name: str, checksum: FileSum, entries: int, identity: Identity) -> Chain:
        return replace(
            self,
            deltas=(*self.deltas, {"name": name, "size": checksum[0], "entries": entries}),
            identities={**self.identities, name: identity},
            checksums={**self.checksums, name: checksum},
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
