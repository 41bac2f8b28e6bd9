"""The job graph of a module: nodes (ingresses, router, keyBy, dispatchers, timers, egresses)
and edges, printable as text, as Graphviz DOT and as JSON (the admin console draws it).

Apart from ``_plan.py`` (which builds the job itself) so that the admin server can serve the
graph without importing the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statefun import connectors
from statefun._keygroups import key_group_range
from statefun._settings import Settings
from statefun.connectors import ConnectorSpec
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    HttpEndpointSpec,
    ModuleSpec,
)

__all__ = ["Node", "Plan", "make_plan"]


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

    def to_json(self) -> dict[str, Any]:
        """Nodes (id, label lines, kind), edges (from, to, label) and function routes."""
        return {
            "nodes": [
                {"id": n.id, "label": n.label.split("\n"), "kind": n.kind} for n in self.nodes
            ],
            "edges": [{"from": a, "to": b, "label": label} for a, b, label in self.edges],
            "functions": list(self.functions),
        }


def _label(spec: ConnectorSpec) -> str:
    """The node of a source or sink, as its connector kind names it."""
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
