"""Durable writes to local files: one place for the fsync rules the runtime relies on.

A file's bytes are durable after ``fsync`` of the file; its name (a new file, a rename) only
after ``fsync`` of the directory that holds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "fsync_dir",
    "fsync_path",
    "synced_file",
    "unsynced_file",
    "write_atomically",
    "write_synced",
]


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """Make what was written to file ``path`` (or the entries of directory ``path``) durable,
    through a descriptor of its own: the bytes of a file closed unsynced are in the page cache
    and any descriptor's fsync writes them. An OSError names the path."""
    try:
        fsync_dir(path)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


@contextmanager
def synced_file(path: Path) -> Iterator[BinaryIO]:
    """A new file ``path`` to write, flushed and fsynced (not its directory) at the end of the
    ``with`` block unless it raised. An OSError (``File too large``, ``No space left``) names
    the file."""
    try:
        with path.open("wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


@contextmanager
def unsynced_file(path: Path) -> Iterator[BinaryIO]:
    """A new file ``path`` to write, not fsynced: the caller fsyncs it (``fsync_path``) with
    others at once before anything relies on it. An OSError names the file."""
    try:
        with path.open("wb") as out:
            yield out
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` and fsync it (not its directory)."""
    with synced_file(path) as out:
        out.write(data)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing, durably."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)
