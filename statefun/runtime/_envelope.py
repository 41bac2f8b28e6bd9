"""Envelopes: a message inside the runtime, on its way to one address."""

from __future__ import annotations

from typing import Any

from statefun.sdk._spec import SdkAddress

__all__ = ["Envelope"]


class Envelope:
    """A typed value for the address (typename, id), sent by ``caller`` (None: an ingress)."""

    __slots__ = ("caller", "id", "typename", "value", "wire")

    def __init__(self, typename: str, id_: str, value: Any, caller: SdkAddress | None) -> None:
        # (IngressPort.submit, runtime/_ingress_port.py, and Router.emit_many set these five
        # themselves)
        self.typename = typename
        self.id = id_
        self.value = value  # anything with typename / has_value / value
        self.caller = caller
        #: its Invocation in a ToFunction, encoded ahead while it waits in a remote function's
        #: mailbox (statefun.runtime._remote.invocation); None: not yet
        self.wire: bytes | None = None

    def __repr__(self) -> str:
        return f"Envelope(to={self.typename}/{self.id}, from={self.caller}, {self.value!r})"
