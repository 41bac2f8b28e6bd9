"""Every error pystatefun raises on purpose, in one place.

The tree::

    StatefunError                      base of all errors below
    ├── ConfigurationError             wrong use of the API, found early (also ValueError)
    │   ├── InvalidTypeNameError       a typename that is not ``namespace/name``
    │   ├── InvalidSpecError           a ValueSpec or state name that cannot be used
    │   ├── InvalidFunctionError       a function that cannot be registered
    │   ├── ModuleError                a module.yaml that cannot be loaded (file, document, field)
    │   └── CheckpointDamagedError     a checkpoint file missing, changed or not decodable
    ├── ProtocolError                  bytes that break the request-reply protocol (also ValueError)
    │   ├── MalformedRequestError      a ToFunction that cannot be decoded or is incomplete
    │   ├── MalformedResponseError     a FromFunction that cannot be decoded or is incomplete
    │   └── HttpProtocolError          a remote function's reply is no valid HTTP/1.x response
    ├── ValueDecodeError               bytes that are no value of their type (also ValueError)
    │   └── InvalidValueError          a message's value does not decode as its own type
    │                                  (Message.as_type): the sender's error
    ├── UnknownFunctionError           no function registered for a typename (also LookupError)
    ├── StateTypeMismatchError         stored state has another typename (also TypeError)
    ├── FunctionInvocationError        a function failed; ``retryable`` says whether to try again
    │   ├── RetryableFunctionError     a transient failure: a timeout, a connection refused, a 5xx
    │   └── TerminalFunctionError      retrying cannot help: the function itself is wrong
    │       ├── UndeliverableError     the input cannot be delivered, whatever the policy: it
    │       │   │                      goes to the dead letters and the job goes on
    │       │   ├── FunctionNotFoundError   the endpoint says no such function (HTTP 404/410)
    │       │   ├── StateWriteRejectedError a state write whose type is not its spec's
    │       │   └── MessageValueError       a function found a message's value invalid
    │       │                               for the message's own type (InvalidValueError)
    │       └── FunctionFailedError    a function raised under statefun.testing's harness
    │                                  (``__cause__`` is what it raised)
    ├── UnavailableError               a port, a Kafka cluster, a file the job needs cannot be used
    │                                  (also ConnectionError)
    └── JobFailedError                 the job stopped on an error (``__cause__`` says which)

Errors that describe bad input also derive from the built-in exception that code written for
Apache StateFun's SDK would catch (ValueError, TypeError, LookupError), so such code keeps working.
"""

from __future__ import annotations

__all__ = [
    "CheckpointDamagedError",
    "ConfigurationError",
    "FunctionFailedError",
    "FunctionInvocationError",
    "FunctionNotFoundError",
    "HttpProtocolError",
    "InvalidFunctionError",
    "InvalidSpecError",
    "InvalidTypeNameError",
    "InvalidValueError",
    "JobFailedError",
    "MalformedRequestError",
    "MalformedResponseError",
    "MessageValueError",
    "ModuleError",
    "ProtocolError",
    "RetryableFunctionError",
    "StateTypeMismatchError",
    "StateWriteRejectedError",
    "StatefunError",
    "TerminalFunctionError",
    "UnavailableError",
    "UndeliverableError",
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


class CheckpointDamagedError(ConfigurationError):
    """A checkpoint or savepoint cannot be restored as written: a file is missing, truncated,
    changed (its checksum does not match) or does not decode. ``path`` names the file (or the
    folder), ``reason`` says what is wrong. Restoring the latest checkpoint then falls back to
    an older one; a savepoint asked for by name is not replaced by anything else."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class ProtocolError(StatefunError, ValueError):
    """Bytes received over the request-reply protocol are not a valid message."""


class MalformedRequestError(ProtocolError):
    """A ToFunction request cannot be decoded, or lacks what every request must have."""


class MalformedResponseError(ProtocolError):
    """A FromFunction response cannot be decoded, or lacks what every response must have."""


class HttpProtocolError(ProtocolError):
    """The peer of an HTTP call sent bytes that are not a valid HTTP/1.x response."""


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


class InvalidValueError(ValueDecodeError):
    """A message's value does not decode as the type the message names (``Message.as_type``
    with the message's own type): the sender's error, not the function's."""


class FunctionInvocationError(StatefunError):
    """A function invocation failed. ``retryable`` says whether trying again can help."""

    retryable: bool = False


class RetryableFunctionError(FunctionInvocationError):
    """A transient failure (timeout, refused connection, 5xx): the batch may be sent again."""

    retryable = True


class TerminalFunctionError(FunctionInvocationError):
    """A failure that retrying cannot fix (the function rejects the input, bad response...)."""

    retryable = False


class UndeliverableError(TerminalFunctionError):
    """Messages that cannot be delivered: the problem is the input's, not the job's. They go to
    the dead letters whatever ``remote_failure_policy`` says, and the job goes on."""


class FunctionNotFoundError(UndeliverableError):
    """The endpoint answered that it has no such function (HTTP 404 or 410)."""


class StateWriteRejectedError(UndeliverableError):
    """A function wrote a state value whose type is not the type its spec registered."""


class MessageValueError(UndeliverableError):
    """A function found a message's value invalid for the message's own type
    (``InvalidValueError`` in the function)."""


class UnavailableError(StatefunError, ConnectionError):
    """Something outside the job that it needs cannot be used: a port already in use, a Kafka
    cluster that does not answer, a file that cannot be written. The one-line message names
    it and the part of the job (``ingress <id>``, ``egress <id>``, ``admin server``)."""


class FunctionFailedError(TerminalFunctionError):
    """A function raised while statefun.testing's harness called it: the message names the
    address and the message, ``__cause__`` is what the function raised."""


class JobFailedError(StatefunError):
    """The job stopped because of an error; the original error is its ``__cause__``."""
