"""Runs one side of the wire-compatibility tests: the official SDK's or ours.

Started as a subprocess with the python of that side (a peer virtualenv's, or this project's),
it reads jobs from stdin, one JSON object per line, and answers each with one JSON line on
stdout. A job is ``{"ops": [op, ...]}``; the answer is ``{"results": [result, ...]}``, one per
op, where a failed op gives ``{"error": "<exception type>: <message>"}``. It exits at EOF.

Operations (``op`` field):

- ``hello``: which ``statefun`` package and protobuf this side runs.
- ``encode_request``: ``request`` (see ``_build_request``) -> ``b64``, a ToFunction built with
  this side's generated protobuf classes, values encoded with this side's types.
- ``handle``: ``b64`` (a ToFunction) and ``mode`` ("sync" or "async") -> ``b64`` of the
  FromFunction that this side's RequestReplyHandler returns for the scenario functions.
- ``decode_response``: ``b64`` (a FromFunction) -> ``message``, its canonical JSON form
  (``MessageToDict`` with field names as in the .proto; bytes as base64).
- ``encode_values``: ``items``, a list of typed-value descriptions -> ``b64`` of each value
  encoded by this side's type serializer (or an error).
- ``decode_values``: ``items``, a list of ``{"type": ..., "b64": ...}`` -> ``value`` of each.

A typed-value description is one of ``{"type": T, "value": v}`` (T is int, long, float, double,
bool, string, json or timestamp; a timestamp value is ``{"seconds": s, "nanos": n}``),
``{"typename": tn, "b64": raw}`` (bytes as they are) or ``{"typename": tn, "has_value": false}``.

Only ``from statefun import *`` and each side's own generated protobuf module are used, so the
tool runs unchanged against both packages.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `scenarios` (even with -I)

import scenarios
from google.protobuf import __version__ as protobuf_version
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

import statefun

try:  # this project
    from statefun.sdk._proto import request_reply_pb2 as pb

    SIDE = "pystatefun"
except ImportError:  # the official package (or its fork)
    from statefun import request_reply_pb2 as pb

    SIDE = "official"

TYPES: dict[str, Any] = {
    "int": statefun.IntType,
    "long": statefun.LongType,
    "float": statefun.FloatType,
    "double": statefun.DoubleType,
    "bool": statefun.BoolType,
    "string": statefun.StringType,
    "json": scenarios.JSON_TYPE,
    "timestamp": scenarios.TIMESTAMP_TYPE,
}


def _b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _to_python(type_name: str, value: Any) -> Any:
    if type_name == "timestamp":
        return Timestamp(seconds=value["seconds"], nanos=value["nanos"])
    return value


def _from_python(type_name: str, value: Any) -> Any:
    if type_name == "timestamp":
        return {"seconds": value.seconds, "nanos": value.nanos}
    return value


def _encode_value(item: dict[str, Any]) -> bytes:
    type_name = item["type"]
    serializer = TYPES[type_name].serializer()
    return bytes(serializer.serialize(_to_python(type_name, item["value"])))


def _fill_typed_value(target: Any, item: dict[str, Any]) -> None:
    if "type" in item:
        target.typename = TYPES[item["type"]].typename
        target.has_value = True
        target.value = _encode_value(item)
    else:
        target.typename = item["typename"]
        target.has_value = item.get("has_value", True)
        target.value = _unb64(item.get("b64", ""))


def _fill_address(target: Any, address: list[str]) -> None:
    typename, id_ = address
    namespace, _, name = typename.rpartition("/")
    target.namespace = namespace
    target.type = name
    target.id = id_


def _build_request(request: dict[str, Any]) -> bytes:
    """A ToFunction from ``{"target": [typename, id], "state": [[name, value-or-null], ...],
    "invocations": [{"caller": [typename, id] (optional), "argument": value}, ...]}``.

    A state entry with null has no state_value at all; ``"invocations": []`` gives an empty
    batch.
    """
    to_function = pb.ToFunction()
    batch = to_function.invocation
    _fill_address(batch.target, request["target"])
    for name, value in request.get("state", []):
        persisted = batch.state.add()
        persisted.state_name = name
        if value is not None:
            _fill_typed_value(persisted.state_value, value)
    for invocation in request["invocations"]:
        pb_invocation = batch.invocations.add()
        if invocation.get("caller") is not None:
            _fill_address(pb_invocation.caller, invocation["caller"])
        _fill_typed_value(pb_invocation.argument, invocation["argument"])
    if not request["invocations"]:
        batch.SetInParent()
    return bytes(to_function.SerializeToString())


def _handle(data: bytes, mode: str) -> bytes:
    if mode == "sync":
        return bytes(scenarios.handler.handle_sync(data))
    if mode == "async":
        return bytes(asyncio.run(scenarios.handler.handle_async(data)))
    raise ValueError(f"unknown mode {mode!r}")


def _decode_response(data: bytes) -> dict[str, Any]:
    from_function = pb.FromFunction()
    from_function.ParseFromString(data)
    if from_function.SerializeToString() != data:
        # Field order or encoding not canonical: the dict alone would not show it.
        raise ValueError("the response is not in canonical protobuf encoding")
    return dict(MessageToDict(from_function, preserving_proto_field_name=True))


def _run_op(op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "hello":
        return {
            "side": SIDE,
            "statefun_file": statefun.__file__,
            "protobuf": protobuf_version,
            "python": sys.version.split()[0],
        }
    if kind == "encode_request":
        return {"b64": _b64(_build_request(op["request"]))}
    if kind == "handle":
        return {"b64": _b64(_handle(_unb64(op["b64"]), op["mode"]))}
    if kind == "decode_response":
        return {"message": _decode_response(_unb64(op["b64"]))}
    if kind == "encode_values":
        return {
            "items": [
                _guard(lambda item=item: {"b64": _b64(_encode_value(item))}) for item in op["items"]
            ]
        }
    if kind == "decode_values":
        return {
            "items": [
                _guard(
                    lambda item=item: {
                        "value": _from_python(
                            item["type"],
                            TYPES[item["type"]].serializer().deserialize(_unb64(item["b64"])),
                        )
                    }
                )
                for item in op["items"]
            ]
        }
    raise ValueError(f"unknown op {kind!r}")


def _guard(fn: Any) -> dict[str, Any]:
    try:
        return dict(fn())
    except Exception as exc:  # reported to the test, which decides
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    out = sys.stdout
    sys.stdout = io.StringIO()  # nothing but answers may reach the real stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            answer: dict[str, Any] = {
                "results": [_guard(lambda op=op: _run_op(op)) for op in job["ops"]]
            }
        except Exception:
            answer = {"fatal": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
