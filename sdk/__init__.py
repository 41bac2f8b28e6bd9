"""The function SDK: write stateful functions, serve them over StateFun's protocol.

Code written for Apache StateFun's Python SDK 3.x runs unchanged against these names.
"""

from typing import TYPE_CHECKING

from statefun._exceptions import (
    InvalidFunctionError,
    InvalidSpecError,
    InvalidTypeNameError,
    InvalidValueError,
    MalformedRequestError,
    StatefunError,
    StateTypeMismatchError,
    UnknownFunctionError,
)
from statefun.sdk._context import Context
from statefun.sdk._functions import StatefulFunction, StatefulFunctions
from statefun.sdk._handler import RequestReplyHandler
from statefun.sdk._messages import (
    EgressMessage,
    Message,
    egress_message_builder,
    kafka_egress_message,
    kinesis_egress_message,
    message_builder,
)
from statefun.sdk._spec import SdkAddress, ValueSpec
from statefun.sdk._types import (
    BoolType,
    DoubleType,
    FloatType,
    IntType,
    LongType,
    StringType,
    Type,
    TypedValue,
    TypeSerializer,
    make_json_type,
    make_protobuf_type,
    simple_type,
)

__all__ = [
    "BoolType",
    "Context",
    "DoubleType",
    "EgressMessage",
    "FloatType",
    "IntType",
    "InvalidFunctionError",
    "InvalidSpecError",
    "InvalidTypeNameError",
    "InvalidValueError",
    "LongType",
    "MalformedRequestError",
    "Message",
    "RequestReplyHandler",
    "SdkAddress",
    "StateTypeMismatchError",
    "StatefulFunction",
    "StatefulFunctions",
    "StatefunError",
    "StringType",
    "Type",
    "TypeSerializer",
    "TypedValue",
    "UnknownFunctionError",
    "ValueSpec",
    "egress_message_builder",
    "kafka_egress_message",
    "kinesis_egress_message",
    "make_app",
    "make_json_type",
    "make_protobuf_type",
    "message_builder",
    "serve",
    "simple_type",
    "start_server",
]

if TYPE_CHECKING:
    from statefun.sdk._serve import make_app, serve, start_server

# HTTP serving is imported on first use, never by `import statefun` (and aiohttp only by
# make_app: the built-in server needs nothing but asyncio).
_SERVING = ("make_app", "serve", "start_server")


def __getattr__(name: str) -> object:
    if name in _SERVING:
        from statefun.sdk import _serve

        return getattr(_serve, name)
    raise AttributeError(f"module 'statefun.sdk' has no attribute {name!r}")
