"""Message.as_type tells a value that fails its own type (the sender's error) from a function
that reads a message as another type (the function's error)."""

from __future__ import annotations

import json

import pytest

from statefun._exceptions import InvalidValueError
from statefun.sdk import IntType, Message, TypedValue, make_json_type

ORDER = make_json_type("example/Order")


def test_a_value_that_fails_its_own_type_raises_invalid_value_error() -> None:
    message = Message("example/orders", "a", TypedValue(ORDER.typename, b"{garbage"))
    with pytest.raises(InvalidValueError, match=r"example/orders/a is not a valid example/Order"):
        message.as_type(ORDER)
    with pytest.raises(ValueError):  # still a ValueError for code that catches that
        message.as_type(ORDER)


def test_reading_a_message_as_another_type_is_the_functions_error() -> None:
    message = Message("example/orders", "a", TypedValue("other/Type", b"{garbage"))
    with pytest.raises(json.JSONDecodeError):
        message.as_type(ORDER)
    good = Message("example/orders", "a", TypedValue(ORDER.typename, b'{"n": 1}'))
    assert good.as_type(ORDER) == {"n": 1}
    with pytest.raises(Exception) as raised:
        good.as_type(IntType)
    assert not isinstance(raised.value, InvalidValueError)
