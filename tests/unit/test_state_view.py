"""How the state view decodes stored values: built-in types, declared JSON types, protobuf
messages this process knows, JSON by its look, base64 otherwise; TTL deadlines; and the
paths it accepts."""

from __future__ import annotations

import base64

from google.protobuf import timestamp_pb2

from statefun.runtime._state_view import describe_value, split_address
from statefun.sdk import BoolType, IntType, StringType, make_json_type
from statefun.sdk._types import TypedValue, to_typed_value
from statefun.state._expiring import ExpiringValue


def test_builtin_and_declared_types() -> None:
    assert describe_value(to_typed_value(IntType, -5))["value"] == -5
    assert describe_value(to_typed_value(BoolType, True))["value"] is True
    assert describe_value(to_typed_value(StringType, "héllo"))["value"] == "héllo"
    cart = make_json_type("shop/Cart")
    typed = to_typed_value(cart, {"items": [1, 2]})
    assert describe_value(typed, cart) == {
        "typename": "shop/Cart",
        "encoding": "json",
        "value": {"items": [1, 2]},
    }


def test_protobuf_json_look_and_base64() -> None:
    stamp = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    typed = TypedValue("type.googleapis.com/google.protobuf.Timestamp", stamp.SerializeToString())
    shown = describe_value(typed)
    assert (shown["encoding"], shown["value"]) == ("protobuf", "2023-11-14T22:13:20Z")
    assert describe_value(TypedValue("x/unknown", b"[1, 2]"))["value"] == [1, 2]
    raw = b"\x00\xffnot json"
    assert describe_value(TypedValue("x/unknown", raw)) == {
        "typename": "x/unknown",
        "encoding": "base64",
        "value": base64.b64encode(raw).decode(),
    }
    # bytes that do not decode as the type they claim are shown raw, not an error
    assert describe_value(TypedValue("io.statefun.types/int", b"\xff"))["encoding"] == "base64"
    assert describe_value(TypedValue("x/y", None))["value"] is None


def test_deadlines() -> None:
    typed = ExpiringValue(to_typed_value(IntType, 1), 5_000)
    assert describe_value(typed, now_ms=4_000)["expires_at_ms"] == 5_000
    assert "expired" not in describe_value(typed, now_ms=4_000)
    assert describe_value(typed, now_ms=5_000)["expired"] is True


def test_paths() -> None:
    assert split_address(["shop", "cart", "dave"]) == ("shop/cart", "dave")
    assert split_address(["shop", "cart"]) == ("shop/cart", None)
    assert split_address(["a%2Fb", "cart", "d%20e"]) == ("a/b/cart", "d e")
    assert split_address(["shop"]) is None
    assert split_address(["", "cart", "x"]) is None
