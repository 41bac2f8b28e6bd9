"""``io.pystatefun.file.v1/ingress``: messages from a JSON lines file.

Each line is an object: ``{"target": "namespace/type", "id": "...", "value": ...}`` with an
optional ``"type"`` (a typename) or ``"value_base64"`` for raw bytes; see docs/module-yaml.md.
A line that cannot become a message is logged with its file and line number and skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from statefun._exceptions import ConfigurationError
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.ingress._records import RecordError, typed_value_from_record
from statefun.ingress.base import IngressContext, Source
from statefun.module._fields import Fields, file_path
from statefun.module._specs import FileIngressSpec
from statefun.sdk._types import validate_typename

__all__ = ["KIND", "FileSource"]

log = logging.getLogger(__name__)


class FileSource(Source):
    bounded = True

    def __init__(self, ingress_id: str, path: Path) -> None:
        super().__init__(ingress_id)
        self.path = Path(path)
        self.position = 0  # lines consumed: the replay position for checkpoints
        self.rejected = 0

    async def start(self) -> None:
        if not self.path.is_file():
            raise ConfigurationError(f"ingress {self.ingress_id}: no such file {self.path}")

    async def run(self, context: IngressContext) -> None:
        lines = await asyncio.to_thread(self._read_lines)
        for number, line in enumerate(lines, start=1):
            if number <= self.position:
                continue
            if not line.strip():
                self.position = number
                continue
            try:
                typename, id_, value = self._parse(line, context)
            except RecordError as exc:
                self.position = number
                self.rejected += 1
                log.error(
                    "ingress %s: %s line %d skipped: %s", self.ingress_id, self.path, number, exc
                )
                continue
            await context.room()
            # The message and the position move together (no await in between): a
            # checkpoint sees either both or neither.
            context.emit(typename, id_, value)
            self.position = number

    def snapshot_position(self) -> Any:
        return {"line": self.position}

    async def restore_position(self, position: Any) -> None:
        self.position = int(position["line"])

    def _read_lines(self) -> list[str]:
        with self.path.open(encoding="utf-8") as source:
            return source.readlines()

    @staticmethod
    def _parse(line: str, context: IngressContext) -> tuple[str, str, object]:
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise RecordError(f"not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise RecordError("a line must be a JSON object")
        target = record.get("target")
        id_ = record.get("id")
        if not isinstance(target, str):
            raise RecordError("'target' (a function typename 'namespace/type') is missing")
        try:
            validate_typename(target, "target")
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        if not context.is_function_type(target):
            raise RecordError(f"no function type {target!r} in the module")
        if not isinstance(id_, str) or not id_:
            raise RecordError("'id' (a non-empty string) is missing")
        return target, id_, typed_value_from_record(record)


# -- the connector kind ---------------------------------------------------------------------------


def _parse(spec: Fields) -> FileIngressSpec:
    return FileIngressSpec(id=spec.typename("id"), path=file_path(spec), source=spec.doc.source)


def _build(spec: FileIngressSpec, context: ConnectorContext) -> FileSource:
    return FileSource(spec.id, spec.path)


def _label(spec: FileIngressSpec) -> str:
    return f"file ingress {spec.id}\n{spec.path}"


KIND = ConnectorKind(
    "io.pystatefun.file.v1/ingress", "ingress", FileIngressSpec, _parse, _build, _label
)
