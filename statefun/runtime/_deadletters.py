"""The dead-letter file: messages (and records) the runtime could not deliver, kept for later.

One JSON object per line (``dead_letter_path``)::

    {"seq": 17, "time_ms": 1764870000000, "target": "example/typo", "id": "x",
     "caller": null, "reason": "...", "type": "io.statefun.types/string",
     "value_base64": "..."}

* ``seq`` numbers the records of one file (and its rotated predecessor) from 1; it goes on
  from the last record found when the runtime starts, so ``statefun dead-letters show|replay``
  can name records. Lines written before records had it (no ``seq``) still read: they are
  named by their line number instead (``L<n>``).
* A record is a message (``target``, ``id``, optional ``caller``), an egress record
  (``egress``) or a state value moved out of an address (``target``, ``id``, ``state``).
* Growth is bounded: once the file is past ``dead_letter_max_bytes`` it is renamed to
  ``<path>.1`` (replacing an older one) and a new file starts; at most twice the limit is kept.
* Dead letters are at-least-once: a message dead-lettered after the last checkpoint is
  dead-lettered again after a crash (its record then appears twice, with two ``seq``). The
  file is fsynced at each checkpoint's cut when it has new records (``sync``), so a checkpoint
  that no longer replays a message never completes before the message's dead letter is
  durable.
* Logging is rate limited: at most ``_LOG_BURST`` ERROR lines per ``_LOG_WINDOW_S``, then
  one line saying how many more went to the file.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from statefun._files import fsync_dir

__all__ = ["DeadLetterFile", "LogLimiter", "read_dead_letters", "record_id"]

log = logging.getLogger("statefun.runtime.dead_letters")

_LOG_BURST = 10
_LOG_WINDOW_S = 10.0
_TAIL_BYTES = 1 << 16


class LogLimiter:
    """At most ``burst`` log lines per ``window_s`` seconds; counts the ones held back."""

    def __init__(self, burst: int = _LOG_BURST, window_s: float = _LOG_WINDOW_S) -> None:
        self.burst = burst
        self.window_s = window_s
        self._window_start = -window_s
        self._lines = 0
        self.suppressed = 0

    def allow(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now - self._window_start >= self.window_s:
            self.flush()
            self._window_start, self._lines = now, 0
        if self._lines < self.burst:
            self._lines += 1
            return True
        self.suppressed += 1
        return False

    def flush(self) -> None:
        """Log how many lines were held back, if any (at the end of a window, or at the end)."""
        if self.suppressed:
            log.error(
                "%d more dead letter(s) within %.0f s, not logged one by one (see the file)",
                self.suppressed,
                self.window_s,
            )
            self.suppressed = 0


def _seq_of(line: bytes) -> int | None:
    try:
        seq = json.loads(line).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) else None


def _last_seq(path: Path) -> int:
    """The ``seq`` of the last numbered record of ``path`` (0: none): from its last 64 KiB,
    or, when no numbered record ends there (huge values), from a scan of the whole file."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read()
            lines = tail.splitlines()
            if size > _TAIL_BYTES:
                lines = lines[1:]  # (the first may be the end of a longer line)
            for line in reversed(lines):
                seq = _seq_of(line)
                if seq is not None:
                    return seq
            if size <= _TAIL_BYTES:
                return 0
            f.seek(0)
            last = 0
            for line in f:
                seq = _seq_of(line)
                if seq is not None:
                    last = seq
            return last
    except FileNotFoundError:
        return 0


class DeadLetterFile:
    """Appends records to the dead-letter file, numbering them (see the module docstring)."""

    def __init__(self, path: str | Path, max_bytes: int = 0) -> None:
        self.path = Path(path)
        self.rotated = self.path.with_name(self.path.name + ".1")
        self.max_bytes = max_bytes
        self._seq: int | None = None
        self.limiter = LogLimiter()
        self.written = 0
        self._unsynced = False

    def _next_seq(self) -> int:
        if self._seq is None:
            self._seq = _last_seq(self.path) or _last_seq(self.rotated)
        self._seq += 1
        return self._seq

    def append(self, records: list[tuple[dict[str, Any], Any]]) -> list[int]:
        """Append ``records`` (each a dict of fields and its typed value) in one write; their
        ``seq``. OSError if the file cannot be written (the caller decides)."""
        now = int(time.time() * 1000)
        lines = []
        seqs = []
        for fields, value in records:
            seq = self._next_seq()
            seqs.append(seq)
            record = {"seq": seq, "time_ms": now, **fields}
            record["type"] = str(value.typename)
            raw = bytes(value.value) if getattr(value, "has_value", True) and value.value else b""
            record["value_base64"] = base64.b64encode(raw).decode("ascii")
            lines.append(json.dumps(record) + "\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write("".join(lines))
            size = out.tell()
        self.written += len(lines)
        self._unsynced = True
        if self.max_bytes and size > self.max_bytes:
            self.sync()
            os.replace(self.path, self.rotated)
            fsync_dir(self.path.parent)
            log.warning(
                "dead-letter file %s passed %d bytes: moved to %s", self.path, size, self.rotated
            )
        return seqs

    def sync(self) -> None:
        """Make the records appended so far durable (fsync), if there are new ones: before a
        checkpoint that no longer replays their messages completes."""
        if not self._unsynced:
            return
        self._unsynced = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def record_id(record: dict[str, Any], line_number: int) -> str:
    """The name of a record: its ``seq``, or ``L<line>`` for one written without."""
    seq = record.get("seq")
    return str(seq) if isinstance(seq, int) else f"L{line_number}"


def read_dead_letters(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, record) of every record, the rotated file's first; a line that is not a JSON object
    is reported as a record with only a ``reason`` saying so."""
    path = Path(path)
    for source in (path.with_name(path.name + ".1"), path):
        try:
            handle = source.open("r", encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        prefix = "R" if source != path else ""
        with handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if not isinstance(record, dict):
                    yield f"{prefix}L{number}", {"reason": f"{source}:{number}: not a JSON record"}
                    continue
                name = record_id(record, number)
                yield (name if name[0] != "L" else prefix + name), record
