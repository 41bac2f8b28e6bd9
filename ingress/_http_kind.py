"""The connector kind ``io.pystatefun.http.v1/ingress``: its spec from YAML, the HTTP source
made with the job's replies and settings, its plan label (the source is ``http.py``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from statefun._exceptions import ConfigurationError
from statefun._http.defences import ServerOptions, server_tls_context
from statefun._settings import Settings
from statefun.checkpoint.storage import storage_path
from statefun.connectors import ConnectorContext, ConnectorKind
from statefun.ingress.http import HttpSource
from statefun.module._fields import Fields
from statefun.module._http_options import ingress_allowed_hosts, ingress_tls, ingress_token
from statefun.module._specs import HttpIngressSpec

__all__ = ["KIND", "server_options", "wal_dir"]


def _parse(spec: Fields) -> HttpIngressSpec:
    return HttpIngressSpec(
        id=spec.typename("id"),
        host=spec.string("host", "a host name or address", "127.0.0.1"),
        port=spec.integer("port", 8090, low=0, high=65535),
        max_body_bytes=spec.integer("maxBodySize", 1 << 20),
        reply_timeout=spec.duration("replyTimeout", timedelta(seconds=30)),
        max_pending=spec.integer("maxPending", 10_000),
        source=spec.doc.source,
        allowed_hosts=ingress_allowed_hosts(spec),
        token=ingress_token(spec),
        tls=ingress_tls(spec),
    )


def _build(spec: HttpIngressSpec, context: ConnectorContext) -> HttpSource:
    settings = context.settings
    return HttpSource(
        spec.id,
        spec.host,
        spec.port,
        spec.max_body_bytes,
        spec.reply_timeout.total_seconds(),
        spec.max_pending,
        replies=context.replies,
        wal_dir=wal_dir(settings, spec.id),
        wal_retained=settings.checkpoints_retained,
        log_calls=settings.reply_release != "on-checkpoint",
        held_replies=context.held_replies,
        idempotency_retention_s=settings.http_idempotency_retention_s,
        idempotency_max_keys=settings.http_idempotency_max_keys,
        idempotency_max_reply_bytes=settings.http_idempotency_max_reply_bytes,
        server_options=_server_options(settings, spec),
        unanswered=context.unanswered,
    )


def wal_dir(settings: Settings, ingress_id: str) -> Path | None:
    """The HTTP ingress's write-ahead log: only with checkpoints, which make it replayable."""
    if not settings.checkpoint_dir:
        return None
    root = (
        Path(settings.http_wal_dir)
        if settings.http_wal_dir
        else storage_path(settings.checkpoint_dir).parent / "http-wal"
    )
    return root / ingress_id.replace("/", "_")


def _server_options(settings: Settings, ingress: HttpIngressSpec) -> ServerOptions:
    """The ``http_*`` settings with the ingress's own Host allow-list, token and TLS."""
    where = f"{ingress.source}: spec.tls"
    try:
        tls = None if ingress.tls is None else server_tls_context(*ingress.tls, where=where)
    except ValueError as exc:  # the files changed since the module was loaded
        raise ConfigurationError(str(exc)) from None
    return ServerOptions.from_settings(
        settings, allowed_hosts=ingress.allowed_hosts, token=ingress.token, tls=tls
    )


#: the ingress's server options from the settings (a clustered worker builds its sources too)
server_options = _server_options


def _label(spec: HttpIngressSpec) -> str:
    return f"http ingress {spec.id}\n{spec.host}:{spec.port}"


KIND = ConnectorKind(
    "io.pystatefun.http.v1/ingress", "ingress", HttpIngressSpec, _parse, _build, _label
)
