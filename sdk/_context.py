"""The context a function receives: its address, caller, storage and ways to send."""

from __future__ import annotations

import abc
from datetime import timedelta
from typing import Any

from statefun.sdk._messages import EgressMessage, Message
from statefun.sdk._spec import SdkAddress, address_of
from statefun.sdk._storage import AddressStorage
from statefun.sdk._types import validate_typename

__all__ = ["NOTHING_SENT", "Context", "DelayedMessage", "InvocationContext"]

_ONE_MS = timedelta(milliseconds=1)


class Context(abc.ABC):
    """What a function can see and do during one invocation."""

    __slots__ = ()

    @property
    @abc.abstractmethod
    def address(self) -> SdkAddress:
        """The address of the function instance being invoked."""

    @property
    @abc.abstractmethod
    def caller(self) -> SdkAddress | None:
        """The address of the function that sent the message, or None if it came from an ingress."""

    @property
    @abc.abstractmethod
    def storage(self) -> Any:
        """The state of this address: one attribute per ValueSpec."""

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send ``message`` to a function."""

    @abc.abstractmethod
    def send_after(
        self, duration: timedelta, message: Message, cancellation_token: str = ""
    ) -> None:
        """Send ``message`` after ``duration``; a ``cancellation_token`` allows cancelling it."""

    @abc.abstractmethod
    def cancel_delayed_message(self, cancellation_token: str) -> None:
        """Cancel the delayed message sent with ``cancellation_token`` (no-op if delivered)."""

    @abc.abstractmethod
    def send_egress(self, message: EgressMessage) -> None:
        """Send ``message`` to an egress."""


class DelayedMessage:
    """A delayed message, or (``message`` is None) the cancellation of one by its token."""

    __slots__ = ("cancellation_token", "delay_ms", "message")

    def __init__(self, delay_ms: int, message: Message | None, cancellation_token: str) -> None:
        self.delay_ms = delay_ms
        self.message = message
        self.cancellation_token = cancellation_token

    @property
    def is_cancellation(self) -> bool:
        return self.message is None

    def __repr__(self) -> str:
        if self.message is None:
            return f"DelayedMessage(cancel {self.cancellation_token!r})"
        return f"DelayedMessage({self.delay_ms}ms, {self.message!r}, {self.cancellation_token!r})"


# Typenames already checked by send(): checking costs more than a set lookup.
_checked_typenames: set[str] = set()


def _check_target(message: Any, what: str) -> None:
    if not isinstance(message, Message):
        raise TypeError(
            f"{what} expects a Message (see message_builder), got {type(message).__name__}"
        )
    typename = message.target_typename
    if typename not in _checked_typenames:
        validate_typename(typename, "target typename")
        if len(_checked_typenames) < 100_000:
            _checked_typenames.add(typename)
    if not isinstance(message.target_id, str):  # else encoding the response fails, later
        raise TypeError(
            f"{what}: the target id must be a str, got {type(message.target_id).__name__}"
        )


_UNRESOLVED: Any = object()


class _NothingSent(list):  # type: ignore[type-arg]
    """The empty output every new context starts with, one shared instance: a context gets a
    list of its own when it first sends (an invocation that sends no message, say, allocates
    no list for messages). It compares, iterates and tests as an empty list, and refuses to
    change, so nothing can be added to another context's output through it."""

    __slots__ = ()

    def _unchanged(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a context's outputs change through its send methods only")

    append = extend = insert = remove = pop = clear = sort = reverse = _unchanged
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _unchanged


_NOTHING_SENT: Any = _NothingSent()
#: (what a new context's outputs are, for code that makes one without ``__init__``)
NOTHING_SENT: Any = _NOTHING_SENT


class InvocationContext(Context):
    """The context of one batch of invocations for one address; it collects the output.

    The SDK's request-reply handler and the runtime's embedded dispatcher both use it: after
    the batch, ``messages``, ``delayed`` and ``egress`` hold what the function sent, in order,
    and the storage knows which state was written.
    """

    __slots__ = (
        "_address",
        "_caller",
        "_caller_source",
        "_storage",
        "delayed",
        "egress",
        "messages",
        "storage",
    )

    def __init__(
        self,
        address: SdkAddress | tuple[str, str],
        storage: AddressStorage,
        caller: SdkAddress | None = None,
    ) -> None:
        # (the runtime's slice loop, statefun/runtime/_batch.py, sets these fields itself)
        #: an SdkAddress, or the runtime's (typename, id) of it: made one when asked for (an
        #: embedded function that never reads its address costs no lookup)
        self._address: Any = address
        #: the state of this address: a plain field (a property costs a call on every state
        #: access); the runtime applies its own reference, ``_storage``
        self.storage: Any = storage
        self._storage = storage
        self._caller: SdkAddress | None = caller
        #: (``_caller_source``, a protobuf Invocation, is set with ``_UNRESOLVED`` only)
        # the outputs: a list of their own from the first one sent (see _NothingSent)
        self.messages: list[Message] = _NOTHING_SENT
        self.delayed: list[DelayedMessage] = _NOTHING_SENT
        self.egress: list[EgressMessage] = _NOTHING_SENT

    @property
    def address(self) -> SdkAddress:
        address = self._address
        if type(address) is tuple:  # (an SdkAddress is a named tuple: not this type)
            address = self._address = address_of(address)
        return address  # type: ignore[no-any-return]

    @property
    def caller(self) -> SdkAddress | None:
        caller = self._caller
        if caller is _UNRESOLVED:
            caller = self._caller = address_from_pb(self._caller_source.caller)
        return caller

    def set_caller(self, caller: SdkAddress | None) -> None:
        self._caller = caller

    def set_caller_from_pb(self, invocation: Any) -> None:
        """Take the caller from a protobuf ToFunction.Invocation when (if) it is asked for."""
        self._caller = _UNRESOLVED
        self._caller_source = invocation

    def send(self, message: Message) -> None:
        _check_target(message, "send()")
        if self.messages is _NOTHING_SENT:
            self.messages = [message]
        else:
            self.messages.append(message)

    def send_after(
        self, duration: timedelta, message: Message, cancellation_token: str = ""
    ) -> None:
        if not isinstance(duration, timedelta):
            raise TypeError(
                f"send_after() expects a datetime.timedelta, got {type(duration).__name__}"
            )
        delay_ms = duration // _ONE_MS  # exact whole milliseconds, rounded down
        if delay_ms < 0:
            raise ValueError(f"send_after() needs a delay of at least 0, got {duration}")
        _check_target(message, "send_after()")
        if cancellation_token is None:
            cancellation_token = ""
        elif not isinstance(cancellation_token, str):
            raise TypeError("a cancellation token must be a str")
        self._delay(DelayedMessage(delay_ms, message, cancellation_token))

    def cancel_delayed_message(self, cancellation_token: str) -> None:
        if not cancellation_token or not isinstance(cancellation_token, str):
            raise ValueError("cancel_delayed_message() needs a non-empty cancellation token")
        self._delay(DelayedMessage(0, None, cancellation_token))

    def _delay(self, entry: DelayedMessage) -> None:
        if self.delayed is _NOTHING_SENT:
            self.delayed = [entry]
        else:
            self.delayed.append(entry)

    def send_egress(self, message: EgressMessage) -> None:
        if not isinstance(message, EgressMessage):
            raise TypeError(
                "send_egress() expects an EgressMessage (see kafka_egress_message, "
                f"egress_message_builder), got {type(message).__name__}"
            )
        typename = message.typename
        if typename not in _checked_typenames:
            validate_typename(typename, "egress typename")
            _checked_typenames.add(typename)
        if self.egress is _NOTHING_SENT:
            self.egress = [message]
        else:
            self.egress.append(message)


def address_from_pb(pb: Any) -> SdkAddress | None:
    """An SdkAddress from a protobuf Address, or None for an empty (absent) one."""
    namespace, name, id_ = pb.namespace, pb.type, pb.id
    if not namespace and not name and not id_:
        return None
    return SdkAddress(namespace, name, id_, f"{namespace}/{name}")
