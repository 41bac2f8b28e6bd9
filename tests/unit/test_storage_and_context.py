"""context.storage (reads, writes, deletes, mutations) and the context's ways to send."""

from __future__ import annotations

import enum
import struct
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statefun._exceptions import InvalidTypeNameError, StateTypeMismatchError
from statefun.sdk import (
    BoolType,
    Context,
    DoubleType,
    EgressMessage,
    FloatType,
    IntType,
    LongType,
    SdkAddress,
    StringType,
    TypedValue,
    ValueSpec,
    _spec,
    egress_message_builder,
    kafka_egress_message,
    make_json_type,
    message_builder,
)
from statefun.sdk._context import DelayedMessage, InvocationContext, address_from_pb
from statefun.sdk._proto import request_reply_pb2
from statefun.sdk._spec import address_of
from statefun.sdk._storage import (
    UNWRITTEN,
    AddressStorage,
    Deleting,
    make_storage_class,
    storage_mutations,
    unknown_state_hint,
)

FN = "com.example/fn"
JSON = make_json_type("com.example/Json")
SPECS = [
    ValueSpec("count", IntType),
    ValueSpec("name", StringType),
    ValueSpec("profile", JSON),
    ValueSpec("ratio", FloatType),
    ValueSpec("total", DoubleType),
    ValueSpec("big", LongType),
    ValueSpec("flag", BoolType),
]
Storage = make_storage_class(FN, SPECS)


def tv(tpe: Any, value: Any) -> TypedValue:
    return TypedValue(tpe.typename, tpe.serializer().serialize(value))


def storage(**values: Any) -> Any:
    return Storage(FN, dict(values))


def full_storage() -> Any:
    return storage(
        count=tv(IntType, 3),
        name=tv(StringType, "zoë"),
        profile=tv(JSON, {"tags": ["a"]}),
        ratio=TypedValue(FloatType.typename, None),
        total=request_reply_pb2.TypedValue(typename=DoubleType.typename, has_value=False),
        big=request_reply_pb2.TypedValue(
            typename=LongType.typename, has_value=True, value=b"\x09" + struct.pack("<q", 2**40)
        ),
        flag=tv(BoolType, True),
    )


# ---------------------------------------------------------------------------------- reads


def test_reads_present_values() -> None:
    s = full_storage()
    assert s.count == 3
    assert s.name == "zoë"
    assert s.profile == {"tags": ["a"]}
    assert s.big == 2**40  # from a protobuf TypedValue, as the handler passes them
    assert s.flag is True
    assert isinstance(s, AddressStorage)


def test_reads_absent_and_valueless_state_as_none() -> None:
    s = full_storage()
    assert s.ratio is None  # has_value False
    assert s.total is None  # protobuf TypedValue with has_value False
    empty = storage()  # nothing sent at all
    for spec in SPECS:
        assert getattr(empty, spec.name) is None
    assert storage(count=None).count is None


def test_reads_repeatedly() -> None:
    s = full_storage()
    assert [s.count, s.count, s.name, s.name] == [3, 3, "zoë", "zoë"]


def test_type_mismatch() -> None:
    s = storage(count=tv(StringType, "3"), name=TypedValue(IntType.typename, None))
    with pytest.raises(StateTypeMismatchError) as info:
        _ = s.count
    assert isinstance(info.value, TypeError)
    assert str(info.value) == (
        "state 'count' of 'com.example/fn' holds a value of type 'io.statefun.types/string', "
        "but its ValueSpec declares 'io.statefun.types/int'"
    )
    assert s.name is None  # no value: the typename is not checked
    s.count = 5  # writing replaces it
    assert s.count == 5


def test_unknown_attribute() -> None:
    s = full_storage()
    with pytest.raises(AttributeError) as info:
        _ = s.cuont
    assert str(info.value) == "'Storage[com.example/fn]' object has no attribute 'cuont'"
    assert unknown_state_hint(info.value) == (
        " ('cuont' is not a registered ValueSpec; "
        "registered: ['big', 'count', 'flag', 'name', 'profile', 'ratio', 'total'])"
    )
    with pytest.raises(AttributeError) as info:
        _ = make_storage_class("a/b", [])("a/b", {}).anything
    assert unknown_state_hint(info.value).endswith("registered: none)")
    with pytest.raises(AttributeError):
        s.cuont = 1
    assert not hasattr(s, "cuont")
    assert not hasattr(s, "__deepcopy_hook__")
    assert storage_mutations(s) == []
    assert unknown_state_hint(ValueError("x")) == ""
    assert unknown_state_hint(AttributeError("no obj")) == ""


# ---------------------------------------------------------------------------------- writes


def test_write_then_read() -> None:
    s = full_storage()
    s.count = 4
    s.name = "Ann"
    s.profile = {"tags": ["a", "b"]}
    s.flag = False
    assert (s.count, s.name, s.profile, s.flag) == (4, "Ann", {"tags": ["a", "b"]}, False)
    assert storage_mutations(s) == [
        ("count", tv(IntType, 4)),
        ("name", tv(StringType, "Ann")),
        ("profile", TypedValue("com.example/Json", b'{"tags": ["a", "b"]}')),
        ("flag", TypedValue("io.statefun.types/bool", b"")),
    ]


def test_only_changed_states_are_reported() -> None:
    s = full_storage()
    assert storage_mutations(s) == []
    _ = (s.count, s.name, s.profile, s.ratio)  # reads are not mutations
    assert storage_mutations(s) == []
    s.name = "x"
    assert storage_mutations(s) == [("name", tv(StringType, "x"))]


def test_each_state_is_reported_once_with_its_last_value() -> None:
    s = storage()
    s.count = 1
    s.name = "a"
    s.count = 2
    s.count = 3
    assert storage_mutations(s) == [("count", tv(IntType, 3)), ("name", tv(StringType, "a"))]


def test_writing_the_same_value_is_still_a_write() -> None:
    s = full_storage()
    s.count = 3
    assert storage_mutations(s) == [
        ("count", TypedValue("io.statefun.types/int", b"\x0d\x03\0\0\0"))
    ]


def test_delete() -> None:
    s = full_storage()
    del s.count
    assert s.count is None
    assert storage_mutations(s) == [("count", None)]
    s.count = 9
    assert s.count == 9
    assert storage_mutations(s) == [("count", tv(IntType, 9))]
    s.name = "y"
    del s.name
    assert s.name is None
    assert storage_mutations(s) == [("count", tv(IntType, 9)), ("name", None)]


def test_the_values_given_stay_as_they_are_the_first_write_copies_them() -> None:
    given = {"count": tv(IntType, 3), "name": tv(StringType, "a")}
    before = dict(given)
    s = Storage(FN, given)
    assert s._values is given  # nothing copied while nothing is written
    s.count = 4
    del s.name
    s.flag = True
    assert given == before  # the runtime passes the state's own dict: never changed
    assert (s.count, s.name, s.flag) == (4, None, True)
    assert storage_mutations(s) == [
        ("count", tv(IntType, 4)),
        ("name", None),
        ("flag", tv(BoolType, True)),
    ]
    d = Storage(FN, given)
    del d.count  # a delete first copies too
    assert given == before and d.count is None and storage_mutations(d) == [("count", None)]


def test_a_storage_made_own_writes_its_values_in_place() -> None:
    given = {"count": tv(IntType, 3)}
    s = Storage(FN, given, own=True)  # (the SDK's handler: the batch's own dict)
    s.count = 4
    del s.name
    assert s._values is given and given == {"count": tv(IntType, 4), "name": None}
    assert storage_mutations(s) == [("count", tv(IntType, 4)), ("name", None)]


@settings(max_examples=200, deadline=None)
@given(
    own=st.booleans(),
    given_names=st.sets(st.sampled_from(["count", "name", "flag"])),
    steps=st.lists(
        st.tuples(st.sampled_from(["count", "name", "flag"]), st.booleans()), max_size=8
    ),
)
def test_the_names_written_and_whether_any_was_deleted_against_a_model(
    own: bool, given_names: set[str], steps: list[tuple[str, bool]]
) -> None:
    """``_dirty`` holds each name written or deleted once, in the order first touched, and
    is a ``Deleting`` whenever the values hold a deleted state (None; also once one deleted
    was written again): the slice loop looks for deleted names only then."""
    values = {"count": tv(IntType, 1), "name": tv(StringType, "a"), "flag": tv(BoolType, True)}
    written = {"count": 7, "name": "b", "flag": False}
    s = Storage(FN, {name: values[name] for name in given_names}, own=own)
    touched: list[str] = []
    for name, delete in steps:
        if delete:
            delattr(s, name)
        else:
            setattr(s, name, written[name])
        if name not in touched:
            touched.append(name)
    dirty = s._dirty
    assert list(dirty) == touched
    assert (dirty is UNWRITTEN) == (not touched and not own)
    if any(value is None for value in s._values.values()):
        assert type(dirty) is Deleting
    assert (type(dirty) is Deleting) == any(delete for _, delete in steps)


def test_delete_of_an_absent_value_is_reported() -> None:
    s = storage()
    del s.profile
    assert storage_mutations(s) == [("profile", None)]


def test_none_assignment() -> None:
    s = full_storage()
    with pytest.raises(ValueError) as info:
        s.count = None
    assert str(info.value) == "state 'count': cannot store None; use `del context.storage.count`"
    assert s.count == 3
    assert storage_mutations(s) == []


def test_bad_write_fails_where_it_is_assigned() -> None:
    s = full_storage()
    with pytest.raises(TypeError):
        s.count = "4"
    with pytest.raises(ValueError):
        s.count = 2**31
    with pytest.raises(TypeError):
        s.profile = {1, 2}
    assert s.count == 3
    assert storage_mutations(s) == []


def test_float_reads_back_as_the_stored_float32() -> None:
    s = storage()
    s.ratio = 0.1
    assert s.ratio == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    s.total = 3
    assert s.total == 3.0 and type(s.total) is float
    s.flag = 1  # accepted as StateFun's SDK does; reads back as the bool it stored
    assert s.flag is True
    s.name = b"bytes"
    assert s.name == "bytes"


def test_subclass_values_read_back_as_the_plain_type() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    s = storage()
    s.count = Level.HIGH
    s.name = Name("n")
    assert s.count == 3 and type(s.count) is int
    assert s.name == "n" and type(s.name) is str
    s.count = 4  # a plain int is kept as it is
    assert s.count == 4
    assert storage_mutations(s) == [("count", tv(IntType, 4)), ("name", tv(StringType, "n"))]


def test_json_values_are_independent_unless_assigned() -> None:
    s = full_storage()
    first = s.profile
    second = s.profile
    assert first == second == {"tags": ["a"]}
    assert first is not second
    first["tags"].append("changed")
    assert s.profile == {"tags": ["a"]}  # a mutation without assignment is not stored
    assert storage_mutations(s) == []
    s.profile = first
    first["tags"].append("after")  # the value was encoded when assigned
    assert s.profile == {"tags": ["a", "changed"]}
    assert s.profile is not first
    assert storage_mutations(s) == [("profile", tv(JSON, {"tags": ["a", "changed"]}))]


def test_storage_classes_are_separate_per_function() -> None:
    other = make_storage_class("a/other", [ValueSpec("count", StringType)])
    s = other("a/other", {"count": tv(StringType, "x")})
    assert s.count == "x"
    assert full_storage().count == 3
    assert "a/other" in repr(s)


# ---------------------------------------------------------------------------------- context

ADDRESS = SdkAddress("com.example", "fn", "id-1", FN)


def context() -> InvocationContext:
    return InvocationContext(ADDRESS, full_storage())


def test_context_basics() -> None:
    ctx = context()
    assert isinstance(ctx, Context)
    assert ctx.address == ADDRESS
    assert ctx.storage.count == 3
    assert ctx.caller is None
    caller = SdkAddress("a", "b", "c", "a/b")
    ctx.set_caller(caller)
    assert ctx.caller == caller
    assert (ctx.messages, ctx.delayed, ctx.egress) == ([], [], [])


def test_context_of_a_runtime_key_makes_its_address_when_asked() -> None:
    """The runtime gives its (typename, id); the SdkAddress is made on the first read."""
    caller = SdkAddress("a", "b", "c", "a/b")
    ctx = InvocationContext((FN, "id-1"), full_storage(), caller)
    assert ctx.address == ADDRESS and type(ctx.address) is SdkAddress
    assert ctx.address is ctx.address
    assert ctx.caller is caller
    nested = InvocationContext(("org.x.y/kind", "7"), full_storage()).address
    assert nested == SdkAddress("org.x.y", "kind", "7", "org.x.y/kind")


def test_addresses_made_from_keys_are_kept_boundedly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_spec, "_ADDRESSES", {})
    monkeypatch.setattr(_spec, "_MAX_ADDRESSES", 3)
    first = address_of((FN, "0"))
    assert address_of((FN, "0")) is first
    for index in range(1, 5):
        assert address_of((FN, str(index))).id == str(index)
        assert len(_spec._ADDRESSES) <= 3
    assert address_of((FN, "0")) == first


def test_each_context_gets_outputs_of_its_own_when_it_sends() -> None:
    """Before sending, every context shows the one shared empty output, which refuses to
    change; the first send of each kind gives the context a list of its own."""
    one, two = context(), context()
    assert one.messages == one.delayed == one.egress == [] and not one.messages
    for method, args in [("append", (1,)), ("extend", ([1],)), ("insert", (0, 1)), ("clear", ())]:
        with pytest.raises(TypeError, match="send methods only"):
            getattr(two.messages, method)(*args)
    with pytest.raises(TypeError):
        two.egress += [1]
    message = message_builder("com.example/other", "x", int_value=1)
    record = egress_message_builder("com.example/out", 1, IntType)
    one.send(message)
    one.send_after(timedelta(seconds=1), message)
    one.cancel_delayed_message("token")
    one.send_egress(record)
    one.send_egress(record)
    assert one.messages == [message] and one.egress == [record, record]
    assert [d.cancellation_token for d in one.delayed] == ["", "token"]
    assert two.messages == two.delayed == two.egress == [] and context().egress == []


def test_caller_from_protobuf() -> None:
    ctx = context()
    with_caller = request_reply_pb2.ToFunction.Invocation(
        caller=request_reply_pb2.Address(namespace="org.x", type="sender", id="s-1")
    )
    ctx.set_caller_from_pb(with_caller)
    assert ctx.caller == SdkAddress("org.x", "sender", "s-1", "org.x/sender")
    ctx.set_caller_from_pb(request_reply_pb2.ToFunction.Invocation())  # from an ingress
    assert ctx.caller is None
    assert address_from_pb(request_reply_pb2.Address()) is None


def test_send() -> None:
    ctx = context()
    m1 = message_builder("com.example/other", "a", int_value=1)
    m2 = message_builder("com.example/other", "b", str_value="two")
    ctx.send(m1)
    ctx.send(m2)
    ctx.send(m1)
    assert ctx.messages == [m1, m2, m1]


@pytest.mark.parametrize("bad", [None, "message", TypedValue("a/b", b""), 5])
def test_send_needs_a_message(bad: Any) -> None:
    ctx = context()
    with pytest.raises(TypeError, match=r"send\(\) expects a Message \(see message_builder\)"):
        ctx.send(bad)
    with pytest.raises(TypeError, match=r"send_after\(\) expects a Message"):
        ctx.send_after(timedelta(seconds=1), bad)
    egress = egress_message_builder("a/b", 1, IntType)
    with pytest.raises(TypeError, match=r"send\(\) expects a Message"):
        ctx.send(egress)  # type: ignore[arg-type]
    assert (ctx.messages, ctx.delayed) == ([], [])


@pytest.mark.parametrize("typename", ["noslash", "/x", "x/", "nope-2"])
def test_send_checks_the_target_typename(typename: str) -> None:
    ctx = context()
    message = message_builder(typename, "1", int_value=1)  # the builder does not check it
    with pytest.raises(InvalidTypeNameError, match=f"target typename {typename!r}"):
        ctx.send(message)
    with pytest.raises(InvalidTypeNameError, match=f"target typename {typename!r}"):
        ctx.send_after(timedelta(seconds=1), message)
    # checked every time, not only the first time
    with pytest.raises(InvalidTypeNameError):
        ctx.send(message)
    assert (ctx.messages, ctx.delayed) == ([], [])


@pytest.mark.parametrize("id_", [5, b"id", 1.5])
def test_send_needs_a_str_target_id(id_: Any) -> None:
    ctx = context()
    message = message_builder("a/b", id_, int_value=1)
    with pytest.raises(TypeError, match=r"send\(\): the target id must be a str"):
        ctx.send(message)
    with pytest.raises(TypeError, match=r"send_after\(\): the target id must be a str"):
        ctx.send_after(timedelta(0), message)
    assert (ctx.messages, ctx.delayed) == ([], [])


def test_send_after() -> None:
    ctx = context()
    m = message_builder("a/b", "1", int_value=1)
    ctx.send_after(timedelta(seconds=2), m)
    ctx.send_after(timedelta(seconds=1, milliseconds=1), m, "token-1")
    ctx.send_after(timedelta(0), m, cancellation_token="t2")
    ctx.send_after(timedelta(microseconds=1500), m, None)  # type: ignore[arg-type]
    got = [(d.delay_ms, d.message, d.cancellation_token, d.is_cancellation) for d in ctx.delayed]
    assert got == [
        (2000, m, "", False),
        (1001, m, "token-1", False),
        (0, m, "t2", False),
        (1, m, "", False),
    ]
    assert all(isinstance(d, DelayedMessage) for d in ctx.delayed)


@pytest.mark.parametrize(
    "delay", [timedelta(seconds=-1), timedelta(milliseconds=-1), timedelta(microseconds=-1)]
)
def test_send_after_negative_delay(delay: timedelta) -> None:
    ctx = context()
    with pytest.raises(ValueError, match="at least 0"):
        ctx.send_after(delay, message_builder("a/b", "1", int_value=1))
    assert ctx.delayed == []


@pytest.mark.parametrize("delay", [5, 1.5, "1s", None])
def test_send_after_needs_a_timedelta(delay: Any) -> None:
    with pytest.raises(TypeError, match="timedelta"):
        context().send_after(delay, message_builder("a/b", "1", int_value=1))


def test_send_after_token_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="cancellation token must be a str"):
        context().send_after(timedelta(1), message_builder("a/b", "1", int_value=1), 5)  # type: ignore[arg-type]


def test_cancel_delayed_message() -> None:
    ctx = context()
    m = message_builder("a/b", "1", int_value=1)
    ctx.send_after(timedelta(seconds=1), m, "tok")
    ctx.cancel_delayed_message("tok")
    assert [(d.is_cancellation, d.cancellation_token, d.message) for d in ctx.delayed] == [
        (False, "tok", m),
        (True, "tok", None),
    ]
    assert "cancel 'tok'" in repr(ctx.delayed[1])


@pytest.mark.parametrize("token", ["", None, 5])
def test_cancel_needs_a_token(token: Any) -> None:
    ctx = context()
    with pytest.raises(ValueError, match="non-empty cancellation token"):
        ctx.cancel_delayed_message(token)
    assert ctx.delayed == []


def test_send_egress() -> None:
    ctx = context()
    e1 = kafka_egress_message("com.example/kafka", "topic", "v")
    e2 = egress_message_builder("com.example/generic", 3, IntType)
    ctx.send_egress(e1)
    ctx.send_egress(e2)
    assert ctx.egress == [e1, e2]


@pytest.mark.parametrize("bad", [None, message_builder("a/b", "1", int_value=1), "x"])
def test_send_egress_needs_an_egress_message(bad: Any) -> None:
    ctx = context()
    with pytest.raises(TypeError, match=r"send_egress\(\) expects an EgressMessage"):
        ctx.send_egress(bad)
    assert ctx.egress == []


@pytest.mark.parametrize("typename", ["kafka", "/kafka", "io/"])
def test_send_egress_checks_the_typename(typename: str) -> None:
    ctx = context()
    message = EgressMessage(typename, TypedValue("a/b", b"x"))
    with pytest.raises(InvalidTypeNameError, match=f"egress typename {typename!r}"):
        ctx.send_egress(message)
    with pytest.raises(InvalidTypeNameError):
        ctx.send_egress(message)
    assert ctx.egress == []
