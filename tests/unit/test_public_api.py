"""Pins the public surface: what `from statefun import *` and `statefun.sdk` give."""

import subprocess
import sys

import statefun
import statefun.sdk

# The names of Apache StateFun's Python SDK 3.3 (statefun/__init__.py of apache-flink-statefun).
OFFICIAL_SDK_NAMES = {
    "TypeSerializer",
    "Type",
    "simple_type",
    "ValueSpec",
    "SdkAddress",
    "BoolType",
    "IntType",
    "FloatType",
    "DoubleType",
    "LongType",
    "StringType",
    "Message",
    "EgressMessage",
    "message_builder",
    "egress_message_builder",
    "kafka_egress_message",
    "kinesis_egress_message",
    "Context",
    "StatefulFunctions",
    "RequestReplyHandler",
    "make_protobuf_type",
    "make_json_type",
}

ERRORS = {
    "ConfigurationError",
    "FunctionInvocationError",
    "ModuleError",
    "ProtocolError",
    "RetryableFunctionError",
    "StatefunError",
    "TerminalFunctionError",
    "exceptions",
}


def test_star_import_is_the_official_sdk_surface_plus_errors() -> None:
    assert set(statefun.__all__) == OFFICIAL_SDK_NAMES | ERRORS
    for name in statefun.__all__:
        assert getattr(statefun, name) is not None


# HTTP serving (aiohttp) is part of the SDK, resolved lazily.
SERVING_NAMES = {"make_app", "serve", "start_server"}


def test_sdk_surface() -> None:
    assert set(statefun.sdk.__all__) >= OFFICIAL_SDK_NAMES | SERVING_NAMES
    for name in statefun.sdk.__all__:
        assert getattr(statefun.sdk, name) is not None


def test_serving_is_lazy() -> None:
    # A process of its own: this one may have imported aiohttp already.
    code = (
        "import sys, statefun, statefun.sdk\n"
        "assert 'aiohttp' not in sys.modules, 'import statefun imported aiohttp'\n"
        "assert 'statefun._http.server' not in sys.modules\n"
        "statefun.sdk.serve\n"
        "assert 'statefun._http.server' in sys.modules\n"
        "assert 'aiohttp' not in sys.modules, 'the built-in server imported aiohttp'\n"
        "statefun.sdk.make_app(statefun.StatefulFunctions())\n"
        "assert 'aiohttp' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_star_import_namespace() -> None:
    namespace: dict[str, object] = {}
    exec("from statefun import *", namespace)
    assert set(namespace) >= OFFICIAL_SDK_NAMES


def test_generated_protobuf_code_runs_on_upb() -> None:
    from google.protobuf.internal import api_implementation

    from statefun.sdk._proto import request_reply_pb2

    assert api_implementation.Type() == "upb"
    assert (
        request_reply_pb2.ToFunction.DESCRIPTOR.full_name == "io.statefun.sdk.reqreply.ToFunction"
    )
