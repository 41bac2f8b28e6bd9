"""Planning: from a module to a job graph, printable as text and as Graphviz DOT.

The plan is what ``statefun plan`` prints and what ``build_job`` instantiates:

    sources -> router -> keyBy(address) -> dispatcher[0..P-1] -> sinks
                            ^                      |
                            +---- feedback <-------+
"""

from __future__ import annotations

from pathlib import Path

from statefun._exceptions import ConfigurationError
from statefun._http.defences import ServerOptions, server_tls_context
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
    FileEgressSpec,
    FileIngressSpec,
    HttpIngressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    ModuleSpec,
    StdoutEgressSpec,
)
from statefun.runtime._graph import Plan, make_plan
from statefun.runtime._job import Job

__all__ = ["Plan", "build_job", "make_plan"]


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
