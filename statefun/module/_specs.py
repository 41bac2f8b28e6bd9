"""What a module.yaml describes, as typed, validated, immutable values.

The loader (``_loader.py``) builds these from YAML; the planner turns them into a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from statefun.connectors import ConnectorSpec

__all__ = [
    "ASYNC_TRANSPORT",
    "OKHTTP_TRANSPORT",
    "EgressSpec",
    "EmbeddedEndpointSpec",
    "EndpointSpec",
    "FileEgressSpec",
    "FileIngressSpec",
    "FunctionTarget",
    "HttpEndpointSpec",
    "HttpIngressSpec",
    "IngressSpec",
    "KafkaEgressSpec",
    "KafkaIngressSpec",
    "KafkaTopicSpec",
    "ModuleSpec",
    "StdoutEgressSpec",
    "TransportSpec",
]


@dataclass(frozen=True)
class FunctionTarget:
    """Which function types an endpoint serves: one typename, or every type of a namespace."""

    namespace: str
    name: str | None  # None: the wildcard ``namespace/*``

    @property
    def is_wildcard(self) -> bool:
        return self.name is None

    def matches(self, typename: str) -> bool:
        namespace, _, name = typename.rpartition("/")
        return namespace == self.namespace and (self.name is None or self.name == name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name or '*'}"


ASYNC_TRANSPORT = "io.statefun.transports.v1/async"
OKHTTP_TRANSPORT = "io.statefun.transports.v1/okhttp"


@dataclass(frozen=True)
class TransportSpec:
    """The HTTP client that calls remote functions: timeouts, pool and TLS settings.

    The class defaults are those of StateFun's ``okhttp`` transport; the loader fills in the
    defaults of the transport ``type`` a module names (``async``, the default, waits longer:
    call 2 min, connect 20 s). See docs/module-yaml.md.
    """

    call: timedelta = timedelta(minutes=1)
    connect: timedelta = timedelta(seconds=10)
    read: timedelta = timedelta(seconds=10)
    write: timedelta = timedelta(seconds=10)
    type: str = OKHTTP_TRANSPORT
    pool_ttl: timedelta = timedelta(seconds=15)  # 0: pooled connections never expire
    pool_size: int = 1024
    payload_max_bytes: int = 32 * 1024 * 1024
    trust_cacerts: str | None = None  # PEM file of trusted CAs (a path, or "classpath:...")
    client_cert: str | None = None  # client certificate for mutual TLS
    client_key: str | None = None  # PKCS8 private key for mutual TLS
    client_key_password: str | None = None  # file holding the key's password
    #: headers sent with every request (``spec.headers``; ``${NAME}`` already substituted)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class HttpEndpointSpec:
    """``io.statefun.endpoints.v2/http``: remote functions behind an HTTP endpoint."""

    functions: FunctionTarget
    url_path_template: str  # may contain {function.name}
    max_num_batch_requests: int = 1000
    transport: TransportSpec = TransportSpec()
    source: str = ""  # "file.yaml, document 2 (kind)", to prefix messages with

    def url_for(self, typename: str) -> str:
        return self.url_path_template.replace("{function.name}", typename.rpartition("/")[2])


@dataclass(frozen=True)
class EmbeddedEndpointSpec:
    """``io.pystatefun.endpoints.v1/embedded``: functions run inside the runtime process."""

    functions: FunctionTarget
    module: str  # "package.module:attribute" naming a StatefulFunctions
    source: str = ""


EndpointSpec = HttpEndpointSpec | EmbeddedEndpointSpec


@dataclass(frozen=True)
class KafkaTopicSpec:
    topic: str
    value_type: str  # typename the record value is wrapped as
    targets: tuple[str, ...]  # function typenames; the record key is the id


@dataclass(frozen=True)
class KafkaIngressSpec:
    """``io.statefun.kafka.v1/ingress``."""

    id: str
    address: str  # bootstrap servers
    consumer_group_id: str  # "" when neither consumerGroupId nor group.id is given
    topics: tuple[KafkaTopicSpec, ...]
    startup_position: Literal["earliest", "latest", "group-offsets", "specific-offsets", "date"] = (
        "latest"
    )
    startup_date: str | None = None  # for startup_position == "date" (StateFun's date format)
    properties: dict[str, str] = field(default_factory=dict)
    source: str = ""
    # Where to start a partition without a usable position (Kafka's auto.offset.reset).
    auto_offset_reset: Literal["earliest", "latest"] = "latest"
    # startup_position == "specific-offsets": (topic, partition) -> first offset to read
    startup_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # startup_position == "date": startup_date as milliseconds since the epoch
    startup_timestamp_ms: int | None = None


@dataclass(frozen=True)
class HttpIngressSpec:
    """``io.pystatefun.http.v1/ingress``: POST messages to addresses (see docs/module-yaml.md)."""

    id: str
    host: str = "127.0.0.1"
    port: int = 8090
    max_body_bytes: int = 1 << 20
    reply_timeout: timedelta = timedelta(seconds=30)
    max_pending: int = 10_000  # requests accepted but not yet routed, before 503
    source: str = ""
    allowed_hosts: tuple[str, ...] | None = None  # None: loopback names on a loopback host
    token: str | None = field(default=None, repr=False)  # bearer token every request needs
    tls: tuple[Path, Path, Path | None] | None = None  # certificate, key, client CA files


@dataclass(frozen=True)
class FileIngressSpec:
    """``io.pystatefun.file.v1/ingress``: JSON lines, one message per line."""

    id: str
    path: Path
    source: str = ""


#: the built-in ingress kinds' specs (a module's ingresses may be of any connector kind)
IngressSpec = KafkaIngressSpec | HttpIngressSpec | FileIngressSpec


@dataclass(frozen=True)
class KafkaEgressSpec:
    """``io.statefun.kafka.v1/egress``."""

    id: str
    address: str
    delivery_semantic: Literal["at-least-once", "exactly-once", "none"] = "at-least-once"
    transaction_timeout: timedelta = timedelta(minutes=15)
    properties: dict[str, str] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class StdoutEgressSpec:
    """``io.pystatefun.stdout.v1/egress``: one JSON line per record on standard output."""

    id: str
    source: str = ""


@dataclass(frozen=True)
class FileEgressSpec:
    """``io.pystatefun.file.v1/egress``: one JSON line per record appended to a file."""

    id: str
    path: Path
    exactly_once: bool = True  # deliverySemantic: exactly-once (default) or at-least-once
    source: str = ""


#: the built-in egress kinds' specs (a module's egresses may be of any connector kind)
EgressSpec = KafkaEgressSpec | StdoutEgressSpec | FileEgressSpec


@dataclass(frozen=True)
class ModuleSpec:
    """Everything one or more module.yaml files define."""

    endpoints: tuple[EndpointSpec, ...] = ()
    #: ingress and egress specs, each of a kind of ``statefun.connectors``
    ingresses: tuple[ConnectorSpec, ...] = ()
    egresses: tuple[ConnectorSpec, ...] = ()
    paths: tuple[Path, ...] = ()

    def endpoint_for(self, typename: str) -> EndpointSpec | None:
        """The endpoint serving ``typename``: an exact name wins over a namespace wildcard."""
        wildcard: EndpointSpec | None = None
        for endpoint in self.endpoints:
            target = endpoint.functions
            if target.matches(typename):
                if not target.is_wildcard:
                    return endpoint
                if wildcard is None:
                    wildcard = endpoint
        return wildcard

    def egress(self, egress_id: str) -> ConnectorSpec | None:
        return next((e for e in self.egresses if e.id == egress_id), None)
