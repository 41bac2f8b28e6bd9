"""A connector kind added from outside the package: one module (here, this file's top half)
and one ``register`` line, then module.yaml files use it like a built-in kind.

The toy kind ``io.example.ticks.v1/ingress`` sends one message per id of its ``ids`` list
to its ``target``: it is loaded from YAML, named in the plan, and a job built from the
module runs it; its messages reach the embedded functions and their output the file egress.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from statefun import connectors
from statefun._exceptions import ModuleError
from statefun._settings import Settings
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.ingress.base import IngressContext, Source
from statefun.module import Fields, load_module
from statefun.runtime._plan import build_job, make_plan
from statefun.sdk import StringType, TypedValue

# -- the toy kind: its spec, its source, its parser, factory and label --------------------------


@dataclass(frozen=True)
class TicksIngressSpec:
    id: str
    target: str
    ids: tuple[str, ...]
    source: str = ""


class TicksSource(Source):
    bounded = True

    def __init__(self, spec: TicksIngressSpec) -> None:
        super().__init__(spec.id)
        self.spec = spec

    async def run(self, context: IngressContext) -> None:
        value = TypedValue(StringType.typename, StringType.serializer().serialize("tick"))
        for id_ in self.spec.ids:
            await context.submit(self.spec.target, id_, value)


def parse(spec: Fields) -> TicksIngressSpec:
    ids = spec.sequence("ids", "a list of ids")
    if not ids or not all(isinstance(i, str) for i in ids):
        raise spec.fail("ids", f"expected a list of ids, got {ids!r}")
    return TicksIngressSpec(
        id=spec.typename("id"),
        target=spec.typename("target"),
        ids=tuple(ids),
        source=spec.doc.source,
    )


def build(spec: TicksIngressSpec, context: ConnectorContext) -> TicksSource:
    return TicksSource(spec)


def label(spec: TicksIngressSpec) -> str:
    return f"ticks ingress {spec.id}\n{len(spec.ids)} ids to {spec.target}"


KIND = ConnectorKind(
    "io.example.ticks.v1/ingress", "ingress", TicksIngressSpec, parse, build, label
)
connectors.register(KIND)

# -- using it ---------------------------------------------------------------------------------

MODULE = """\
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: test/*
  module: tests.integration.fns.shop:functions
---
kind: io.example.ticks.v1/ingress
spec:
  id: example/ticks
  target: test/counter
  ids: [a, b, a]
---
kind: io.pystatefun.file.v1/egress
spec:
  id: test/out
  path: out.jsonl
  deliverySemantic: at-least-once
"""


async def test_a_registered_kind_is_loaded_planned_and_run(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(MODULE)
    module = load_module(tmp_path)
    assert module.ingresses == (
        TicksIngressSpec(
            "example/ticks",
            "test/counter",
            ("a", "b", "a"),
            f"{tmp_path / 'module.yaml'}, document 2 (io.example.ticks.v1/ingress)",
        ),
    )
    settings = Settings()
    plan = make_plan(module, settings).to_text()
    assert "ticks ingress example/ticks, 3 ids to test/counter" in plan
    job = build_job(module, settings)
    assert [type(s) for s in job.sources] == [TicksSource]
    await asyncio.wait_for(job.run(), 30)
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["value"] for line in lines] == ["a=1", "b=1", "a=2"]


def test_its_errors_name_the_file_document_and_field(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(MODULE.replace("ids: [a, b, a]", "ids: []"))
    with pytest.raises(ModuleError) as raised:
        load_module(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 'module.yaml'}, document 2 (io.example.ticks.v1/ingress): spec.ids: "
        "expected a list of ids, got []"
    )


def test_an_unknown_kind_lists_the_registered_ones(tmp_path: Path) -> None:
    (tmp_path / "module.yaml").write_text(MODULE.replace("ticks.v1", "tocks.v1"))
    with pytest.raises(ModuleError) as raised:
        load_module(tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert "unknown kind 'io.example.tocks.v1/ingress'; expected one of: " in message
    assert message.endswith(", io.example.ticks.v1/ingress")
    assert "io.pystatefun.file.v1/egress" in message
