"""What invocations produced, as plain values: ``Outcome`` and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

__all__ = ["Delayed", "EgressRecord", "Outcome", "Sent"]


class Sent(NamedTuple):
    """A message a function sent: the target's typename and id, and the value."""

    typename: str
    id: str
    value: Any


class Delayed(NamedTuple):
    """A message a function sent with ``send_after``: its target, value, delay, cancellation
    token ("" for none) and the deadline on the harness's clock."""

    typename: str
    id: str
    value: Any
    delay: timedelta
    token: str
    deadline: datetime


class EgressRecord(NamedTuple):
    """A record a function sent to the egress ``egress_id``."""

    egress_id: str
    value: Any


Address = tuple[str, str]


@dataclass
class Outcome:
    """Everything the invocations of one harness call produced, in the order they produced it.

    ``messages`` are the messages to functions (replies to the harness's caller are in
    ``replies``), ``delayed`` the delayed messages, ``cancellations`` the cancellation tokens
    (``cancel_delayed_message``), ``egress_records`` the egress records; ``states`` holds, per
    address ``(typename, id)`` that wrote state, each written state's new value (None: deleted).
    """

    messages: list[Sent] = field(default_factory=list)
    delayed: list[Delayed] = field(default_factory=list)
    cancellations: list[str] = field(default_factory=list)
    egress_records: list[EgressRecord] = field(default_factory=list)
    states: dict[Address, dict[str, Any]] = field(default_factory=dict)
    replies: list[Any] = field(default_factory=list)
    #: how many invocations ran
    invocations: int = 0

    def egress(self, egress_id: str) -> list[Any]:
        """The values of the records sent to ``egress_id``, in order."""
        return [r.value for r in self.egress_records if r.egress_id == egress_id]

    @property
    def reply(self) -> Any:
        """The (first) value sent back to the harness as the caller; None if there was none."""
        return self.replies[0] if self.replies else None

    @property
    def state(self) -> dict[str, Any]:
        """The state written by the one address of this outcome (``{}`` if none wrote);
        an error when several addresses wrote state (use ``states``)."""
        if not self.states:
            return {}
        if len(self.states) > 1:
            raise ValueError(
                f"{len(self.states)} addresses wrote state: "
                f"{', '.join(f'{t}/{i}' for t, i in self.states)}; use outcome.states"
            )
        return next(iter(self.states.values()))

    def extend(self, other: Outcome) -> None:
        """Append what ``other`` produced (later state writes win)."""
        self.messages.extend(other.messages)
        self.delayed.extend(other.delayed)
        self.cancellations.extend(other.cancellations)
        self.egress_records.extend(other.egress_records)
        for address, written in other.states.items():
            self.states.setdefault(address, {}).update(written)
        self.replies.extend(other.replies)
        self.invocations += other.invocations
