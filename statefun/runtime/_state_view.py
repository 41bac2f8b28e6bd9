"""Queryable state on the admin port: an address's values decoded, and the ids of a type.

* ``GET /state/<namespace>/<type>/<id>``: ``{"address", "key_group", "values": {name:
  value}}`` where each value is ``describe_value``'s decoding; 404 when the address holds no
  state.
* ``GET /state/<namespace>/<type>?after=<id>&limit=N``: ``{"typename", "ids", "next"}``, a
  page of the ids holding state, in key-group order and then in id order (``next``: the
  ``after`` of the next page, null after the last).

Path segments are percent-decoded; the last two before the id are the namespace and the
type, so a namespace holding a ``/`` is written ``%2F``.

Consistency: a dispatcher applies all of an invocation's state writes with one ``put`` in one
event-loop step, and these reads run on the event loop, so they see an invocation's writes
whole or not at all. Listing walks the key groups with ``StateBackend.ids_in_steps`` and
gives the loop back between steps whenever it held it for ``_SLICE_S`` (a step is a bounded
piece of one key group's work, never the whole state's).

Decoding (``describe_value``): the built-in types (``io.statefun.types/*``); the types an
embedded function declared in its value specs (JSON types as JSON, protobuf types as their
JSON mapping); protobuf messages whose descriptor this process has loaded
(``type.googleapis.com/<full name>``); UTF-8 JSON objects and arrays; otherwise base64.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, unquote

from google.protobuf import descriptor_pool, json_format, message_factory

from statefun._http.server import Reply, plain
from statefun._keygroups import key_group_for
from statefun.runtime._functions import EmbeddedFunction
from statefun.sdk._types import BUILTIN_TYPES, Type
from statefun.state._expiring import ExpiringValue

if TYPE_CHECKING:
    from statefun._settings import Settings
    from statefun.runtime._functions import FunctionRegistry
    from statefun.state.base import StateBackend

__all__ = [
    "StateView",
    "StateViewJob",
    "describe_address",
    "describe_value",
    "split_address",
]

#: the longest the loop is held while listing ids, before it is given back
_SLICE_S = 0.0002
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


class StateViewJob(Protocol):
    """What the state view needs of the job (``runtime/_job.py``'s ``Job``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def state(self) -> StateBackend: ...
    @property
    def functions(self) -> FunctionRegistry: ...


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _protobuf_class(typename: str) -> Any:
    """The message class of ``<namespace>/<full name>`` if this process knows its descriptor."""
    full_name = typename.rpartition("/")[2]
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    except KeyError:
        return None
    return message_factory.GetMessageClass(descriptor)


def _decoded(typename: str, data: bytes, known: Type | None) -> tuple[str, Any] | None:
    """(encoding, JSON value) of ``data``, or None when its type is not known."""
    builtin = BUILTIN_TYPES.get(typename)
    if builtin is not None:
        return "builtin", builtin.serializer().deserialize(data)
    if known is not None and known.typename == typename:
        value = known.serializer().deserialize(data)
        if hasattr(value, "DESCRIPTOR"):
            return "protobuf", json_format.MessageToDict(value)
        if _json_safe(value):
            return "json", value
    cls = _protobuf_class(typename)
    if cls is not None:
        message = cls()
        message.ParseFromString(data)
        return "protobuf", json_format.MessageToDict(message)
    if data[:1] in (b"{", b"["):
        try:
            return "json", json.loads(data)
        except ValueError:
            return None
    return None


def describe_value(
    typed: Any, known: Type | None = None, now_ms: int | None = None
) -> dict[str, Any]:
    """A stored typed value as JSON-able data: ``typename``, ``encoding`` (builtin, json,
    protobuf or base64), ``value`` (None when it has none) and, for a value with a time to
    live, ``expires_at_ms`` (and ``expired`` once past it)."""
    typename = str(typed.typename)
    described: dict[str, Any] = {"typename": typename}
    if not typed.has_value:
        described.update(encoding="none", value=None)
    else:
        data = bytes(typed.value)
        try:
            decoded = _decoded(typename, data, known)
        except Exception:  # bytes that do not decode as their type says: shown raw
            decoded = None
        if decoded is None:
            decoded = ("base64", base64.b64encode(data).decode("ascii"))
        described["encoding"], described["value"] = decoded
    if type(typed) is ExpiringValue:
        described["expires_at_ms"] = typed.deadline_ms
        if now_ms is not None and typed.deadline_ms <= now_ms:
            described["expired"] = True
    return described


def describe_address(
    typename: str,
    id_: str,
    key_group: int,
    values: Mapping[str, Any],
    known: Mapping[str, Type] | None = None,
) -> dict[str, Any]:
    """The JSON answer for an address's state: ``address``, ``key_group`` and ``values``
    (name -> ``describe_value``, with the Types in ``known`` by state name)."""
    now = int(time.time() * 1000)
    known = known or {}
    return {
        "address": f"{typename}/{id_}",
        "key_group": key_group,
        "values": {
            name: describe_value(typed, known.get(name), now) for name, typed in values.items()
        },
    }


def split_address(segments: list[str]) -> tuple[str, str | None] | None:
    """(typename, id or None) of percent-encoded path segments ``ns/type[/id]``."""
    parts = [unquote(s) for s in segments]
    if len(parts) == 2 and all(parts):
        return f"{parts[0]}/{parts[1]}", None
    if len(parts) == 3 and parts[0] and parts[1]:
        return f"{parts[0]}/{parts[1]}", parts[2]
    return None


def _json(status: int, data: Any) -> Reply:
    return Reply(status, "application/json", json.dumps(data).encode())


class StateView:
    """The ``/state`` routes (see the module docstring)."""

    def __init__(self, job: StateViewJob) -> None:
        self.job = job

    def known_types(self, typename: str) -> dict[str, Type]:
        """State name -> the Type an embedded function declared for it (none for remote)."""
        function = self.job.functions.resolve(typename)
        if not isinstance(function, EmbeddedFunction):
            return {}
        return {spec.name: spec.type for spec in function.function.specs}

    def lookup(self, typename: str, id_: str) -> dict[str, Any] | None:
        """The address's decoded state, or None when it holds none."""
        key_group = key_group_for(typename, id_, self.job.settings.max_parallelism)
        values: Mapping[str, Any] | None = self.job.state.get(key_group, (typename, id_))
        if not values:
            return None
        return describe_address(typename, id_, key_group, values, self.known_types(typename))

    async def list_ids(self, typename: str, after: str | None, limit: int) -> dict[str, Any]:
        """A page of the ids of ``typename`` (the loop is given back every ``_SLICE_S``)."""
        max_p = self.job.settings.max_parallelism
        first = 0 if after is None else key_group_for(typename, after, max_p)
        ids: list[str] = []
        held = time.perf_counter()
        for key_group in range(first, max_p):
            wanted = limit - len(ids)
            # The backend is read after any yield: whatever it holds then, never a stale one.
            steps = self.job.state.ids_in_steps(
                key_group, typename, after if key_group == first else None, wanted
            )
            page = None
            while page is None:
                try:
                    next(steps)
                except StopIteration as done:
                    page = done.value
                if time.perf_counter() - held > _SLICE_S:
                    await asyncio.sleep(0)
                    held = time.perf_counter()
            ids += page
            if len(ids) >= limit:
                break
        return {
            "typename": typename,
            "ids": ids,
            "next": ids[-1] if len(ids) >= limit else None,
        }

    async def handle(self, segments: list[str], query: str) -> Reply:
        address = split_address(segments)
        if address is None:
            return plain(404, "use /state/<namespace>/<type>/<id> or /state/<namespace>/<type>")
        typename, id_ = address
        if id_ is not None:
            found = self.lookup(typename, id_)
            if found is None:
                return plain(404, f"no state for {typename}/{id_}")
            return _json(200, found)
        params = parse_qs(query, keep_blank_values=True)
        raw_limit = params.get("limit", [str(DEFAULT_LIMIT)])[-1]
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = -1
        if not 1 <= limit <= MAX_LIMIT:
            return plain(400, f"limit must be an integer 1-{MAX_LIMIT}, got {raw_limit[:40]!r}")
        after = params.get("after", [None])[-1]
        return _json(200, await self.list_ids(typename, after or None, limit))
