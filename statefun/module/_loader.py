"""Read StateFun 3.x module.yaml files into the typed values of ``_specs.py``.

A module file is a stream of YAML documents, each one component: ``kind`` (a typename that
selects the parser) and ``spec``. StateFun's own kinds are read as StateFun reads them:
unknown fields are ignored (with a warning) and StateFun's defaults apply. This project's
kinds (``io.pystatefun.*``) are strict. The single-document format of StateFun 3.0
(``version: "3.0"``) is read too. Every error is a ModuleError that names the file, the
document, its kind and the field. The reference is docs/module-yaml.md.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import yaml

from statefun._exceptions import ModuleError
from statefun.module._durations import DURATION_EXAMPLE, format_duration, parse_duration
from statefun.module._http_options import (
    endpoint_headers,
    ingress_allowed_hosts,
    ingress_tls,
    ingress_token,
)
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

__all__ = ["KINDS", "load_module", "load_module_text"]

_log = logging.getLogger(__name__)

Component = EndpointSpec | IngressSpec | EgressSpec
_MISSING: Any = object()
_TYPENAME = "a typename 'namespace/name'"
_URL_SCHEMES = ("http", "https", "http+unix", "https+unix")
_MODULE_REF = re.compile(r"([A-Za-z_]\w*(\.[A-Za-z_]\w*)*|[^:]+\.py):[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_DATE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})"
)
_DATE_EXAMPLE = "a date such as '2020-02-01 04:15:00.000 +0000'"


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 timestamps: StateFun reads ``date:`` values as text."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def _one_line(text: str) -> str:
    """``text`` with control characters (a newline in a key or a file name) escaped."""
    return text.translate(_CONTROL)


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class _Doc:
    """One document of one file: where errors happened, and what relative paths start from."""

    def __init__(self, file: str, number: int, base_dir: Path, kind: str | None = None) -> None:
        self.file, self.number, self.base_dir, self.kind = file, number, base_dir, kind

    @property
    def source(self) -> str:
        where = f"{self.file}, document {self.number}"
        return f"{where} ({self.kind})" if self.kind else where

    def error(self, path: str, message: str) -> ModuleError:
        return ModuleError(
            _one_line(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")
        )


class _Fields:
    """A YAML mapping read field by field; ``done()`` reports the fields nobody asked for."""

    def __init__(self, doc: _Doc, value: object, path: str, *, strict: bool) -> None:
        if not isinstance(value, dict):
            raise doc.error(path, f"expected a mapping, got {_show(value)}")
        self.doc, self.path, self.strict = doc, path, strict
        self.data = {str(k): v for k, v in value.items()}
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> ModuleError:
        return self.doc.error(self.at(key), message)

    def raw(self, key: str, expected: str, default: Any = _MISSING) -> Any:
        self.seen.add(key)
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                close = difflib.get_close_matches(key, [k for k in self.data if k not in self.seen])
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(key, f"missing; expected {expected}{hint}")
            return default
        return value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, expected: str = "a string", default: Any = _MISSING) -> Any:
        value = self.raw(key, expected, default)
        if value is default:
            return value
        if not self.strict and isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # StateFun reads a number's text where it wants a string
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected {expected}, got {_show(value)}")
        return value

    def integer(
        self, key: str, default: Any = _MISSING, *, low: int = 1, high: int = 2**31 - 1
    ) -> Any:
        expected = f"an integer from {low} to {high}"
        value = self.raw(key, expected, default)
        if value is default:
            return value
        if not self.strict and isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(key, f"expected {expected}, got {_show(value)}")
        return value

    def duration(self, key: str, default: Any = _MISSING, *, positive: bool = True) -> Any:
        value = self.raw(key, DURATION_EXAMPLE, default)
        if value is default:
            return value
        try:
            duration = parse_duration(value)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        if positive and not duration:
            raise self.fail(key, f"expected a duration longer than 0, got {value!r}")
        return duration

    def typename(self, key: str, default: Any = _MISSING) -> Any:
        value = self.string(key, _TYPENAME, default)
        return value if value is default else _typename(self.doc, self.at(key), value)

    def mapping(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, "a mapping", default)
        return (
            value
            if value is default
            else _Fields(self.doc, value, self.at(key), strict=self.strict)
        )

    def sequence(self, key: str, expected: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, expected, default)
        if value is not default and not isinstance(value, list):
            raise self.fail(key, f"expected {expected}, got {_show(value)}")
        return value

    def done(self) -> None:
        for key in sorted(set(self.data) - self.seen):
            if self.strict:
                known = ", ".join(sorted(self.seen))
                raise self.fail(key, f"unknown field; expected one of: {known}")
            _log.warning(
                "%s: %s: field ignored (StateFun ignores it too)", self.doc.source, self.at(key)
            )


def _typename(doc: _Doc, path: str, text: str, *, wildcard: bool = False) -> str:
    """Check StateFun's typename rule: exactly one '/', text on both sides."""
    namespace, sep, name = text.partition("/")
    bad_star = "*" in namespace or ("*" in name and (name != "*" or not wildcard))
    if not sep or not namespace or not name or "/" in name or bad_star:
        expected = f"{_TYPENAME} or 'namespace/*'" if wildcard else _TYPENAME
        raise doc.error(path, f"expected {expected}, got {text!r}")
    return text


def _functions(spec: _Fields) -> FunctionTarget:
    text = spec.string("functions", f"{_TYPENAME} or 'namespace/*'")
    namespace, _, name = _typename(spec.doc, spec.at("functions"), text, wildcard=True).partition(
        "/"
    )
    return FunctionTarget(namespace, None if name == "*" else name)


def _url_template(spec: _Fields) -> str:
    expected = "an http(s) URL such as 'http://localhost:8000/{function.name}'"
    url = cast(str, spec.string("urlPathTemplate", expected))
    parts = urlsplit(url)
    if parts.scheme.lower() not in _URL_SCHEMES or "://" not in url:
        raise spec.fail("urlPathTemplate", f"expected {expected}, got {url!r}")
    if parts.scheme.lower().endswith("+unix"):  # the path names the socket file
        if not re.search(r"\.sock(?=/|$)", parts.path):
            raise spec.fail(
                "urlPathTemplate",
                f"{url!r} names no socket file ending with .sock, as in "
                "http+unix:///run/functions.sock/statefun",
            )
        return url
    netloc = parts.netloc.rpartition("@")[2]  # without user:password@
    if netloc.startswith("["):  # an IPv6 address: [::1]:8000
        host, _, rest = netloc.partition("]")
        host, port = host[1:], rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = netloc.partition(":")
    if not host:
        raise spec.fail("urlPathTemplate", f"{url!r} has no host")
    if port:
        if not port.isdigit():
            raise spec.fail("urlPathTemplate", f"port {port!r} of {url!r} is not a number")
        if not 0 < int(port) <= 65535:
            raise spec.fail(
                "urlPathTemplate", f"port {int(port)} of {url!r} is out of range 1-65535"
            )
    return url


def _timeouts(fields: _Fields, defaults: dict[str, timedelta]) -> dict[str, timedelta]:
    return {key: fields.duration(key, default) for key, default in defaults.items()}


def _check_within_call(fields: _Fields, timeouts: dict[str, timedelta]) -> None:
    """StateFun's okhttp client refuses connect/read/write timeouts longer than the call."""
    call = format_duration(timeouts["call"])
    for key in ("connect", "read", "write"):
        if timeouts[key] > timeouts["call"]:
            given = "" if fields.has(key) else " (the default)"
            length = format_duration(timeouts[key])
            raise fields.fail(key, f"{length}{given} is longer than the call timeout ({call})")


def _transport(fields: _Fields | None) -> TransportSpec:
    """``spec.transport`` of an endpoint v2: StateFun's ``async`` (default) or ``okhttp``."""
    if fields is None:
        return TransportSpec(
            type=ASYNC_TRANSPORT,
            call=timedelta(minutes=2),
            connect=timedelta(seconds=20),
            read=timedelta(minutes=2),
            write=timedelta(minutes=2),
        )
    kind = fields.string("type", "a transport type", ASYNC_TRANSPORT)
    if kind not in (ASYNC_TRANSPORT, OKHTTP_TRANSPORT):
        raise fields.fail(
            "type", f"expected {ASYNC_TRANSPORT!r} or {OKHTTP_TRANSPORT!r}, got {kind!r}"
        )
    nested = fields.mapping("timeouts", None)
    ten = timedelta(seconds=10)
    if kind == OKHTTP_TRANSPORT:
        source = nested or fields
        times = _timeouts(
            source, {"call": timedelta(minutes=1), "connect": ten, "read": ten, "write": ten}
        )
        _check_within_call(source, times)
    else:
        if nested is not None:  # as StateFun: nested timeouts win, with their own defaults
            times = _timeouts(nested, {"call": timedelta(minutes=1), "connect": ten})
        else:
            times = _timeouts(
                fields, {"call": timedelta(minutes=2), "connect": timedelta(seconds=20)}
            )
        # read/write are pystatefun's own; StateFun's async client has only call and connect.
        for key in ("read", "write"):
            flat = fields.duration(key, times["call"])
            times[key] = flat if nested is None else nested.duration(key, flat)
    if nested is not None:
        nested.done()
    spec = TransportSpec(
        type=kind,
        call=times["call"],
        connect=times["connect"],
        read=times["read"],
        write=times["write"],
        pool_ttl=fields.duration("pool_ttl", timedelta(seconds=15), positive=False),
        pool_size=fields.integer("pool_size", 1024),
        payload_max_bytes=fields.integer("payload_max_bytes", 32 * 1024 * 1024),
        trust_cacerts=fields.string("trust_cacerts", "a file path", None),
        client_cert=fields.string("client_cert", "a file path", None),
        client_key=fields.string("client_key", "a file path", None),
        client_key_password=fields.string("client_key_password", "a file path", None),
    )
    fields.done()
    return spec


def _http_endpoint_v2(spec: _Fields) -> HttpEndpointSpec:
    transport = _transport(spec.mapping("transport", None))
    headers = endpoint_headers(spec)
    return HttpEndpointSpec(
        functions=_functions(spec),
        url_path_template=_url_template(spec),
        max_num_batch_requests=spec.integer("maxNumBatchRequests", 1000),
        transport=replace(transport, headers=headers) if headers else transport,
        source=spec.doc.source,
    )


def _http_endpoint_v1(spec: _Fields) -> HttpEndpointSpec:
    """The older endpoint kind: OkHttp transport, ``timeouts`` directly under ``spec``."""
    ten = timedelta(seconds=10)
    defaults = {"call": timedelta(minutes=1), "connect": ten, "read": ten, "write": ten}
    nested = spec.mapping("timeouts", None)
    times = defaults if nested is None else _timeouts(nested, defaults)
    if nested is not None:
        _check_within_call(nested, times)
        nested.done()
    return HttpEndpointSpec(
        functions=_functions(spec),
        url_path_template=_url_template(spec),
        max_num_batch_requests=spec.integer("maxNumBatchRequests", 1000),
        transport=TransportSpec(
            type=OKHTTP_TRANSPORT,
            call=times["call"],
            connect=times["connect"],
            read=times["read"],
            write=times["write"],
        ),
        source=spec.doc.source,
    )


def _embedded_endpoint(spec: _Fields) -> EmbeddedEndpointSpec:
    expected = "an object reference 'package.module:attribute' or 'path/file.py:attribute'"
    module = cast(str, spec.string("module", expected))
    if not _MODULE_REF.fullmatch(module):
        raise spec.fail("module", f"expected {expected}, got {module!r}")
    return EmbeddedEndpointSpec(functions=_functions(spec), module=module, source=spec.doc.source)


def _properties(spec: _Fields) -> dict[str, str]:
    """StateFun's ``properties``: a list of single-key mappings, values read as text."""
    expected = "a list of single-key mappings such as '- foo.config: bar'"
    items = spec.sequence("properties", expected, [])
    result: dict[str, str] = {}
    for index, item in enumerate(items):
        path = f"{spec.at('properties')}[{index}]"
        if not isinstance(item, dict) or not item:
            raise spec.doc.error(
                path, f"expected a single-key mapping such as 'foo.config: bar', got {_show(item)}"
            )
        key, value = next(iter(item.items()))
        if len(item) > 1:
            _log.warning(
                "%s: %s: only the first key (%s) is used, as StateFun does",
                spec.doc.source,
                path,
                key,
            )
        if value is None or isinstance(value, dict | list):
            raise spec.doc.error(f"{path}.{key}", f"expected a scalar value, got {_show(value)}")
        result[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return result


def _topics(spec: _Fields) -> tuple[KafkaTopicSpec, ...]:
    items = spec.sequence("topics", "a list of topics with topic, valueType and targets")
    if not items:
        raise spec.fail("topics", "expected at least one topic, got an empty list")
    topics: dict[str, KafkaTopicSpec] = {}
    for index, item in enumerate(items):
        fields = _Fields(spec.doc, item, f"{spec.at('topics')}[{index}]", strict=False)
        topic = cast(str, fields.string("topic", "a topic name"))
        value_type = cast(str, fields.string("valueType", _TYPENAME))
        namespace, _, name = value_type.rpartition("/")
        if not namespace or not name:
            raise fields.fail("valueType", f"expected {_TYPENAME}, got {value_type!r}")
        targets = fields.sequence("targets", "a list of function typenames")
        for target_index, target in enumerate(targets):
            path = f"{fields.at('targets')}[{target_index}]"
            if not isinstance(target, str):
                raise spec.doc.error(path, f"expected {_TYPENAME}, got {_show(target)}")
            _typename(spec.doc, path, target)
        fields.done()
        if topic in topics:
            _log.warning(
                "%s: %s: topic %r listed again; the last entry wins, as in StateFun",
                spec.doc.source,
                fields.path,
                topic,
            )
        topics[topic] = KafkaTopicSpec(topic=topic, value_type=value_type, targets=tuple(targets))
    return tuple(topics.values())


def _startup_date(fields: _Fields) -> tuple[str, int]:
    text = cast(str, fields.string("date", _DATE_EXAMPLE))
    match = _DATE.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
        micros = int((match.group(7) or "0").ljust(9, "0")[:6])
        zone = match.group(8).replace(":", "")
        stamp = (
            f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{micros:06d} "
        )
        moment = datetime.strptime(
            stamp + ("+0000" if zone == "Z" else zone), "%Y-%m-%d %H:%M:%S.%f %z"
        )
    except ValueError:
        raise fields.fail("date", f"expected {_DATE_EXAMPLE}, got {text!r}") from None
    return text, (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def _startup_offsets(fields: _Fields) -> dict[tuple[str, int], int]:
    expected = "a list of single-key mappings such as '- my-topic/0: 42'"
    offsets: dict[tuple[str, int], int] = {}
    for index, item in enumerate(fields.sequence("offsets", expected)):
        path = f"{fields.at('offsets')}[{index}]"
        if not isinstance(item, dict) or len(item) != 1:
            raise fields.doc.error(path, f"expected {expected[9:-1]}, got {_show(item)}")
        key, offset = next(iter(item.items()))
        topic, _, partition = str(key).rpartition("/")
        if not topic or not partition.isdigit():
            raise fields.doc.error(path, f"expected a partition 'topic/partition', got {key!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise fields.doc.error(
                f"{path}.{key}", f"expected an offset (an integer >= 0), got {_show(offset)}"
            )
        offsets[(topic, int(partition))] = offset
    return offsets


_STARTUP_TYPES = ("group-offsets", "earliest", "latest", "specific-offsets", "date")


def _kafka_ingress(spec: _Fields) -> KafkaIngressSpec:
    ingress_id = spec.typename("id")
    properties = _properties(spec)
    address = spec.string("address", "the Kafka bootstrap servers such as 'kafka:9092'", None)
    address = address or properties.get("bootstrap.servers")
    if not address:
        raise spec.fail(
            "address",
            "missing; expected the Kafka bootstrap servers such as 'kafka:9092'"
            " (or a bootstrap.servers property)",
        )
    group = spec.string("consumerGroupId", "a consumer group id", None) or properties.get(
        "group.id", ""
    )
    reset = str(spec.string("autoOffsetResetPosition", "'earliest' or 'latest'", "latest")).lower()
    if reset not in ("earliest", "latest"):
        raise spec.fail(
            "autoOffsetResetPosition", f"expected 'earliest' or 'latest', got {reset!r}"
        )
    position, date, stamp, offsets = "latest", None, None, {}
    startup = spec.mapping("startupPosition", None)
    if startup is not None:
        position = str(startup.string("type", "one of " + ", ".join(_STARTUP_TYPES)))
        if position not in _STARTUP_TYPES:
            raise startup.fail(
                "type", f"expected one of {', '.join(_STARTUP_TYPES)}; got {position!r}"
            )
        if position == "date":
            date, stamp = _startup_date(startup)
        elif position == "specific-offsets":
            offsets = _startup_offsets(startup)
        elif position == "group-offsets" and not group:
            raise startup.fail(
                "type", "'group-offsets' needs a consumer group: set spec.consumerGroupId"
            )
        startup.done()
    return KafkaIngressSpec(
        id=ingress_id,
        address=address,
        consumer_group_id=group,
        topics=_topics(spec),
        startup_position=cast(Any, position),
        startup_date=date,
        properties=properties,
        source=spec.doc.source,
        auto_offset_reset=cast(Literal["earliest", "latest"], reset),
        startup_offsets=offsets,
        startup_timestamp_ms=stamp,
    )


_SEMANTICS = ("at-least-once", "exactly-once", "none")


def _delivery_semantic(
    spec: _Fields, semantics: tuple[str, ...], default: str, *, needs_timeout: bool
) -> tuple[str, timedelta | None]:
    """``deliverySemantic`` as a string (``exactly-once``) or as StateFun's mapping
    (``{type: exactly-once, transactionTimeout: 15min}``): the semantic and the transaction
    timeout, if one was given (with ``needs_timeout``, exactly-once in a mapping needs one)."""
    expected = "one of " + ", ".join(semantics)
    if not isinstance(spec.data.get("deliverySemantic"), dict):
        semantic = spec.string("deliverySemantic", f"{expected} or a mapping with type", default)
        if semantic not in semantics:
            raise spec.fail("deliverySemantic", f"expected {expected}; got {semantic!r}")
        return semantic, None
    delivery = spec.mapping("deliverySemantic")
    semantic = delivery.string("type", expected)
    if semantic not in semantics:
        raise delivery.fail("type", f"expected {expected}; got {semantic!r}")
    timeout = None
    # The old millisecond field wins, as in StateFun.
    key = "transactionTimeoutMillis" if delivery.has("transactionTimeoutMillis") else None
    key = key or ("transactionTimeout" if delivery.has("transactionTimeout") else None)
    if semantic == "exactly-once" and (key or needs_timeout):
        timeout = delivery.duration(key or "transactionTimeout")
    delivery.seen.update(("transactionTimeout", "transactionTimeoutMillis"))
    delivery.done()
    return semantic, timeout


def _kafka_egress(spec: _Fields) -> KafkaEgressSpec:
    egress_id = spec.typename("id")
    address = spec.string("address", "the Kafka bootstrap servers such as 'kafka:9092'")
    semantic, timeout = _delivery_semantic(spec, _SEMANTICS, "at-least-once", needs_timeout=True)
    timeout = timeout or timedelta(minutes=15)
    return KafkaEgressSpec(
        id=egress_id,
        address=address,
        delivery_semantic=cast(Literal["at-least-once", "exactly-once", "none"], semantic),
        transaction_timeout=timeout,
        properties=_properties(spec),
        source=spec.doc.source,
    )


def _http_ingress(spec: _Fields) -> HttpIngressSpec:
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


def _path(spec: _Fields) -> Path:
    return spec.doc.base_dir / Path(spec.string("path", "a file path")).expanduser()


def _file_ingress(spec: _Fields) -> FileIngressSpec:
    return FileIngressSpec(id=spec.typename("id"), path=_path(spec), source=spec.doc.source)


def _stdout_egress(spec: _Fields) -> StdoutEgressSpec:
    return StdoutEgressSpec(id=spec.typename("id"), source=spec.doc.source)


_FILE_SEMANTICS = ("exactly-once", "at-least-once")


def _file_egress(spec: _Fields) -> FileEgressSpec:
    egress_id = spec.typename("id")
    path = _path(spec)
    # A transaction timeout is accepted (as the Kafka egress's form) and has no use here: a
    # file egress's transaction ends with its checkpoint.
    semantic, _ = _delivery_semantic(spec, _FILE_SEMANTICS, "exactly-once", needs_timeout=False)
    return FileEgressSpec(
        id=egress_id, path=path, exactly_once=semantic == "exactly-once", source=spec.doc.source
    )


# kind -> (parser, strict about unknown fields)
KINDS: dict[str, tuple[Callable[[_Fields], Component], bool]] = {
    "io.statefun.endpoints.v2/http": (_http_endpoint_v2, False),
    "io.statefun.endpoints.v1/http": (_http_endpoint_v1, False),
    "io.statefun.kafka.v1/ingress": (_kafka_ingress, False),
    "io.statefun.kafka.v1/egress": (_kafka_egress, False),
    "io.pystatefun.endpoints.v1/embedded": (_embedded_endpoint, True),
    "io.pystatefun.http.v1/ingress": (_http_ingress, True),
    "io.pystatefun.file.v1/ingress": (_file_ingress, True),
    "io.pystatefun.stdout.v1/egress": (_stdout_egress, True),
    "io.pystatefun.file.v1/egress": (_file_egress, True),
}


def _component(doc: _Doc, kind: object, spec: object, kind_path: str, spec_path: str) -> Component:
    if not isinstance(kind, str):
        raise doc.error(
            kind_path,
            f"expected a component kind such as 'io.statefun.endpoints.v2/http', got {_show(kind)}",
        )
    doc.kind = kind
    if kind not in KINDS:
        raise doc.error(kind_path, f"unknown kind {kind!r}; expected one of: {', '.join(KINDS)}")
    parse, strict = KINDS[kind]
    fields = _Fields(doc, spec, spec_path, strict=strict)
    component = parse(fields)
    fields.done()
    return component


_LEGACY_KINDS = {
    "http": "io.statefun.endpoints.v1/http",
    "io.statefun.kafka/ingress": "io.statefun.kafka.v1/ingress",
    "io.statefun.kafka/egress": "io.statefun.kafka.v1/egress",
}


def _legacy(doc: _Doc, root: dict[str, Any]) -> Iterable[Component]:
    """StateFun 3.0's format: one document, ``version: "3.0"``, components under ``module.spec``."""
    if str(root["version"]) != "3.0":
        raise doc.error(
            "version",
            f"expected '3.0' (StateFun's single-document format), got {root['version']!r}",
        )
    module = _Fields(doc, root.get("module"), "module", strict=False)
    meta = module.mapping("meta")
    if str(meta.string("type", "'remote'")).lower() != "remote":
        raise meta.fail("type", f"expected 'remote', got {meta.data['type']!r}")
    spec = module.mapping("spec")
    for group, item_key, kind_key in (
        ("endpoints", "endpoint", "kind"),
        ("ingresses", "ingress", "type"),
        ("egresses", "egress", "type"),
    ):
        for index, item in enumerate(spec.sequence(group, f"a list of {group}", [])):
            entry = _Fields(doc, item, f"{spec.at(group)}[{index}]", strict=False).mapping(item_key)
            entry_meta = entry.mapping("meta")
            legacy_kind = entry_meta.string(kind_key, "a component kind")
            body = entry.raw("spec", "a mapping", {})
            component_doc = _Doc(doc.file, doc.number, doc.base_dir)
            if item_key != "endpoint":
                component_id = _typename(
                    doc, entry_meta.at("id"), entry_meta.string("id", _TYPENAME)
                )
                body = {**body, "id": component_id} if isinstance(body, dict) else body
            kind = _LEGACY_KINDS.get(legacy_kind, legacy_kind)
            yield _component(component_doc, kind, body, entry_meta.at(kind_key), entry.at("spec"))


def _parse(text: str, name: str, base_dir: Path) -> list[Component]:
    try:
        documents = list(yaml.load_all(text, Loader=_YamlLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}, line {mark.line + 1}, column {mark.column + 1}" if mark else name
        context = f" ({exc.context})" if exc.context else ""
        raise ModuleError(_one_line(f"{where}: invalid YAML: {exc.problem}{context}")) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise ModuleError(
            _one_line(
                f"{name}, line {line}, column {column}: invalid YAML: character "
                f"U+{ord(character):04X} is not allowed"
            )
        ) from None
    except yaml.YAMLError as exc:
        raise ModuleError(
            _one_line(f"{name}: invalid YAML: {' '.join(str(exc).split())}")
        ) from None
    except RecursionError:
        raise ModuleError(_one_line(f"{name}: invalid YAML: nested too deeply")) from None
    components: list[Component] = []
    non_empty = [d for d in documents if d is not None]
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        doc = _Doc(name, number, base_dir)
        if not isinstance(document, dict):
            raise doc.error("", f"expected a mapping with 'kind' and 'spec', got {_show(document)}")
        if len(non_empty) == 1 and "version" in document:
            components.extend(_legacy(doc, document))
            continue
        for key in ("kind", "spec"):
            if document.get(key) is None:
                raise doc.error(
                    key,
                    "missing; every document needs 'kind' and 'spec', "
                    f"got keys {sorted(map(str, document))}",
                )
        components.append(_component(doc, document["kind"], document["spec"], "kind", "spec"))
        for key in sorted(set(map(str, document)) - {"kind", "spec"}):
            _log.warning("%s: %s: field ignored (StateFun ignores it too)", doc.source, key)
    if not components:
        _log.warning("%s: no components (the file is empty)", name)
    return components


def _check_unique(components: list[Component]) -> None:
    seen: dict[tuple[str, str], Component] = {}
    for component in components:
        if isinstance(component, HttpEndpointSpec | EmbeddedEndpointSpec):
            key, path, what = ("function", str(component.functions)), "spec.functions", "functions"
        elif isinstance(component, KafkaIngressSpec | HttpIngressSpec | FileIngressSpec):
            key, path, what = ("ingress", component.id), "spec.id", "ingress id"
        else:
            key, path, what = ("egress", component.id), "spec.id", "egress id"
        earlier = seen.setdefault(key, component)
        if earlier is not component:
            claim = "are already served by" if what == "functions" else "is already defined by"
            raise ModuleError(
                f"{component.source}: {path}: {what} {key[1]!r} {claim} {earlier.source}"
            )


def _module(components: list[Component], paths: tuple[Path, ...]) -> ModuleSpec:
    _check_unique(components)
    spec = ModuleSpec(
        endpoints=tuple(
            c for c in components if isinstance(c, HttpEndpointSpec | EmbeddedEndpointSpec)
        ),
        ingresses=tuple(
            c
            for c in components
            if isinstance(c, KafkaIngressSpec | HttpIngressSpec | FileIngressSpec)
        ),
        egresses=tuple(
            c
            for c in components
            if isinstance(c, KafkaEgressSpec | StdoutEgressSpec | FileEgressSpec)
        ),
        paths=paths,
    )
    _log.debug(
        "module: %d endpoints, %d ingresses, %d egresses",
        len(spec.endpoints),
        len(spec.ingresses),
        len(spec.egresses),
    )
    return spec


def load_module_text(
    text: str, name: str = "module.yaml", base_dir: str | Path | None = None
) -> ModuleSpec:
    """Parse module YAML held in a string; ``name`` is used in messages.

    Relative file paths are resolved against ``base_dir`` (default: the folder of ``name``).
    """
    base = Path(base_dir) if base_dir is not None else Path(name).parent
    return _module(_parse(text, name, base), ())


def load_module(*paths: str | Path) -> ModuleSpec:
    """Load and merge module.yaml files (a folder means its ``module.yaml``)."""
    if not paths:
        raise ModuleError("no module file given")
    components: list[Component] = []
    resolved: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            path = path / "module.yaml"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModuleError(f"{path}: module file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModuleError(f"{path}: cannot read module file: {exc}") from None
        resolved.append(path.resolve())
        components.extend(_parse(text, str(path), resolved[-1].parent))
    return _module(components, tuple(resolved))
