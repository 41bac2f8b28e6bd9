"""A source's IngressContext.submit builds each envelope itself (no call of Envelope.__init__): the
envelopes it routes are the ones ``Envelope(...)`` makes."""

from __future__ import annotations

import asyncio
from typing import Any

from statefun.runtime._envelope import Envelope
from statefun.runtime._ingress_port import IngressPort
from statefun.sdk import SdkAddress, TypedValue


class _Job:
    def is_function_type(self, typename: str) -> bool:
        return True

    def dead_letter_record(self, fields: dict[str, Any], value: Any) -> None:
        raise AssertionError("no dead letter expected")


class _Room:
    open = True


class _Router:
    def __init__(self) -> None:
        self.sent: list[Envelope] = []
        self.room = _Room()

    def send(self, envelope: Envelope) -> None:
        self.sent.append(envelope)

    def emit_many(self, typename: str, messages: Any, start: int = 0) -> int:
        raise AssertionError("not used")


def _fields(envelope: Envelope) -> dict[str, Any]:
    return {name: getattr(envelope, name) for name in Envelope.__slots__}


def test_submit_and_emit_route_the_envelope_envelope_init_makes() -> None:
    router = _Router()
    port = IngressPort(_Job(), router)  # type: ignore[arg-type]
    value = TypedValue("t/v", b"1")
    caller = SdkAddress("a", "b", "c", "a/b")
    asyncio.run(port.submit("t/f", "x", value, caller))
    port.emit("t/f", "y", value)
    assert [_fields(e) for e in router.sent] == [
        _fields(Envelope("t/f", "x", value, caller)),
        _fields(Envelope("t/f", "y", value, None)),
    ]
    assert port.records == 2
