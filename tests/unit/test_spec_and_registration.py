"""ValueSpec validation and function registration (bind / register / for_typename)."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest

from statefun._exceptions import (
    ConfigurationError,
    InvalidFunctionError,
    InvalidSpecError,
    InvalidTypeNameError,
    StatefunError,
    UnknownFunctionError,
)
from statefun.sdk import (
    Context,
    IntType,
    Message,
    SdkAddress,
    StatefulFunctions,
    StringType,
    ValueSpec,
    make_json_type,
)

# ---------- ValueSpec


def test_value_spec_defaults() -> None:
    spec = ValueSpec(name="seen_count", type=IntType)
    assert spec.name == "seen_count"
    assert spec.type is IntType
    assert (spec.duration, spec.after_call, spec.after_write) == (0, False, False)
    assert repr(spec) == "ValueSpec('seen_count', 'io.statefun.types/int')"


def test_value_spec_positional_and_underscore_names() -> None:
    assert ValueSpec("_private", StringType).name == "_private"
    assert ValueSpec("a1_b2", StringType).name == "a1_b2"
    assert ValueSpec("x", make_json_type("a/b")).type.typename == "a/b"


def test_expire_after_call() -> None:
    spec = ValueSpec("v", IntType, expire_after_call=timedelta(seconds=5))
    assert (spec.duration, spec.after_call, spec.after_write) == (5000, True, False)
    assert repr(spec) == "ValueSpec('v', 'io.statefun.types/int', expire_after_call=5000ms)"


def test_expire_after_write() -> None:
    spec = ValueSpec("v", IntType, expire_after_write=timedelta(minutes=2, milliseconds=7))
    assert (spec.duration, spec.after_call, spec.after_write) == (120_007, False, True)
    assert repr(spec) == "ValueSpec('v', 'io.statefun.types/int', expire_after_write=120007ms)"


@pytest.mark.parametrize(
    ("ttl", "millis"),
    [
        (timedelta(milliseconds=1), 1),
        (timedelta(seconds=1, milliseconds=1), 1001),  # 1.001 * 1000 is 1000.999... in floats
        (timedelta(seconds=4.35), 4350),
        (timedelta(milliseconds=1.9), 1),  # whole milliseconds, rounded down
        (timedelta(days=1), 86_400_000),
        (timedelta(days=365 * 100), 3_153_600_000_000),
    ],
)
def test_ttl_in_whole_milliseconds(ttl: timedelta, millis: int) -> None:
    assert ValueSpec("v", IntType, expire_after_call=ttl).duration == millis
    assert ValueSpec("v", IntType, expire_after_write=ttl).duration == millis


def test_zero_ttl_is_no_ttl() -> None:
    spec = ValueSpec("v", IntType, expire_after_call=timedelta(0))
    assert (spec.duration, spec.after_call, spec.after_write) == (0, False, False)
    spec = ValueSpec("v", IntType, expire_after_call=timedelta(0), expire_after_write=timedelta(1))
    assert (spec.duration, spec.after_call, spec.after_write) == (86_400_000, False, True)


@pytest.mark.parametrize(
    "ttl", [timedelta(microseconds=999), timedelta(seconds=-1), timedelta(milliseconds=-5)]
)
def test_ttl_below_one_millisecond(ttl: timedelta) -> None:
    with pytest.raises(InvalidSpecError, match=r"'v'.*at least 1 ms"):
        ValueSpec("v", IntType, expire_after_write=ttl)


@pytest.mark.parametrize("ttl", [5, 5.0, "5s"])
def test_ttl_must_be_a_timedelta(ttl: Any) -> None:
    with pytest.raises(InvalidSpecError, match=r"'v'.*timedelta"):
        ValueSpec("v", IntType, expire_after_call=ttl)


def test_both_ttls() -> None:
    with pytest.raises(InvalidSpecError, match=r"'v'.*not both") as info:
        ValueSpec(
            "v",
            IntType,
            expire_after_call=timedelta(seconds=1),
            expire_after_write=timedelta(seconds=1),
        )
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["", None])
def test_missing_name(name: Any) -> None:
    with pytest.raises(InvalidSpecError, match="needs a name"):
        ValueSpec(name, IntType)


@pytest.mark.parametrize("name", ["1abc", "a b", "a-b", "a.b", "café!", "x$", " x"])
def test_non_identifier_name(name: str) -> None:
    with pytest.raises(InvalidSpecError, match="invalid state name") as info:
        ValueSpec(name, IntType)
    assert repr(name) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["class", "def", "return", "lambda", "async", "await", "in"])
def test_keyword_name(name: str) -> None:
    with pytest.raises(InvalidSpecError, match="keyword") as info:
        ValueSpec(name, IntType)
    assert repr(name) in str(info.value)


def test_soft_keywords_and_lower_case_constants_are_fine() -> None:
    assert [ValueSpec(n, IntType).name for n in ("none", "true", "match", "type")] == [
        "none",
        "true",
        "match",
        "type",
    ]


@pytest.mark.parametrize("name", ["Count", "COUNT", "seenCount", "True", "None"])
def test_upper_case_name(name: str) -> None:
    with pytest.raises(InvalidSpecError) as info:
        ValueSpec(name, IntType)
    assert repr(name) in str(info.value)


def test_non_string_name() -> None:
    with pytest.raises(InvalidSpecError):
        ValueSpec(5, IntType)  # type: ignore[arg-type]


def test_missing_type() -> None:
    with pytest.raises(InvalidSpecError, match=r"'seen'.*type is missing"):
        ValueSpec("seen", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("tpe", [int, "io.statefun.types/int", 5, object()])
def test_type_not_a_statefun_type(tpe: Any) -> None:
    with pytest.raises(InvalidSpecError, match=r"'seen'.*not a statefun Type"):
        ValueSpec("seen", tpe)


def test_spec_errors_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        ValueSpec("", IntType)
    with pytest.raises(StatefunError):
        ValueSpec("A", IntType)


# ---------- registration


def sync_fun(context: Context, message: Message) -> None:
    pass


async def async_fun(context: Context, message: Message) -> None:
    pass


def test_bind_sync_and_async() -> None:
    functions = StatefulFunctions()
    specs = [ValueSpec("a", IntType), ValueSpec("b", StringType)]

    @functions.bind(typename="com.example/sync", specs=specs)
    def greeter(context: Context, message: Message) -> None:
        pass

    @functions.bind("com.example/async")
    async def agreeter(context: Context, message: Message) -> None:
        pass

    # the decorator returns the function unchanged
    assert greeter.__name__ == "greeter" and callable(greeter)
    assert agreeter.__name__ == "agreeter"
    fn = functions.for_typename("com.example/sync")
    assert fn.fun is greeter
    assert fn.is_async is False
    assert (fn.namespace, fn.name, fn.typename) == ("com.example", "sync", "com.example/sync")
    assert [s.name for s in fn.specs] == ["a", "b"]
    afn = functions.for_typename("com.example/async")
    assert afn.fun is agreeter
    assert afn.is_async is True
    assert afn.specs == []
    assert functions.typenames() == ["com.example/sync", "com.example/async"]
    assert "com.example/sync" in functions
    assert "com.example/other" not in functions
    assert [f.typename for f in functions] == ["com.example/sync", "com.example/async"]


def test_register() -> None:
    functions = StatefulFunctions()
    functions.register("a/b", sync_fun)
    functions.register("a/c", async_fun, [ValueSpec("x", IntType)])
    functions.register("a.b.c/d.e", lambda ctx, msg: None, specs=None)
    assert functions.for_typename("a/b").fun is sync_fun
    assert functions.for_typename("a/c").is_async is True
    assert functions.for_typename("a.b.c/d.e").is_async is False
    assert functions.for_typename("a.b.c/d.e").namespace == "a.b.c"


def test_register_accepts_other_callables() -> None:
    class Handler:
        def __init__(self) -> None:
            self.calls = 0

        def handle(self, context: Context, message: Message) -> None:
            self.calls += 1

        def __call__(self, context: Context, message: Message) -> None:
            pass

    functions = StatefulFunctions()
    handler = Handler()
    functions.register("a/method", handler.handle)
    functions.register("a/callable", handler)
    functions.register("a/defaults", lambda ctx, msg, extra=None: None)
    functions.register("a/varargs", lambda *args: None)
    assert functions.typenames() == ["a/method", "a/callable", "a/defaults", "a/varargs"]


def test_async_detection_of_other_callables() -> None:
    class AsyncCallable:
        async def __call__(self, context: Context, message: Message) -> None:
            pass

    class SyncCallable:
        def __call__(self, context: Context, message: Message) -> None:
            pass

    functions = StatefulFunctions()
    functions.register("a/async-object", AsyncCallable())
    functions.register("a/sync-object", SyncCallable())
    functions.register("a/partial", functools.partial(async_fun))
    functions.register("a/lambda", lambda context, message: None)
    assert [f.is_async for f in functions] == [True, False, True, False]


@pytest.mark.parametrize("typename", ["noslash", "/x", "x/", "", None, "/"])
def test_bad_typename(typename: Any) -> None:
    functions = StatefulFunctions()
    with pytest.raises(ConfigurationError) as info:
        functions.register(typename, sync_fun)
    assert isinstance(info.value, ValueError)
    if typename:
        assert isinstance(info.value, InvalidTypeNameError)
        assert repr(typename) in str(info.value)
    with pytest.raises(ConfigurationError):
        functions.bind(typename)(sync_fun)
    assert functions.typenames() == []


def test_bad_typename_error_text() -> None:
    functions = StatefulFunctions()
    with pytest.raises(
        InvalidTypeNameError, match="'noslash' must be of the form 'namespace/name'"
    ):
        functions.register("noslash", sync_fun)
    with pytest.raises(InvalidTypeNameError, match="'/x' has an empty namespace"):
        functions.register("/x", sync_fun)
    with pytest.raises(InvalidTypeNameError, match="'x/' has an empty name"):
        functions.register("x/", sync_fun)


def one_arg(context: Context) -> None:
    pass


def three_args(context: Context, message: Message, extra: Any) -> None:
    pass


def kw_only(context: Context, message: Message, *, flag: bool) -> None:
    pass


def kw_only_pair(*, context: Context, message: Message) -> None:
    pass


def no_args() -> None:
    pass


@pytest.mark.parametrize(
    ("fun", "shown"),
    [
        (one_arg, "one_arg(context: 'Context') -> 'None'"),
        (three_args, "three_args(context: 'Context', message: 'Message', extra: 'Any')"),
        (kw_only, "kw_only(context: 'Context', message: 'Message', *, flag: 'bool')"),
        (kw_only_pair, "kw_only_pair(*, context: 'Context', message: 'Message')"),
        (no_args, "no_args()"),
    ],
)
def test_wrong_signature(fun: Any, shown: str) -> None:
    functions = StatefulFunctions()
    with pytest.raises(InvalidFunctionError) as info:
        functions.register("com.example/f", fun)
    text = str(info.value)
    assert "'com.example/f'" in text
    assert "two arguments (context, message)" in text
    assert shown in text
    assert "com.example/f" not in functions


def test_wrong_signature_async_and_bind() -> None:
    async def lonely(context: Context) -> None:
        pass

    functions = StatefulFunctions()
    with pytest.raises(InvalidFunctionError, match=r"'a/b'.*lonely"):
        functions.bind("a/b")(lonely)


def test_not_callable_and_missing_function() -> None:
    functions = StatefulFunctions()
    with pytest.raises(InvalidFunctionError, match=r"'a/b'.*not callable"):
        functions.register("a/b", 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidFunctionError, match="missing"):
        functions.register("a/b", None)  # type: ignore[arg-type]


def test_duplicate_typename() -> None:
    functions = StatefulFunctions()
    functions.register("a/b", sync_fun)
    with pytest.raises(InvalidFunctionError, match="already registered for 'a/b'"):
        functions.register("a/b", async_fun)
    with pytest.raises(InvalidFunctionError, match="'a/b'"):
        functions.bind("a/b")(sync_fun)
    assert functions.for_typename("a/b").fun is sync_fun


def test_duplicate_state_names() -> None:
    functions = StatefulFunctions()
    specs = [
        ValueSpec("seen", IntType),
        ValueSpec("name", StringType),
        ValueSpec("seen", StringType),
    ]
    with pytest.raises(InvalidSpecError) as info:
        functions.register("com.example/dup", sync_fun, specs)
    assert str(info.value) == "function 'com.example/dup': state 'seen' is declared twice"
    assert "com.example/dup" not in functions


def test_specs_must_be_value_specs() -> None:
    functions = StatefulFunctions()
    with pytest.raises(InvalidSpecError, match=r"'a/b'.*list of ValueSpec"):
        functions.register("a/b", sync_fun, ValueSpec("x", IntType))  # type: ignore[arg-type]
    with pytest.raises(InvalidSpecError, match=r"'a/b'.*'x'.*not a ValueSpec"):
        functions.register("a/b", sync_fun, ["x"])  # type: ignore[list-item]
    with pytest.raises(InvalidSpecError, match="'a/b'"):
        functions.register("a/b", sync_fun, [IntType])  # type: ignore[list-item]
    assert functions.typenames() == []
    functions.register("a/b", sync_fun, (ValueSpec("x", IntType),))  # type: ignore[arg-type]
    assert [s.name for s in functions.for_typename("a/b").specs] == ["x"]


def test_state_name_reserved_by_the_storage_object() -> None:
    functions = StatefulFunctions()
    with pytest.raises(InvalidSpecError, match=r"'a/b'.*'_values'.*reserved"):
        functions.register("a/b", sync_fun, [ValueSpec("_values", IntType)])


def test_unknown_typename() -> None:
    functions = StatefulFunctions()
    functions.register("com.example/b", sync_fun)
    functions.register("com.example/a", sync_fun)
    with pytest.raises(UnknownFunctionError) as info:
        functions.for_typename("com.example/c")
    error = info.value
    assert isinstance(error, LookupError)
    assert isinstance(error, StatefunError)
    assert error.typename == "com.example/c"
    assert error.known == ["com.example/a", "com.example/b"]
    assert str(error) == (
        "no function is registered for type 'com.example/c'; "
        "registered: com.example/a, com.example/b"
    )
    with pytest.raises(LookupError):
        StatefulFunctions().for_typename("x/y")
    assert str(UnknownFunctionError("x/y")) == "no function is registered for type 'x/y'"


def test_sdk_address() -> None:
    a = SdkAddress("ns", "name", "id1", "ns/name")
    assert (a.namespace, a.name, a.id, a.typename) == ("ns", "name", "id1", "ns/name")
    assert a == SdkAddress("ns", "name", "id1", "ns/name")
    assert a != SdkAddress("ns", "name", "id2", "ns/name")
    assert hash(a) == hash(SdkAddress("ns", "name", "id1", "ns/name"))
    with pytest.raises(AttributeError):
        a.id = "x"  # type: ignore[misc]
