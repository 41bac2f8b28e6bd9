"""Checkpoint storage: one folder per checkpoint, its metadata written last.

Layout under the checkpoint directory::

    chk-000042/                 a checkpoint's data files (state/, cut.msgpack)
    chk-000042/_metadata        JSON, written last: a folder without it is not a checkpoint
    chk-000042/_metadata.tmp    the same before its rename (``STAGED``)

The metadata lists every data file of the checkpoint with its size and CRC-32C and carries
a checksum of itself. It is written under its temporary name and fsynced in one round with
every file it lists and the folder; from then on the checkpoint is complete. The rename to
``_metadata`` (the folder fsynced again) follows off the critical path; a crash before it
leaves a folder that ``prepare`` verifies whole (the metadata's checksum and every file's)
and adopts - renaming it - or else deletes. A half-written checkpoint (no metadata, or one
that does not verify whole under its temporary name) is never restored and is deleted on the
next start. Savepoints use the same layout (``sp-...`` folders, renamed at once) and are never
deleted automatically.

Since format 3 the metadata lists every data file of the checkpoint with its size and
CRC-32C (``files``: path relative to the folder -> ``[size, crc32c]``; files hard-linked from
earlier checkpoints included; ``[size, crc32c, "prefix"]`` for the first ``size`` bytes of a
file later checkpoints append to), and carries a checksum of itself (``metadata_crc32c``: of
the rest of the metadata as canonical JSON). ``checkpoint/verify.py`` checks them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from statefun._checksums import PREFIX, crc32c, describe_mismatch, file_sum
from statefun._exceptions import CheckpointDamagedError, ConfigurationError
from statefun._files import fsync_dir, fsync_path, unsynced_file, write_atomically

__all__ = [
    "CUT_FILE",
    "FORMAT_VERSION",
    "METADATA",
    "READABLE_FORMATS",
    "STAGED",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "StagedMetadata",
    "read_checkpoint",
    "storage_path",
    "verify_files",
]

log = logging.getLogger(__name__)

METADATA = "_metadata"
#: the metadata under its temporary name: the checkpoint is complete once this file and every
#: file it lists are durable, before the rename (``prepare`` adopts such a folder)
STAGED = METADATA + ".tmp"
#: messages in flight, pending delayed messages and sink transactions of a checkpoint
CUT_FILE = "cut.msgpack"
#: 3: checksums of every file and of the metadata; 2 (still read): without checksums
FORMAT_VERSION = 3
READABLE_FORMATS = (2, 3)
#: the metadata's checksum of itself
SELF_CHECKSUM = "metadata_crc32c"
_NAME = re.compile(r"^(chk|sp)-(\d+)(?:-[\w.]+)?$")


def storage_path(location: str) -> Path:
    """A local path from a path or a ``file://`` URL (other schemes: not yet)."""
    if "://" not in location:
        return Path(location)
    url = urlparse(location)
    if url.scheme != "file":
        raise ConfigurationError(
            f"checkpoint storage {location!r}: only local paths and file:// URLs are supported"
        )
    return Path(url.path)


@dataclass(frozen=True)
class StagedMetadata:
    """A checkpoint's metadata written under a temporary name (``CheckpointStorage.stage``)."""

    folder: Path
    path: Path
    metadata: dict[str, Any]


@dataclass(frozen=True)
class CompletedCheckpoint:
    id: int
    path: Path
    metadata: dict[str, Any]

    @property
    def is_savepoint(self) -> bool:
        return bool(self.metadata.get("savepoint"))


def _canonical(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")


def seal_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` with its own checksum added."""
    rest = {k: v for k, v in metadata.items() if k != SELF_CHECKSUM}
    return {**rest, SELF_CHECKSUM: crc32c(_canonical(rest))}


def read_checkpoint(path: Path, name: str = METADATA) -> CompletedCheckpoint:
    """A complete checkpoint or savepoint folder: ConfigurationError if it is not one (no
    metadata), CheckpointDamagedError if its metadata cannot be read or fails its checksum.
    ``name``: the metadata's file (``STAGED``: a checkpoint not yet published)."""
    path = Path(path)
    meta = path / name
    if not meta.is_file():
        raise ConfigurationError(f"{path} is not a complete checkpoint or savepoint (no {name})")
    try:
        metadata = json.loads(meta.read_bytes())
    except OSError as exc:
        raise CheckpointDamagedError(str(meta), f"cannot be read: {exc}") from None
    except ValueError as exc:
        raise CheckpointDamagedError(str(meta), f"not valid JSON: {exc}") from None
    if not isinstance(metadata, dict):
        raise CheckpointDamagedError(str(meta), "not a JSON object")
    if SELF_CHECKSUM in metadata:
        rest = {k: v for k, v in metadata.items() if k != SELF_CHECKSUM}
        if crc32c(_canonical(rest)) != metadata[SELF_CHECKSUM]:
            raise CheckpointDamagedError(str(meta), "checksum mismatch (the metadata changed)")
    elif metadata.get("format") == FORMAT_VERSION or name != METADATA:
        raise CheckpointDamagedError(str(meta), f"no {SELF_CHECKSUM}")
    try:
        checkpoint_id = int(metadata["id"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointDamagedError(str(meta), "no checkpoint id") from None
    return CompletedCheckpoint(checkpoint_id, path, metadata)


def verify_files(checkpoint: CompletedCheckpoint) -> int:
    """Check every file the metadata lists (size and CRC-32C); how many bytes were read."""
    metadata = checkpoint.metadata
    files = metadata.get("files")
    if files is None:
        if metadata.get("format") == FORMAT_VERSION:
            raise CheckpointDamagedError(str(checkpoint.path / METADATA), "lists no files")
        return 0  # written before checksums
    total = 0
    for name, expected in files.items():
        path = checkpoint.path / name
        # [size, crc32c, "prefix"]: the first size bytes of a file later checkpoints append to
        prefix = len(expected) > 2 and expected[2] == PREFIX
        try:
            found = file_sum(path, int(expected[0]) if prefix else None)
        except FileNotFoundError:
            raise CheckpointDamagedError(str(path), "missing") from None
        except OSError as exc:
            raise CheckpointDamagedError(str(path), f"cannot be read: {exc}") from None
        problem = describe_mismatch((int(expected[0]), int(expected[1])), found)
        if problem is not None:
            raise CheckpointDamagedError(str(path), problem)
        total += found[0]
    return total


class CheckpointStorage:
    """Checkpoints in a local directory."""

    def __init__(self, location: str | Path, retained: int = 3) -> None:
        self.root = storage_path(str(location))
        self.retained = retained
        #: names of checkpoint folders found damaged: they do not count as retained
        self.damaged: set[str] = set()

    def prepare(self) -> None:
        """Create the directory; delete checkpoints a crash left half-written."""
        if self.retained < 2:
            log.warning(
                "checkpoints_retained=%d: a damaged checkpoint has no older one to fall back to",
                self.retained,
            )
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in self.root.iterdir():
            if folder.is_dir() and _NAME.match(folder.name) and not (folder / METADATA).exists():
                if (folder / STAGED).is_file() and self._adopt(folder):
                    continue
                log.info("deleting incomplete checkpoint %s", folder)
                shutil.rmtree(folder, ignore_errors=True)

    def _adopt(self, folder: Path) -> bool:
        """A folder whose metadata still has its temporary name: complete (True, and the
        metadata gets its name) if the metadata and every file it lists verify whole - its
        round of fsyncs ended before the crash, only the rename did not happen."""
        try:
            checkpoint = read_checkpoint(folder, STAGED)
            verify_files(checkpoint)
        except CheckpointDamagedError as exc:
            log.info("checkpoint %s was not complete (%s)", folder, exc)
            return False
        log.info("checkpoint %s was complete: its metadata takes its name", folder)
        # Whole, but perhaps only in the page cache (the process died before its fsyncs):
        # durable before the name says complete.
        files = {folder / name for name in checkpoint.metadata.get("files", {})}
        for path in sorted({*files, *(f.parent for f in files), folder / STAGED, folder.parent}):
            fsync_path(path)
        os.replace(folder / STAGED, folder / METADATA)
        fsync_dir(folder)
        return True

    def completed(self) -> list[CompletedCheckpoint]:
        """Complete checkpoints (not savepoints), oldest first."""
        found = []
        if not self.root.is_dir():
            return []
        for folder in self.root.iterdir():
            match = _NAME.match(folder.name)
            if match and match.group(1) == "chk" and (folder / METADATA).is_file():
                try:
                    found.append(read_checkpoint(folder))
                except (ConfigurationError, KeyError, ValueError) as exc:
                    log.warning("ignoring unreadable checkpoint %s: %s", folder, exc)
        return sorted(found, key=lambda c: c.id)

    def candidates(self) -> list[Path]:
        """The folders of complete checkpoints (not savepoints), newest first, from their names
        and the presence of their metadata alone (nothing is read)."""
        if not self.root.is_dir():
            return []
        found = [
            (int(match.group(2)), folder)
            for folder in self.root.iterdir()
            if (match := _NAME.match(folder.name))
            and match.group(1) == "chk"
            and (folder / METADATA).is_file()
        ]
        return [folder for _, folder in sorted(found, reverse=True)]

    def latest(self) -> CompletedCheckpoint | None:
        completed = self.completed()
        return completed[-1] if completed else None

    def next_id(self) -> int:
        ids = [0]
        if self.root.is_dir():
            for folder in self.root.iterdir():
                match = _NAME.match(folder.name)
                if match:
                    ids.append(int(match.group(2)))
        return max(ids) + 1

    def begin(self, checkpoint_id: int, savepoint: bool = False, root: Path | None = None) -> Path:
        """The (new, empty) folder for a checkpoint's data."""
        base = root or self.root
        base.mkdir(parents=True, exist_ok=True)
        name = (
            f"sp-{checkpoint_id:06d}-{int(time.time())}"
            if savepoint
            else f"chk-{checkpoint_id:06d}"
        )
        folder = base / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        return folder

    def finish(
        self, folder: Path, metadata: dict[str, Any], name_synced: bool = False
    ) -> CompletedCheckpoint:
        """Step 3 of the protocol: write the metadata (with its checksum), last and
        atomically. ``name_synced``: the folder's own name (made by ``begin``) is durable
        already (its parent was fsynced after ``begin``)."""
        metadata = seal_metadata(metadata)
        write_atomically(folder / METADATA, json.dumps(metadata, indent=1).encode("utf-8"))
        if not name_synced:
            fsync_dir(folder.parent)  # the folder's own name, made by begin()
        return CompletedCheckpoint(int(metadata["id"]), folder, metadata)

    def stage(self, folder: Path, metadata: dict[str, Any]) -> StagedMetadata:
        """Step 3, its first half: the metadata (with its checksum) written under its
        temporary name (``STAGED``), not fsynced. The caller fsyncs ``staged.path`` and the
        folder together with the checkpoint's other files: from then on the checkpoint is
        complete (a restart verifies and adopts it, ``prepare``); ``publish`` gives the
        metadata its name."""
        metadata = seal_metadata(metadata)
        path = folder / STAGED
        with unsynced_file(path) as out:
            out.write(json.dumps(metadata, indent=1).encode("utf-8"))
        return StagedMetadata(folder, path, metadata)

    def completed_from(self, staged: StagedMetadata) -> CompletedCheckpoint:
        return CompletedCheckpoint(int(staged.metadata["id"]), staged.folder, staged.metadata)

    def publish(self, staged: StagedMetadata) -> CompletedCheckpoint:
        """The metadata of a complete checkpoint (every file durable, ``staged.path``
        included) takes its name, and the folder is fsynced (the rename durable)."""
        os.replace(staged.path, staged.folder / METADATA)
        fsync_dir(staged.folder)
        return self.completed_from(staged)

    def prune(self) -> None:
        """Keep the newest ``retained`` checkpoints; savepoints are never touched. Runs once a
        newer checkpoint is complete, so the checkpoint restored last stays until then.

        Checkpoints found damaged (``damaged``) do not count: they stay until they are older
        than every retained one. From the folder names alone: this runs on every checkpoint,
        and reading every retained checkpoint's metadata (RocksDB's lists every file) would
        cost more than it tells."""
        completed = sorted(
            (int(match.group(2)), folder)
            for folder in self.root.iterdir()
            if (match := _NAME.match(folder.name))
            and match.group(1) == "chk"
            and (folder / METADATA).is_file()
        )
        intact = [(i, folder) for i, folder in completed if folder.name not in self.damaged]
        kept = intact[-self.retained :]
        oldest_kept = kept[0][0] if kept else math.inf
        for checkpoint_id, old in completed:
            if checkpoint_id < oldest_kept:
                shutil.rmtree(old, ignore_errors=True)
                self.damaged.discard(old.name)
