"""pystatefun: stateful functions in Python, compatible with Apache Flink StateFun.

``from statefun import *`` gives the names of StateFun's Python SDK, so functions written for
it run unchanged. The runtime lives in submodules (``statefun.runtime``) and the command line
(``statefun run | plan | serve | send``).
"""

from statefun import _exceptions as exceptions
from statefun._exceptions import (
    ConfigurationError,
    FunctionInvocationError,
    ModuleError,
    ProtocolError,
    RetryableFunctionError,
    StatefunError,
    TerminalFunctionError,
)
from statefun.sdk import (
    BoolType,
    Context,
    DoubleType,
    EgressMessage,
    FloatType,
    IntType,
    LongType,
    Message,
    RequestReplyHandler,
    SdkAddress,
    StatefulFunctions,
    StringType,
    Type,
    TypeSerializer,
    ValueSpec,
    egress_message_builder,
    kafka_egress_message,
    kinesis_egress_message,
    make_json_type,
    make_protobuf_type,
    message_builder,
    simple_type,
)

__version__ = "0.1.0"

# StateFun's SDK surface, plus this project's error classes.
__all__ = [
    "BoolType",
    "ConfigurationError",
    "Context",
    "DoubleType",
    "EgressMessage",
    "FloatType",
    "FunctionInvocationError",
    "IntType",
    "LongType",
    "Message",
    "ModuleError",
    "ProtocolError",
    "RequestReplyHandler",
    "RetryableFunctionError",
    "SdkAddress",
    "StatefulFunctions",
    "StatefunError",
    "StringType",
    "TerminalFunctionError",
    "Type",
    "TypeSerializer",
    "ValueSpec",
    "egress_message_builder",
    "exceptions",
    "kafka_egress_message",
    "kinesis_egress_message",
    "make_json_type",
    "make_protobuf_type",
    "message_builder",
    "simple_type",
]
