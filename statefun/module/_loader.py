"""Read StateFun 3.x module.yaml files into the typed values of ``_specs.py``.

A module file is a stream of YAML documents, each one component: ``kind`` (a typename that
selects the parser) and ``spec``. The endpoint kinds are read here; every ingress and egress
kind is a connector kind that ``statefun.connectors`` names and brings its own parser.
StateFun's own kinds are read as StateFun reads them: unknown fields are ignored (with a
warning) and StateFun's defaults apply. This project's kinds (``io.pystatefun.*``) are
strict. The single-document format of StateFun 3.0 (``version: "3.0"``) is read too. Every
error is a ModuleError that names the file, the document, its kind and the field
(``_fields.py``). The reference is docs/module-yaml.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

import yaml

from statefun import connectors
from statefun._exceptions import ModuleError
from statefun.module._durations import format_duration
from statefun.module._fields import TYPENAME, Doc, Fields, check_typename, one_line, show
from statefun.module._http_options import endpoint_headers
from statefun.module._specs import (
    ASYNC_TRANSPORT,
    OKHTTP_TRANSPORT,
    EmbeddedEndpointSpec,
    EndpointSpec,
    FunctionTarget,
    HttpEndpointSpec,
    ModuleSpec,
    TransportSpec,
)

__all__ = ["ENDPOINT_KINDS", "kinds", "load_module", "load_module_text"]

_log = logging.getLogger(__name__)

Role = Literal["endpoint", "ingress", "egress"]
#: a component of a module: its role and its spec
Component = tuple[Role, Any]
_URL_SCHEMES = ("http", "https", "http+unix", "https+unix")
_MODULE_REF = re.compile(r"([A-Za-z_]\w*(\.[A-Za-z_]\w*)*|[^:]+\.py):[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 timestamps: StateFun reads ``date:`` values as text."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _functions(spec: Fields) -> FunctionTarget:
    text = spec.string("functions", f"{TYPENAME} or 'namespace/*'")
    namespace, _, name = check_typename(
        spec.doc, spec.at("functions"), text, wildcard=True
    ).partition("/")
    return FunctionTarget(namespace, None if name == "*" else name)


def _url_template(spec: Fields) -> str:
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


def _timeouts(fields: Fields, defaults: dict[str, timedelta]) -> dict[str, timedelta]:
    return {key: fields.duration(key, default) for key, default in defaults.items()}


def _check_within_call(fields: Fields, timeouts: dict[str, timedelta]) -> None:
    """StateFun's okhttp client refuses connect/read/write timeouts longer than the call."""
    call = format_duration(timeouts["call"])
    for key in ("connect", "read", "write"):
        if timeouts[key] > timeouts["call"]:
            given = "" if fields.has(key) else " (the default)"
            length = format_duration(timeouts[key])
            raise fields.fail(key, f"{length}{given} is longer than the call timeout ({call})")


def _transport(fields: Fields | None) -> TransportSpec:
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


def _http_endpoint_v2(spec: Fields) -> HttpEndpointSpec:
    transport = _transport(spec.mapping("transport", None))
    headers = endpoint_headers(spec)
    return HttpEndpointSpec(
        functions=_functions(spec),
        url_path_template=_url_template(spec),
        max_num_batch_requests=spec.integer("maxNumBatchRequests", 1000),
        transport=replace(transport, headers=headers) if headers else transport,
        source=spec.doc.source,
    )


def _http_endpoint_v1(spec: Fields) -> HttpEndpointSpec:
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


def _embedded_endpoint(spec: Fields) -> EmbeddedEndpointSpec:
    expected = "an object reference 'package.module:attribute' or 'path/file.py:attribute'"
    module = cast(str, spec.string("module", expected))
    if not _MODULE_REF.fullmatch(module):
        raise spec.fail("module", f"expected {expected}, got {module!r}")
    return EmbeddedEndpointSpec(functions=_functions(spec), module=module, source=spec.doc.source)


# endpoint kind -> (parser, strict about unknown fields)
ENDPOINT_KINDS: dict[str, tuple[Callable[[Fields], EndpointSpec], bool]] = {
    "io.statefun.endpoints.v2/http": (_http_endpoint_v2, False),
    "io.statefun.endpoints.v1/http": (_http_endpoint_v1, False),
    "io.pystatefun.endpoints.v1/embedded": (_embedded_endpoint, True),
}


def kinds() -> list[str]:
    """Every kind a module file may use: the endpoints', then the connectors'."""
    return [*ENDPOINT_KINDS, *connectors.names()]


def _component(doc: Doc, kind: object, spec: object, kind_path: str, spec_path: str) -> Component:
    if not isinstance(kind, str):
        raise doc.error(
            kind_path,
            f"expected a component kind such as 'io.statefun.endpoints.v2/http', got {show(kind)}",
        )
    doc.kind = kind
    parse: Callable[[Fields], Any]
    role: Role
    endpoint = ENDPOINT_KINDS.get(kind)
    if endpoint is not None:
        (parse, strict), role = endpoint, "endpoint"
    else:
        connector = connectors.kind(kind)
        if connector is None:
            raise doc.error(
                kind_path, f"unknown kind {kind!r}; expected one of: {', '.join(kinds())}"
            )
        parse, strict, role = connector.parse, connector.strict, connector.role
    fields = Fields(doc, spec, spec_path, strict=strict)
    component: Component = (role, parse(fields))
    fields.done()
    return component


_LEGACY_KINDS = {
    "http": "io.statefun.endpoints.v1/http",
    "io.statefun.kafka/ingress": "io.statefun.kafka.v1/ingress",
    "io.statefun.kafka/egress": "io.statefun.kafka.v1/egress",
}


def _legacy(doc: Doc, root: dict[str, Any]) -> Iterable[Component]:
    """StateFun 3.0's format: one document, ``version: "3.0"``, components under ``module.spec``."""
    if str(root["version"]) != "3.0":
        raise doc.error(
            "version",
            f"expected '3.0' (StateFun's single-document format), got {root['version']!r}",
        )
    module = Fields(doc, root.get("module"), "module", strict=False)
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
            entry = Fields(doc, item, f"{spec.at(group)}[{index}]", strict=False).mapping(item_key)
            entry_meta = entry.mapping("meta")
            legacy_kind = entry_meta.string(kind_key, "a component kind")
            body = entry.raw("spec", "a mapping", {})
            component_doc = Doc(doc.file, doc.number, doc.base_dir)
            if item_key != "endpoint":
                component_id = check_typename(
                    doc, entry_meta.at("id"), entry_meta.string("id", TYPENAME)
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
        raise ModuleError(one_line(f"{where}: invalid YAML: {exc.problem}{context}")) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise ModuleError(
            one_line(
                f"{name}, line {line}, column {column}: invalid YAML: character "
                f"U+{ord(character):04X} is not allowed"
            )
        ) from None
    except yaml.YAMLError as exc:
        raise ModuleError(one_line(f"{name}: invalid YAML: {' '.join(str(exc).split())}")) from None
    except RecursionError:
        raise ModuleError(one_line(f"{name}: invalid YAML: nested too deeply")) from None
    components: list[Component] = []
    non_empty = [d for d in documents if d is not None]
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        doc = Doc(name, number, base_dir)
        if not isinstance(document, dict):
            raise doc.error("", f"expected a mapping with 'kind' and 'spec', got {show(document)}")
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
    seen: dict[tuple[str, str], Any] = {}
    for role, component in components:
        if role == "endpoint":
            key, path, what = ("function", str(component.functions)), "spec.functions", "functions"
        else:
            key, path, what = (role, component.id), "spec.id", f"{role} id"
        earlier: Any = seen.setdefault(key, component)
        if earlier is not component:
            claim = "are already served by" if what == "functions" else "is already defined by"
            raise ModuleError(
                f"{component.source}: {path}: {what} {key[1]!r} {claim} {earlier.source}"
            )


def _module(components: list[Component], paths: tuple[Path, ...]) -> ModuleSpec:
    _check_unique(components)
    spec = ModuleSpec(
        endpoints=tuple(c for role, c in components if role == "endpoint"),
        ingresses=tuple(c for role, c in components if role == "ingress"),
        egresses=tuple(c for role, c in components if role == "egress"),
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
