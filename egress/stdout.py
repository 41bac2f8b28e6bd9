"""``io.pystatefun.stdout.v1/egress``: one JSON line per record on standard output."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.egress.base import EgressRecord, Sink, describe_typed_value
from statefun.module._fields import Fields
from statefun.module._specs import StdoutEgressSpec

__all__ = ["KIND", "StdoutSink"]


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


# -- the connector kind ---------------------------------------------------------------------------


def _parse(spec: Fields) -> StdoutEgressSpec:
    return StdoutEgressSpec(id=spec.typename("id"), source=spec.doc.source)


def _build(spec: StdoutEgressSpec, context: ConnectorContext) -> StdoutSink:
    return StdoutSink(spec.id)


def _label(spec: StdoutEgressSpec) -> str:
    return f"stdout egress {spec.id}"


KIND = ConnectorKind(
    "io.pystatefun.stdout.v1/egress", "egress", StdoutEgressSpec, _parse, _build, _label
)
