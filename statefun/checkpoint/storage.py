"""Checkpoint storage: one folder per checkpoint, its metadata written last and atomically.

Layout under the checkpoint directory::

    chk-000042/            a checkpoint's data files (state/, cut.msgpack)
    chk-000042/_metadata   JSON, written last: a folder without it is not a checkpoint

A checkpoint is complete exactly when its ``_metadata`` exists: it is written to a temporary
file, fsynced, renamed into place, and the folder is fsynced. A half-written checkpoint (no
metadata, a crash in the middle) is never restored and is deleted on the next start.
Savepoints use the same layout (``sp-...`` folders) and are never deleted automatically.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from statefun._exceptions import ConfigurationError
from statefun._files import fsync_dir, write_atomically

__all__ = ["CheckpointStorage", "CompletedCheckpoint", "storage_path"]

log = logging.getLogger(__name__)

METADATA = "_metadata"
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
class CompletedCheckpoint:
    id: int
    path: Path
    metadata: dict[str, Any]

    @property
    def is_savepoint(self) -> bool:
        return bool(self.metadata.get("savepoint"))


def read_checkpoint(path: Path) -> CompletedCheckpoint:
    """A complete checkpoint or savepoint folder; ConfigurationError if it is not one."""
    path = Path(path)
    meta = path / METADATA
    if not meta.is_file():
        raise ConfigurationError(
            f"{path} is not a complete checkpoint or savepoint (no {METADATA})"
        )
    try:
        metadata = json.loads(meta.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigurationError(f"{meta} is not valid JSON: {exc}") from None
    return CompletedCheckpoint(int(metadata["id"]), path, metadata)


class CheckpointStorage:
    """Checkpoints in a local directory."""

    def __init__(self, location: str | Path, retained: int = 3) -> None:
        self.root = storage_path(str(location))
        self.retained = retained

    def prepare(self) -> None:
        """Create the directory; delete checkpoints a crash left half-written."""
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in self.root.iterdir():
            if folder.is_dir() and _NAME.match(folder.name) and not (folder / METADATA).exists():
                log.info("deleting incomplete checkpoint %s", folder)
                shutil.rmtree(folder, ignore_errors=True)

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

    def finish(self, folder: Path, metadata: dict[str, Any]) -> CompletedCheckpoint:
        """Step 4 of the protocol: write the metadata, last and atomically."""
        write_atomically(folder / METADATA, json.dumps(metadata, indent=1).encode("utf-8"))
        fsync_dir(folder.parent)  # the folder's own name, made by begin()
        return CompletedCheckpoint(int(metadata["id"]), folder, metadata)

    def prune(self) -> None:
        """Keep the newest ``retained`` checkpoints; savepoints are never touched.

        From the folder names alone: this runs on every checkpoint, and reading every
        retained checkpoint's metadata (RocksDB's lists every file) would cost more than it
        tells."""
        completed = sorted(
            (int(match.group(2)), folder)
            for folder in self.root.iterdir()
            if (match := _NAME.match(folder.name))
            and match.group(1) == "chk"
            and (folder / METADATA).is_file()
        )
        for _, old in completed[: max(0, len(completed) - self.retained)]:
            shutil.rmtree(old, ignore_errors=True)
