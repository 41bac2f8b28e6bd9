"""Verifying checkpoints and savepoints, and ``statefun checkpoint verify PATH``.

``verify_files`` checks every file a checkpoint's metadata lists against its size and
CRC-32C (restore does this before it reads anything); ``verify_data`` also decodes the cut and
every address of the state, as a restore would. Both raise ``CheckpointDamagedError`` naming the
file and what is wrong. Checkpoints of format 2 (written before checksums) have only their data
checked.

The command prints one line per checkpoint or savepoint (``ok`` or ``damaged: why``) and exits
with 0 if every one is intact, 1 otherwise. PATH is one checkpoint or savepoint folder, or a
folder holding several (a ``checkpoint_dir``, a ``savepoint_dir``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from statefun._exceptions import CheckpointDamagedError, ConfigurationError
from statefun.checkpoint.storage import (
    CUT_FILE,
    METADATA,
    CompletedCheckpoint,
    read_checkpoint,
    verify_files,
)

__all__ = [
    "HELP",
    "add_arguments",
    "relative_reason",
    "run",
    "verify_checkpoint",
    "verify_data",
    "verify_files",
]

HELP = "verify checkpoints and savepoints (checksums, and that the data decodes)"
_FOLDER = re.compile(r"^(chk|sp)-\d+(?:-[\w.]+)?$")


def verify_data(checkpoint: CompletedCheckpoint) -> dict[str, int]:
    """Decode the cut and every address of the state; what they hold (counts)."""
    import msgpack

    from statefun.checkpoint._codec import decode_envelopes, decode_timers
    from statefun.state.memory import read_memory_snapshot

    path = checkpoint.path / CUT_FILE
    try:
        cut = msgpack.unpackb(path.read_bytes(), raw=False)
        messages = len(decode_envelopes(cut["messages"]))
        timers = len(decode_timers(cut["timers"]))
    except FileNotFoundError:
        raise CheckpointDamagedError(str(path), "missing") from None
    except Exception as exc:
        raise CheckpointDamagedError(str(path), f"does not decode: {exc!r}") from exc
    manifest = checkpoint.metadata.get("state")
    state = checkpoint.path / "state"
    if not isinstance(manifest, dict):
        raise CheckpointDamagedError(str(checkpoint.path / METADATA), "lists no state")
    addresses = 0
    try:
        if manifest.get("backend") == "rocksdb":
            from statefun.state.rocksdb import read_rocksdb_snapshot

            entries: Any = read_rocksdb_snapshot(state, manifest, None)
        else:
            entries = read_memory_snapshot(state, manifest, None)
        for _ in entries:
            addresses += 1
    except CheckpointDamagedError:
        raise
    except Exception as exc:
        raise CheckpointDamagedError(str(state), f"does not decode: {exc!r}") from exc
    return {"addresses": addresses, "messages": messages, "timers": timers}


def verify_checkpoint(folder: Path) -> str:
    """Verify one checkpoint or savepoint folder fully; a one-line summary if it is intact."""
    checkpoint = read_checkpoint(folder)
    checked = verify_files(checkpoint)
    counts = verify_data(checkpoint)
    files = checkpoint.metadata.get("files")
    sums = (
        f"{len(files)} file(s), {checked} bytes match their checksums"
        if files is not None
        else "no checksums (an older format): data decodes"
    )
    return (
        f"{sums}; {counts['addresses']} address(es) with state, {counts['messages']} "
        f"message(s), {counts['timers']} delayed message(s)"
    )


def relative_reason(exc: CheckpointDamagedError, folder: Path) -> str:
    """``exc`` as ``file: reason``, the file relative to the checkpoint ``folder``."""
    try:
        name = str(Path(exc.path).relative_to(folder)) or "."
    except ValueError:
        name = exc.path
    return f"{name}: {exc.reason}"


# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify",
        help="check every file's checksum and that the data decodes; exit code 1 if any "
        "checkpoint is damaged",
    )
    verify.add_argument(
        "paths",
        metavar="PATH",
        nargs="+",
        help="a checkpoint or savepoint folder, or a folder holding several",
    )


def _folders(path: Path) -> list[Path]:
    if (path / METADATA).exists():
        return [path]
    if not path.is_dir():
        raise ConfigurationError(f"{path} is not a directory")
    return sorted(p for p in path.iterdir() if p.is_dir() and _FOLDER.match(p.name))


def run(args: argparse.Namespace) -> int:
    found = damaged = 0
    for path in map(Path, args.paths):
        try:
            folders = _folders(path)
        except ConfigurationError as exc:
            sys.stderr.write(f"statefun checkpoint verify: {exc}\n")
            damaged += 1
            continue
        for folder in folders:
            if not (folder / METADATA).exists():
                sys.stdout.write(f"{folder}: incomplete (no {METADATA}): never restored\n")
                continue
            found += 1
            try:
                summary = verify_checkpoint(folder)
            except CheckpointDamagedError as exc:
                damaged += 1
                sys.stdout.write(f"{folder}: damaged: {relative_reason(exc, folder)}\n")
            else:
                sys.stdout.write(f"{folder}: ok ({summary})\n")
    if not found and not damaged:
        sys.stderr.write(
            f"statefun checkpoint verify: no checkpoint or savepoint in {', '.join(args.paths)}\n"
        )
        return 1
    return 1 if damaged else 0
