"""``io.pystatefun.stdout.v1/egress``: one JSON line per record on standard output."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from statefun.egress.base import EgressRecord, Sink, describe_typed_value

__all__ = ["StdoutSink"]


class StdoutSink(Sink):
    def __init__(self, egress_id: str, stream: TextIO | None = None) -> None:
        super().__init__(egress_id)
        self._stream = stream
        self._buffer: list[str] = []

    def write(self, record: EgressRecord) -> None:
        line = {"egress": record.egress, **describe_typed_value(record.value)}
        self._buffer.append(json.dumps(line, ensure_ascii=False))
        if len(self._buffer) >= 1024:
            self._drain()

    def _drain(self) -> None:
        if self._buffer:
            stream = self._stream or sys.stdout
            stream.write("\n".join(self._buffer) + "\n")
            stream.flush()
            self._buffer.clear()

    async def flush(self) -> None:
        self._drain()
