"""The registry of functions: ``StatefulFunctions`` and its ``bind`` decorator."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from statefun._exceptions import InvalidFunctionError, InvalidSpecError, UnknownFunctionError
from statefun.sdk._spec import ValueSpec
from statefun.sdk._storage import AddressStorage, make_storage_class
from statefun.sdk._types import validate_typename

__all__ = ["StatefulFunction", "StatefulFunctions"]

F = TypeVar("F", bound=Callable[..., Any])


class StatefulFunction:
    """One registered function: its code, state specs and generated storage class."""

    __slots__ = ("fun", "is_async", "name", "namespace", "specs", "storage_class", "typename")

    def __init__(self, typename: str, fun: Callable[..., Any], specs: list[ValueSpec]) -> None:
        self.namespace, self.name = validate_typename(typename, "function typename")
        self.typename = typename
        self.fun = fun
        # an object with an `async def __call__` is async too (or its coroutines would be dropped)
        self.is_async = inspect.iscoroutinefunction(fun) or inspect.iscoroutinefunction(
            type(fun).__call__
        )
        self.specs = specs
        self.storage_class: type[AddressStorage] = make_storage_class(typename, specs)

    def __repr__(self) -> str:
        kind = "async " if self.is_async else ""
        return f"<{kind}function {self.typename} specs={[s.name for s in self.specs]}>"


def _check_signature(typename: str, fun: Any) -> None:
    if not callable(fun):
        raise InvalidFunctionError(f"function {typename!r}: {fun!r} is not callable")
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # builtins without a signature: let them be
        return
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    keyword_only_required = [
        p.name
        for p in signature.parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if keyword_only_required or len(required) > 2 or (len(positional) < 2 and not has_varargs):
        raise InvalidFunctionError(
            f"function {typename!r} must take exactly two arguments (context, message), "
            f"but its signature is {getattr(fun, '__name__', 'function')}{signature}"
        )


def _check_specs(typename: str, specs: Any) -> list[ValueSpec]:
    if specs is None:
        return []
    if isinstance(specs, ValueSpec):
        raise InvalidSpecError(f"function {typename!r}: specs must be a list of ValueSpec")
    checked: list[ValueSpec] = []
    seen: set[str] = set()
    for spec in specs:
        if not isinstance(spec, ValueSpec):
            raise InvalidSpecError(f"function {typename!r}: {spec!r} is not a ValueSpec")
        if spec.name in seen:
            raise InvalidSpecError(f"function {typename!r}: state {spec.name!r} is declared twice")
        seen.add(spec.name)
        checked.append(spec)
    return checked


class StatefulFunctions:
    """A set of functions, by typename.

    Register with ``@functions.bind(typename="ns/name", specs=[ValueSpec(...)])`` or
    ``functions.register(...)``. Everything is checked at registration: the typename, the
    function's signature (context, message) and the state specs.
    """

    __slots__ = ("_functions",)

    def __init__(self) -> None:
        self._functions: dict[str, StatefulFunction] = {}

    def register(
        self, typename: str, fun: Callable[..., Any], specs: list[ValueSpec] | None = None
    ) -> None:
        """Register ``fun`` under ``typename`` with the given state specs."""
        if fun is None:
            raise InvalidFunctionError("the function to register is missing")
        if not typename:
            raise InvalidFunctionError("the function typename is missing")
        validate_typename(typename, "function typename")
        if typename in self._functions:
            raise InvalidFunctionError(f"a function is already registered for {typename!r}")
        _check_signature(typename, fun)
        checked = _check_specs(typename, specs)
        self._functions[typename] = StatefulFunction(typename, fun, checked)

    def bind(self, typename: str, specs: list[ValueSpec] | None = None) -> Callable[[F], F]:
        """Decorator form of ``register``; returns the function unchanged."""

        def decorate(fun: F) -> F:
            self.register(typename, fun, specs)
            return fun

        return decorate

    def for_typename(self, typename: str) -> StatefulFunction:
        """The function registered for ``typename``; UnknownFunctionError if there is none."""
        try:
            return self._functions[typename]
        except KeyError:
            raise UnknownFunctionError(typename, list(self._functions)) from None

    def __contains__(self, typename: object) -> bool:
        return typename in self._functions

    def __iter__(self) -> Iterator[StatefulFunction]:
        return iter(self._functions.values())

    def typenames(self) -> list[str]:
        return list(self._functions)
