"""Module definitions: StateFun 3.x ``module.yaml`` files as typed values (docs/module-yaml.md)."""

from __future__ import annotations

from statefun._exceptions import ModuleError
from statefun.module._durations import format_duration, parse_duration
from statefun.module._fields import Fields
from statefun.module._loader import kinds, load_module, load_module_text
from statefun.module._specs import (
    ASYNC_TRANSPORT,
    OKHTTP_TRANSPORT,
    EgressSpec,
    EmbeddedEndpointSpec,
    EndpointSpec,
    FileEgressSpec,
    FileIngressSpec,
    FunctionTarget,
    HttpEndpointSpec,
    HttpIngressSpec,
    IngressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
    StdoutEgressSpec,
    TransportSpec,
)

__all__ = [
    "ASYNC_TRANSPORT",
    "OKHTTP_TRANSPORT",
    "EgressSpec",
    "EmbeddedEndpointSpec",
    "EndpointSpec",
    "Fields",
    "FileEgressSpec",
    "FileIngressSpec",
    "FunctionTarget",
    "HttpEndpointSpec",
    "HttpIngressSpec",
    "IngressSpec",
    "KafkaEgressSpec",
    "KafkaIngressSpec",
    "KafkaTopicSpec",
    "ModuleError",
    "ModuleSpec",
    "StdoutEgressSpec",
    "TransportSpec",
    "format_duration",
    "kinds",
    "load_module",
    "load_module_text",
    "parse_duration",
]
