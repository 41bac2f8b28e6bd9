"""Connector kinds by name: each ingress and egress kind of module.yaml in one place.

A kind (``io.pystatefun.file.v1/ingress``, ``io.statefun.kafka.v1/egress``, ...) brings
everything the runtime needs of it as one ``ConnectorKind``: how its ``spec`` is read from
YAML (``parse``), how a source or sink is made from that spec (``build``) and how the plan
names it (``label``). The module loader asks this registry for every kind that is not an
endpoint, and ``build_job`` and ``statefun plan`` ask it for every spec of a module.

A built-in kind lives at the end of its connector's module (``KIND = ConnectorKind(...)``)
and is named below by string, so that a module is imported only when a module file uses it
and this registry imports no connector. Adding a kind: one module holding its spec, source
or sink and ``KIND``, and one line in ``_BUILT_IN`` (or ``register(KIND)`` at run time).
See "How to add a connector" in docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.egress.base import Sink
    from statefun.ingress.base import Source
    from statefun.module import Fields

__all__ = [
    "ConnectorContext",
    "ConnectorKind",
    "ConnectorSpec",
    "kind",
    "kind_of",
    "names",
    "register",
]


class ConnectorSpec(Protocol):
    """What the runtime reads of every connector's spec (a frozen dataclass, typically)."""

    @property
    def id(self) -> str: ...

    @property
    def source(self) -> str: ...  # "file.yaml, document 2 (kind)": the prefix of its errors


S = TypeVar("S", bound=ConnectorSpec)


@dataclass(frozen=True)
class ConnectorContext:
    """What a connector is built with: the job's settings and, for a source that answers
    requests (the HTTP ingress), the job's replies; None when building a sink, which is made
    before the job."""

    settings: Settings
    #: request id -> the future its reply completes
    replies: dict[str, asyncio.Future[Any]] | None = None
    #: the replies held until a checkpoint (to log with the calls)
    held_replies: Callable[[], Sequence[tuple[str, Any]]] | None = None
    #: (request id, typename) -> why that call got no reply in time
    unanswered: Callable[[str, str], str] | None = None


@dataclass(frozen=True)
class ConnectorKind(Generic[S]):
    """One ``kind`` of module.yaml that makes a source (``role`` ingress) or a sink (egress)."""

    name: str  # the kind as module.yaml writes it: "io.pystatefun.file.v1/ingress"
    role: Literal["ingress", "egress"]
    spec_type: type[S]
    #: the spec from the YAML ``spec`` mapping, read through ``statefun.module.Fields``
    #: (``Fields.done`` is called after it)
    parse: Callable[[Fields], S]
    #: a ``Source`` (ingress) or a ``Sink`` (egress) for the spec
    build: Callable[[S, ConnectorContext], Source | Sink]
    #: the plan's node: lines joined with "\n", the first "<kind> ingress|egress <id>"
    label: Callable[[S], str]
    #: unknown fields are errors (this project's kinds), else warnings (StateFun's, as StateFun)
    strict: bool = True


#: kind name -> the kind, or "module:attribute" where it is (imported on first use)
_BUILT_IN: dict[str, ConnectorKind[Any] | str] = {
    "io.statefun.kafka.v1/ingress": "statefun.ingress.kafka:KIND",
    "io.statefun.kafka.v1/egress": "statefun.egress.kafka:KIND",
    "io.pystatefun.http.v1/ingress": "statefun.ingress._http_kind:KIND",
    "io.pystatefun.file.v1/ingress": "statefun.ingress.file:KIND",
    "io.pystatefun.stdout.v1/egress": "statefun.egress.stdout:KIND",
    "io.pystatefun.file.v1/egress": "statefun.egress.file:KIND",
}
_KINDS = dict(_BUILT_IN)


def register(connector: ConnectorKind[Any]) -> None:
    """Add (or replace) the kind ``connector.name``."""
    _KINDS[connector.name] = connector


def names() -> list[str]:
    """Every known kind, built-in ones first."""
    return list(_KINDS)


def kind(name: str) -> ConnectorKind[Any] | None:
    """The kind ``name``, or None if there is none."""
    found = _KINDS.get(name)
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        if not isinstance(found, ConnectorKind) or found.name != name:
            raise TypeError(f"{module}:{attribute} is not the ConnectorKind of {name}")
        _KINDS[name] = found
    return found


def kind_of(spec: ConnectorSpec) -> ConnectorKind[Any]:
    """The kind whose spec ``spec`` is (a spec may be made in code, not only read from YAML)."""
    for name in names():
        found = kind(name)
        if found is not None and type(spec) is found.spec_type:
            return found
    raise TypeError(f"{type(spec).__name__} is the spec of no known connector kind")
