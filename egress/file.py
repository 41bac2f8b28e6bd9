"""``io.pystatefun.file.v1/egress``: one JSON line per record, appended to a file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from statefun.egress.base import EgressRecord, Sink, describe_typed_value

__all__ = ["FileSink"]


class FileSink(Sink):
    def __init__(self, egress_id: str, path: Path) -> None:
        super().__init__(egress_id)
        self.path = Path(path)
        self._buffer: list[str] = []

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: EgressRecord) -> None:
        line = {"egress": record.egress, **describe_typed_value(record.value)}
        self._buffer.append(json.dumps(line, ensure_ascii=False) + "\n")

    async def flush(self) -> None:
        if not self._buffer:
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        await asyncio.to_thread(self._append, text)

    def _append(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(text)
