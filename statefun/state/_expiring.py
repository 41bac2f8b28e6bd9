"""State values with a time to live: a typed value plus its expiration deadline.

The runtime enforces TTL (``runtime/_dispatcher.py`` sets the deadlines and drops expired
values when an address is next invoked); the backends and the snapshot codec
(``_codec.py``) store an ``ExpiringValue`` as it is, deadline included.
"""

from __future__ import annotations

from typing import Any

from statefun.state.base import StateValues

__all__ = ["ExpiringValue", "live_values"]


class ExpiringValue:
    """A state value with an expiration deadline (ms since the epoch); reads like a TypedValue."""

    __slots__ = ("deadline_ms", "has_value", "typename", "value")

    def __init__(self, typed: Any, deadline_ms: int) -> None:
        self.typename = typed.typename
        self.has_value = typed.has_value
        self.value = typed.value
        self.deadline_ms = deadline_ms

    def __repr__(self) -> str:
        return f"ExpiringValue({self.typename!r}, {self.value!r}, until={self.deadline_ms})"


def live_values(stored: StateValues | None, now: int) -> dict[str, Any]:
    """A copy of ``stored`` without the values whose expiration has passed (``now``: ms since
    the epoch)."""
    if not stored:
        return {}
    return {
        k: v for k, v in stored.items() if not (type(v) is ExpiringValue and v.deadline_ms <= now)
    }
