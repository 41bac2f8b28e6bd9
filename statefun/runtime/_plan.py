"""Planning: from a module to a job graph, printable as text and as Graphviz DOT.

The plan is what ``statefun plan`` prints and what ``build_job`` instantiates:

    sources -> router -> keyBy(address) -> dispatcher[0..P-1] -> sinks
                            ^                      |
                            +---- feedback <-------+
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from statefun._exceptions import ConfigurationError
from statefun._http.defences import ServerOptions, server_tls_context
from statefun._keygroups import key_group_range
from statefun._settings import Settings
from statefun.checkpoint.storage import storage_path
from statefun.egress.base import Sink
from statefun.egress.file import FileSink
from statefun.egress.kafka import KafkaSink
from statefun.egress.stdout import StdoutSink
from statefun.ingress.base import Source
from statefun.ingress.file import FileSource
from statefun.ingress.http import HttpSource
from statefun.ingress.kafka import KafkaSource
from statefun.module._specs import (
    EmbeddedEndpointSpec,
    FileEgressSpec,
    FileIngressSpec,
    HttpEndpointSpec,
    HttpIngressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    ModuleSpec,
    StdoutEgressSpec,
)
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


def _ingress_label(spec: object) -> str:
    if isinstance(spec, HttpIngressSpec):
        return f"http ingress {spec.id}\n{spec.host}:{spec.port}"
    if isinstance(spec, FileIngressSpec):
        return f"file ingress {spec.id}\n{spec.path}"
    if isinstance(spec, KafkaIngressSpec):
        topics = ", ".join(t.topic for t in spec.topics)
        return f"kafka ingress {spec.id}\n{topics}"
    return str(spec)


def _egress_label(spec: object) -> str:
    if isinstance(spec, StdoutEgressSpec):
        return f"stdout egress {spec.id}"
    if isinstance(spec, FileEgressSpec):
        return f"file egress {spec.id}\n{spec.path}"
    if isinstance(spec, KafkaEgressSpec):
        return f"kafka egress {spec.id}\n{spec.delivery_semantic}"
    return str(spec)


def make_plan(module: ModuleSpec, settings: Settings) -> Plan:
    plan = Plan()
    for i, ingress in enumerate(module.ingresses):
        plan.nodes.append(Node(f"source{i}", _ingress_label(ingress), "source"))
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
        plan.nodes.append(Node(f"sink{j}", _egress_label(egress), "sink"))
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


def _wal_dir(settings: Settings, ingress_id: str) -> Path | None:
    """The HTTP ingress's write-ahead log: only with checkpoints, which make it replayable."""
    if not settings.checkpoint_dir:
        return None
    root = (
        Path(settings.http_wal_dir)
        if settings.http_wal_dir
        else storage_path(settings.checkpoint_dir).parent / "http-wal"
    )
    return root / ingress_id.replace("/", "_")


def build_job(module: ModuleSpec, settings: Settings | None = None) -> Job:
    """Instantiate the plan: the job with its sources and sinks."""
    settings = settings or Settings()
    sinks: list[Sink] = []
    for egress in module.egresses:
        if isinstance(egress, StdoutEgressSpec):
            sinks.append(StdoutSink(egress.id))
        elif isinstance(egress, FileEgressSpec):
            sinks.append(FileSink(egress.id, egress.path, egress.exactly_once))
        elif isinstance(egress, KafkaEgressSpec):
            sinks.append(KafkaSink.from_spec(egress))
    job = Job(module, settings, sinks=sinks)
    sources: list[Source] = []
    for ingress in module.ingresses:
        if isinstance(ingress, HttpIngressSpec):
            sources.append(
                HttpSource(
                    ingress.id,
                    ingress.host,
                    ingress.port,
                    ingress.max_body_bytes,
                    ingress.reply_timeout.total_seconds(),
                    ingress.max_pending,
                    replies=job.replies,
                    wal_dir=_wal_dir(settings, ingress.id),
                    wal_retained=settings.checkpoints_retained,
                    log_calls=settings.reply_release != "on-checkpoint",
                    held_replies=job.held_replies,
                    idempotency_retention_s=settings.http_idempotency_retention_s,
                    idempotency_max_keys=settings.http_idempotency_max_keys,
                    idempotency_max_reply_bytes=settings.http_idempotency_max_reply_bytes,
                    server_options=_ingress_server_options(settings, ingress),
                    unanswered=job.unanswered_calls.describe,
                )
            )
        elif isinstance(ingress, FileIngressSpec):
            sources.append(FileSource(ingress.id, ingress.path))
        elif isinstance(ingress, KafkaIngressSpec):
            sources.append(KafkaSource.from_spec(ingress))
    job.sources = sources
    return job


def _ingress_server_options(settings: Settings, ingress: HttpIngressSpec) -> ServerOptions:
    """The ``http_*`` settings with the ingress's own Host allow-list, token and TLS."""
    where = f"{ingress.source}: spec.tls"
    try:
        tls = None if ingress.tls is None else server_tls_context(*ingress.tls, where=where)
    except ValueError as exc:  # the files changed since the module was loaded
        raise ConfigurationError(str(exc)) from None
    return ServerOptions.from_settings(
        settings, allowed_hosts=ingress.allowed_hosts, token=ingress.token, tls=tls
    )
