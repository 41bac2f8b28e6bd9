"""Addresses with a meaning of their own, shared by the runtime and the connectors.

A request-reply call over the HTTP ingress sends its message with the caller
``pystatefun.http/reply:<request id>``; a message the function sends to that caller is the
reply, which the runtime hands back to the waiting request instead of routing it to a function.
"""

from __future__ import annotations

__all__ = ["REPLY_NAME", "REPLY_NAMESPACE", "REPLY_TYPENAME"]

REPLY_NAMESPACE = "pystatefun.http"
REPLY_NAME = "reply"
#: the caller typename of a request-reply call over the HTTP ingress
REPLY_TYPENAME = f"{REPLY_NAMESPACE}/{REPLY_NAME}"
