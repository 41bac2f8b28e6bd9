"""Planning: from a module to a job graph, printable as text and as Graphviz DOT.

The plan is what ``statefun plan`` prints and what ``build_job`` instantiates:

    sources -> router -> keyBy(address) -> dispatcher[0..P-1] -> sinks
                            ^                      |
                            +---- feedback <-------+
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statefun import connectors
from statefun._keygroups import key_group_range
from statefun._settings import Settings
from statefun.connectors import ConnectorContext, ConnectorSpec
from statefun.egress.base import Sink
from statefun.ingress.base import Source
from statefun.module._specs import EmbeddedEndpointSpec, HttpEndpointSpec, ModuleSpec
from statefun.runtime._job import Job

__all__ = ["Plan", "build_job", "make_plan"]


@dataclass
class Node:
    id: str
    label: str  # lines joined with "\n": one line each in text, a multi-line box in DOT
    kind: str  # source | operator | dispatcher | sink


@dataclass
class Plan:
    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, label)
    functions: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the stages and their sizes."""
        count = {kind: sum(1 for n in self.nodes if n.kind == kind) for kind in ("source", "sink")}
        dispatchers = sum(1 for n in self.nodes if n.kind == "dispatcher")
        keyby = next(n.label for n in self.nodes if n.id == "keyby").replace("\n", ", ")
        return (
            f"{count['source']} ingress(es) -> router -> {keyby} -> {dispatchers} dispatcher "
            f"subtask(s) (+ feedback, timers) -> {count['sink']} egress(es)"
        )

    def to_text(self) -> str:
        lines = ["job plan", "  nodes:"]
        lines += [
            f"    {n.id:<16} {n.kind:<11} {n.label.replace(chr(10), ', ')}" for n in self.nodes
        ]
        lines.append("  edges:")
        lines += [
            f"    {a} -> {b}" + (f"  [{label}]" if label else "") for a, b, label in self.edges
        ]
        lines.append("  functions:")
        lines += [f"    {f}" for f in self.functions] or ["    (none)"]
        return "\n".join(lines)

    def to_dot(self) -> str:
        shapes = {"source": "invhouse", "sink": "house", "dispatcher": "box3d", "operator": "box"}
        out = ["digraph job {", "  rankdir=LR;", '  node [fontname="Helvetica"];']
        for n in self.nodes:
            label = n.label.replace('"', '\\"').replace("\n", "\\n")
            out.append(f'  "{n.id}" [label="{label}", shape={shapes.get(n.kind, "box")}];')
        for a, b, label in self.edges:
            attrs = f' [label="{label}", style=dashed]' if label == "feedback" else ""
            out.append(f'  "{a}" -> "{b}"{attrs};')
        out.append("}")
        return "\n".join(out)


def _label(spec: ConnectorSpec) -> str:
    return connectors.kind_of(spec).label(spec)


def make_plan(module: ModuleSpec, settings: Settings) -> Plan:
    plan = Plan()
    for i, ingress in enumerate(module.ingresses):
        plan.nodes.append(Node(f"source{i}", _label(ingress), "source"))
        plan.edges.append((f"source{i}", "router", ""))
    plan.nodes.append(Node("router", "router\nrecord -> envelope", "operator"))
    plan.nodes.append(
        Node("keyby", f"keyBy(address)\n{settings.max_parallelism} key groups", "operator")
    )
    plan.edges.append(("router", "keyby", ""))
    p, max_p = settings.parallelism, settings.max_parallelism
    for i in range(p):
        groups = key_group_range(i, p, max_p)
        node = f"dispatcher{i}"
        plan.nodes.append(
            Node(
                node,
                f"dispatcher {i}/{p}\nkey groups {groups.start}..{groups.stop - 1}",
                "dispatcher",
            )
        )
        plan.edges.append(("keyby", node, ""))
        plan.edges.append((node, "keyby", "feedback"))
        plan.edges.append((node, "timers", ""))
        for j in range(len(module.egresses)):
            plan.edges.append((node, f"sink{j}", ""))
    plan.nodes.append(Node("timers", "timer service\ndelayed messages", "operator"))
    plan.edges.append(("timers", "keyby", "feedback"))
    for j, egress in enumerate(module.egresses):
        plan.nodes.append(Node(f"sink{j}", _label(egress), "sink"))
    for endpoint in module.endpoints:
        if isinstance(endpoint, HttpEndpointSpec):
            plan.functions.append(
                f"{endpoint.functions} -> remote {endpoint.url_path_template} "
                f"(batch <= {endpoint.max_num_batch_requests}, call timeout "
                f"{endpoint.transport.call})"
            )
        elif isinstance(endpoint, EmbeddedEndpointSpec):
            plan.functions.append(f"{endpoint.functions} -> embedded {endpoint.module}")
    return plan


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
