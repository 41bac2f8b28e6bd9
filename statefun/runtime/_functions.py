"""Which code runs a function type: embedded (in this process) or remote (over HTTP).

Function types are resolved from the module's endpoints the first time a message targets
them; an exact typename wins over a ``namespace/*`` wildcard, as in StateFun.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from statefun._exceptions import ModuleError
from statefun._imports import ImportTargetError, load_object
from statefun.module._specs import EmbeddedEndpointSpec, HttpEndpointSpec, ModuleSpec
from statefun.runtime._stats import FunctionStats
from statefun.sdk._functions import StatefulFunction, StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._spec import ValueSpec

__all__ = ["EmbeddedFunction", "FunctionRegistry", "RemoteFunction", "StateSpec"]

log = logging.getLogger(__name__)

TTL_NONE, TTL_AFTER_WRITE, TTL_AFTER_CALL = 0, 1, 2


@dataclass(frozen=True)
class StateSpec:
    """A state a function declared: name, typename and expiration (mode, milliseconds)."""

    name: str
    typename: str
    ttl_mode: int = TTL_NONE
    ttl_ms: int = 0

    @classmethod
    def from_value_spec(cls, spec: ValueSpec) -> StateSpec:
        mode = TTL_AFTER_CALL if spec.after_call else TTL_AFTER_WRITE if spec.after_write else 0
        return cls(spec.name, spec.type.typename, mode, spec.duration)


@dataclass
class EmbeddedFunction:
    typename: str
    function: StatefulFunction
    specs: dict[str, StateSpec]
    has_ttl: bool
    #: what it did (counts for /metrics and /status)
    stats: FunctionStats = field(default_factory=FunctionStats, compare=False, repr=False)

    @property
    def is_async(self) -> bool:
        return self.function.is_async


@dataclass
class RemoteFunction:
    typename: str
    endpoint: HttpEndpointSpec
    url: str
    #: states the function asked for (IncompleteInvocationContext), in the order it gave them;
    #: add with ``register``
    specs: dict[str, StateSpec] = field(default_factory=dict)
    #: whether any of them expires (kept with ``specs``: read on every call)
    has_ttl: bool = False
    #: what it did (counts for /metrics and /status)
    stats: FunctionStats = field(default_factory=FunctionStats, compare=False, repr=False)

    def register(self, spec: StateSpec) -> None:
        self.specs[spec.name] = spec
        self.has_ttl = any(s.ttl_mode for s in self.specs.values())

    @property
    def max_batch(self) -> int:
        return self.endpoint.max_num_batch_requests


AnyFunction = EmbeddedFunction | RemoteFunction


def _load_functions(endpoint: EmbeddedEndpointSpec, base_dirs: list[Path]) -> StatefulFunctions:
    try:
        obj = load_object(endpoint.module, base_dirs)
    except ImportTargetError as exc:
        raise ModuleError(f"{endpoint.source}: spec.module: {exc}") from None
    if isinstance(obj, RequestReplyHandler):
        obj = obj.functions
    if not isinstance(obj, StatefulFunctions):
        raise ModuleError(
            f"{endpoint.source}: spec.module: {endpoint.module!r} is a "
            f"{type(obj).__name__}, expected a StatefulFunctions"
        )
    return obj


def _embedded(function: StatefulFunction) -> EmbeddedFunction:
    specs = {s.name: StateSpec.from_value_spec(s) for s in function.specs}
    return EmbeddedFunction(
        function.typename, function, specs, any(s.ttl_mode for s in specs.values())
    )


class FunctionRegistry:
    """Resolves function typenames to the code that runs them, once per typename."""

    def __init__(self, module: ModuleSpec) -> None:
        self._module = module
        self._resolved: dict[str, AnyFunction | None] = {}
        self._embedded: dict[int, StatefulFunctions] = {}
        base_dirs = [p.parent.resolve() for p in module.paths]
        for index, endpoint in enumerate(module.endpoints):
            if isinstance(endpoint, EmbeddedEndpointSpec):
                functions = _load_functions(endpoint, base_dirs)
                self._embedded[index] = functions
                target = endpoint.functions
                if not target.is_wildcard and str(target) not in functions:
                    raise ModuleError(
                        f"{endpoint.source}: spec.functions: {target} is not registered in "
                        f"{endpoint.module}; it has: {', '.join(functions.typenames()) or 'none'}"
                    )

    def resolve(self, typename: str) -> AnyFunction | None:
        """The function for ``typename``, or None when no endpoint serves it."""
        try:
            return self._resolved[typename]
        except KeyError:
            pass
        resolved = self._resolve(typename)
        self._resolved[typename] = resolved
        return resolved

    def _resolve(self, typename: str) -> AnyFunction | None:
        endpoint = self._module.endpoint_for(typename)
        if endpoint is None:
            return None
        if isinstance(endpoint, HttpEndpointSpec):
            return RemoteFunction(typename, endpoint, endpoint.url_for(typename))
        index = self._module.endpoints.index(endpoint)
        functions = self._embedded[index]
        if typename not in functions:
            return None
        return _embedded(functions.for_typename(typename))

    def add(self, functions: StatefulFunctions) -> None:
        """Serve ``functions`` in this process too, beside the module's (the runtime's own
        functions: a clustered job's idempotency keys)."""
        for function in functions:
            self._resolved[function.typename] = _embedded(function)

    def known(self) -> list[AnyFunction]:
        """Every function resolved so far, and every exact typename of an endpoint."""
        for endpoint in self._module.endpoints:
            if not endpoint.functions.is_wildcard:
                self.resolve(str(endpoint.functions))
        for functions in self._embedded.values():
            for typename in functions.typenames():
                self.resolve(typename)
        return [f for f in self._resolved.values() if f is not None]
