"""``io.pystatefun.file.v1/egress``: one JSON line per record, appended to a file.

Exactly once (the default): the sink is transactional. The lines written since the last
checkpoint cut form transaction N (``pre_commit``), stored in the checkpoint together with
the file's length at the cut; when the checkpoint completes they are appended and fsynced
(``commit``). After a crash, ``recover`` cuts the file back to that length and appends the
transaction again, so every line is in the file once, whether or not the commit had happened.
Readers see lines only once they are committed. Nothing else may write to the file.
Restoring an older checkpoint than the last committed one (the newest was damaged) cuts the
file back the same way, to that checkpoint's cut: the lines after it are written again, once.

At least once: lines are appended on every flush (every 50 ms) and may repeat after a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from statefun._exceptions import UnavailableError
from statefun._oserrors import reason
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.egress.base import EgressRecord, Sink, describe_typed_value
from statefun.module._fields import Fields, delivery_semantic, file_path
from statefun.module._specs import FileEgressSpec

__all__ = ["KIND", "FileSink"]


class FileSink(Sink):
    rewinds = True  # recover() cuts the file back to its committed length at the cut

    def __init__(self, egress_id: str, path: Path, exactly_once: bool = True) -> None:
        super().__init__(egress_id)
        self.path = Path(path)
        self.transactional = exactly_once
        self._buffer: list[str] = []
        self._sealed: dict[int, bytes] = {}
        self._size = 0  # the file's committed length
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._size = self.path.stat().st_size if self.path.exists() else 0

    def write(self, record: EgressRecord) -> None:
        line = {"egress": record.egress, **describe_typed_value(record.value)}
        self._buffer.append(json.dumps(line, ensure_ascii=False) + "\n")

    def backlog(self) -> int:
        return len(self._buffer) + sum(data.count(b"\n") for data in self._sealed.values())

    def _take(self) -> bytes:
        data = "".join(self._buffer).encode("utf-8")
        self._buffer.clear()
        return data

    async def flush(self) -> None:
        if self.transactional or not self._buffer:
            return
        data = self._take()
        async with self._lock:
            await asyncio.to_thread(self._append, data, None)

    # -- two-phase commit ---------------------------------------------------------------------

    def unsealed(self) -> int:
        return len(self._buffer) if self.transactional else 0

    def pre_commit(self, checkpoint_id: int) -> Any:
        self._sealed[checkpoint_id] = self._take()
        # Everything not committed yet (a failed checkpoint's transaction rides along).
        return {"offset": self._size, "data": self._uncommitted(checkpoint_id)}

    def _uncommitted(self, up_to: int) -> bytes:
        return b"".join(data for i, data in sorted(self._sealed.items()) if i <= up_to)

    async def commit(self, checkpoint_id: int) -> None:
        data = self._uncommitted(checkpoint_id)
        for i in [i for i in self._sealed if i <= checkpoint_id]:
            del self._sealed[i]
        if not data:
            return
        async with self._lock:
            await asyncio.to_thread(self._append, data, None)

    async def recover(self, state: Any) -> None:
        if not state:
            return
        async with self._lock:
            await asyncio.to_thread(self._append, bytes(state["data"]), int(state["offset"]))

    def _append(self, data: bytes, at: int | None) -> None:
        """Append ``data`` (at offset ``at``, cutting off anything after it) and fsync."""
        try:
            self._append_to_file(data, at)
        except OSError as exc:
            raise UnavailableError(
                f"egress {self.egress_id}: cannot write {self.path}: {reason(exc)}"
            ) from exc

    def _append_to_file(self, data: bytes, at: int | None) -> None:
        mode = "r+b" if self.path.exists() else "wb"
        with self.path.open(mode) as out:
            if at is not None and out.seek(0, os.SEEK_END) > at:
                out.truncate(at)
            out.seek(0, os.SEEK_END)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            self._size = out.tell()


# -- the connector kind ---------------------------------------------------------------------------


_SEMANTICS = ("exactly-once", "at-least-once")


def _parse(spec: Fields) -> FileEgressSpec:
    egress_id = spec.typename("id")
    path = file_path(spec)
    # A transaction timeout is accepted (as the Kafka egress's form) and has no use here: a
    # file egress's transaction ends with its checkpoint.
    semantic, _ = delivery_semantic(spec, _SEMANTICS, "exactly-once", needs_timeout=False)
    return FileEgressSpec(
        id=egress_id, path=path, exactly_once=semantic == "exactly-once", source=spec.doc.source
    )


def _build(spec: FileEgressSpec, context: ConnectorContext) -> FileSink:
    return FileSink(spec.id, spec.path, spec.exactly_once)


def _label(spec: FileEgressSpec) -> str:
    return f"file egress {spec.id}\n{spec.path}"


KIND = ConnectorKind(
    "io.pystatefun.file.v1/egress", "egress", FileEgressSpec, _parse, _build, _label
)
