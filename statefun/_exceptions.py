"""Every error pystatefun raises on purpose, in one place.

The tree::

    StatefunError                      base of all errors below
    ├── ConfigurationError             wrong use of the API, found early (also ValueError)
    │   ├── InvalidTypeNameError       a typename that is not ``namespace/name``
    │   ├── InvalidSpecError           a ValueSpec or state name that cannot be used
    │   ├── InvalidFunctionError       a function that cannot be registered
    │   └── ModuleError                a module.yaml that cannot be loaded (file, document, field)
    ├── ProtocolError                  bytes that break the request-reply protocol (also ValueError)
    │   ├── MalformedRequestError      a ToFunction that cannot be decoded or is incomplete
    │   └── MalformedResponseError     a FromFunction that cannot be decoded or is incomplete
    ├── ValueDecodeError               bytes that are no value of their type (also ValueError)
    ├── UnknownFunctionError           no function registered for a typename (also LookupError)
    ├── StateTypeMismatchError         stored state has another typename (also TypeError)
    ├── FunctionInvocationError        a function failed; ``retryable`` says whether to try again
    │   ├── RetryableFunctionError     a transient failure: a timeout, a connection refused, a 5xx
    │   └── TerminalFunctionError      retrying cannot help: the function itself is wrong
    ├── UnavailableError               a port, a Kafka cluster, a file the job needs cannot be used
    │                                  (also ConnectionError)
    └── JobFailedError                 the job stopped on an error (``__cause__`` says which)

Errors that describe bad input also derive from the built-in exception that code written for
Apache StateFun's SDK would catch (ValueError, TypeError, LookupError), so such code keeps working.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "FunctionInvocationError",
    "InvalidFunctionError",
    "InvalidSpecError",
    "InvalidTypeNameError",
    "JobFailedError",
    "MalformedRequestError",
    "MalformedResponseError",
    "ModuleError",
    "ProtocolError",
    "RetryableFunctionError",
    "StateTypeMismatchError",
    "StatefunError",
    "TerminalFunctionError",
    "UnavailableError",
    "UnknownFunctionError",
    "ValueDecodeError",
]


class StatefunError(Exception):
    """Base class of every error that pystatefun raises on purpose."""


class ConfigurationError(StatefunError, ValueError):
    """The API or a configuration was used in a way that cannot work."""


class InvalidTypeNameError(ConfigurationError):
    """A typename is not of the form ``namespace/name``."""


class InvalidSpecError(ConfigurationError):
    """A ValueSpec (state name, type or expiration) cannot be used."""


class InvalidFunctionError(ConfigurationError):
    """A function cannot be registered (signature, duplicate typename, ...)."""


class ModuleError(ConfigurationError):
    """A module definition (module.yaml) is invalid; the message names file, document and field."""


class ProtocolError(StatefunError, ValueError):
    """Bytes received over the request-reply protocol are not a valid message."""


class MalformedRequestError(ProtocolError):
    """A ToFunction request cannot be decoded, or lacks what every request must have."""


class MalformedResponseError(ProtocolError):
    """A FromFunction response cannot be decoded, or lacks what every response must have."""


class ValueDecodeError(StatefunError, ValueError):
    """The bytes of a typed value (a message's argument, a stored state) cannot be decoded as
    the type that reads them; the message names the value and the type."""


class UnknownFunctionError(StatefunError, LookupError):
    """No function is registered under the requested typename."""

    def __init__(self, typename: str, known: list[str] | None = None) -> None:
        self.typename = typename
        self.known = sorted(known or [])
        hint = f"; registered: {', '.join(self.known)}" if self.known else ""
        super().__init__(f"no function is registered for type {typename!r}{hint}")


class StateTypeMismatchError(StatefunError, TypeError):
    """A stored state value carries a different typename than its ValueSpec declares."""


class FunctionInvocationError(StatefunError):
    """A function invocation failed. ``retryable`` says whether trying again can help."""

    retryable: bool = False


class RetryableFunctionError(FunctionInvocationError):
    """A transient failure (timeout, refused connection, 5xx): the batch may be sent again."""

    retryable = True


class TerminalFunctionError(FunctionInvocationError):
    """A failure that retrying cannot fix (the function rejects the input, bad response...)."""

    retryable = False


class UnavailableError(StatefunError, ConnectionError):
    """Something outside the job that it needs cannot be used: a port already in use, a Kafka
    cluster that does not answer, a file that cannot be written. The one-line message names
    it and the part of the job (``ingress <id>``, ``egress <id>``, ``admin server``)."""


class JobFailedError(StatefunError):
    """The job stopped because of an error; the original error is its ``__cause__``."""
