"""The function SDK: write stateful functions, serve them over StateFun's protocol.

Code written for Apache StateFun's Python SDK 3.x runs unchanged against these names.
"""

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

from statefun._exceptions import (
    InvalidFunctionError,
    InvalidSpecError,
    InvalidTypeNameError,
    MalformedRequestError,
    StatefunError,
    StateTypeMismatchError,
    UnknownFunctionError,
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
    "make_json_type",
    "make_protobuf_type",
    "message_builder",
    "serve",
    "simple_type",
]


def __getattr__(name: str) -> object:
    # serve() needs aiohttp; import it only when asked for.
    if name == "serve":
        from statefun.sdk._serve import serve

        return serve
    raise AttributeError(f"module 'statefun.sdk' has no attribute {name!r}")
