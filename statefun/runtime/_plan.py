"""Planning: from a module to a job graph, printable as text and as Graphviz DOT.

The plan is what ``statefun plan`` prints and what ``build_job`` instantiates:

    sources -> router -> keyBy(address) -> dispatcher[0..P-1] -> sinks
                            ^                      |
                            +---- feedback <-------+

The graph is ``_graph.py``; the sources and sinks are made by their connector kinds
(``statefun.connectors``).
"""

from __future__ import annotations

from typing import Any

from statefun import connectors
from statefun._settings import Settings
from statefun.connectors import ConnectorContext, ConnectorSpec
from statefun.egress.base import Sink
from statefun.ingress.base import Source
from statefun.module._specs import ModuleSpec
from statefun.runtime._graph import Plan, make_plan
from statefun.runtime._job import Job

__all__ = ["Plan", "build_job", "make_plan"]


def _build(spec: ConnectorSpec, context: ConnectorContext, role: type[Any]) -> Any:
    """The source or sink of ``spec``, made by its connector kind."""
    kind = connectors.kind_of(spec)
    built = kind.build(spec, context)
    if not isinstance(built, role):
        raise TypeError(f"the {kind.name} kind built {built!r}, not a {role.__name__}")
    return built


def build_job(module: ModuleSpec, settings: Settings | None = None) -> Job:
    """Instantiate the plan: the job with its sources and sinks."""
    settings = settings or Settings()
    sinks: list[Sink] = [
        _build(egress, ConnectorContext(settings), Sink) for egress in module.egresses
    ]
    job = Job(module, settings, sinks=sinks)
    context = ConnectorContext(
        settings,
        replies=job.replies,
        held_replies=job.held_replies,
        unanswered=job.unanswered_calls.describe,
    )
    sources: list[Source] = [_build(ingress, context, Source) for ingress in module.ingresses]
    job.sources = sources
    return job
