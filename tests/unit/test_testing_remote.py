"""statefun.testing with functions called through StateFun's request-reply protocol (bytes in,
bytes out): the same functions give the same outcomes embedded and remote, state specs are
learnt from IncompleteInvocationContext, bad responses and failures are errors."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from statefun import RequestReplyHandler
from statefun.sdk._proto import request_reply_pb2 as pb
from statefun.testing import FunctionFailedError, FunctionHarness, Outcome, SdkProcess
from tests.unit import _testing_fns
from tests.unit._testing_fns import functions

TYPES = [_testing_fns.PROFILE, _testing_fns.REMINDER]


def scenario(h: FunctionHarness) -> list[object]:
    """Everything the kit's tests do to the functions, as values to compare."""
    seen: list[object] = []
    seen.append(h.send("test/counter", "a", "hello", caller="test/client/c"))
    seen.append(h.send("test/counter", "a", "reset"))
    seen.append(h.send("test/reminder", "r", {"days": 3}, typename="test/Reminder"))
    seen.append(h.advance(timedelta(days=1, hours=1)))
    seen.append(h.send("test/reminder", "r", "stop"))
    seen.append(h.pending_delayed())
    seen.append(h.send("test/session", "s", "hit"))
    seen.append(h.send("test/session", "s", {"name": "Ada"}, typename="test/Profile"))
    seen.append(h.advance(timedelta(minutes=29)))
    seen.append(h.send("test/session", "s", "touch"))
    seen.append(h.advance(timedelta(minutes=31)))
    seen.append(h.state("test/session", "s"))
    seen.append(h.send("test/ping", "k", 3))
    seen.append(h.run_until_idle())
    seen.append(h.undelivered)
    seen.append([h.state(t, i) for t, i in [("test/counter", "a"), ("test/reminder", "r")]])
    seen.append([h.state(t, "k") for t in ("test/ping", "test/pong")])
    return seen


def test_embedded_and_remote_give_the_same_outcomes() -> None:
    embedded = scenario(FunctionHarness(functions))
    handler = RequestReplyHandler(functions)
    remote = FunctionHarness(
        remote={t: handler.handle_sync for t in functions.typenames()}, types=TYPES
    )
    assert scenario(remote) == embedded
    assert embedded[-1] == [{"hits": 4}, {"hits": 3}]  # (the scenario did something)


def test_remote_specs_are_learnt_from_the_first_call() -> None:
    handler = RequestReplyHandler(functions)
    h = FunctionHarness(remote={"test/counter": handler.handle_sync})
    with pytest.raises(ValueError, match="tells its specs on its first invocation"):
        h.set_state("test/counter", "a", count=1)
    h.send("test/counter", "a", "x")
    h.set_state("test/counter", "a", count=41)
    assert h.send("test/counter", "a", "y").state == {"count": 42, "last": "y"}


def test_a_remote_failure_and_a_bad_response_are_errors() -> None:
    handler = RequestReplyHandler(functions)
    h = FunctionHarness(remote={"test/fails": handler.handle_sync})
    with pytest.raises(FunctionFailedError, match=r"^function test/fails/z raised KeyError"):
        h.send("test/fails", "z", "boom")

    def garbage(request: bytes) -> bytes:
        return b"\xff\xff"

    h = FunctionHarness(remote={"test/x": garbage})
    with pytest.raises(FunctionFailedError, match="not a FromFunction"):
        h.send("test/x", "1", 1)

    def wrong_state(request: bytes) -> bytes:
        response = pb.FromFunction()
        mutation = response.invocation_result.state_mutations.add(state_name="nope")
        mutation.state_value.typename = "io.statefun.types/int"
        return response.SerializeToString()

    h = FunctionHarness(remote={"test/x": wrong_state})
    with pytest.raises(
        FunctionFailedError, match="changed state 'nope', which it never registered"
    ):
        h.send("test/x", "1", 1)
    assert h.state("test/x", "1") == {}


def test_a_remote_typename_must_not_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="both"):
        FunctionHarness(functions, remote={"test/counter": lambda b: b""})
    assert FunctionHarness(remote={"test/x": lambda b: b""}).send("test/x", "1", 1) == Outcome(
        invocations=1
    )


def test_an_sdk_process_serves_a_registry_over_pipes(tmp_path: Path) -> None:
    """This package's SDK in a child process; tests/compat runs Apache StateFun's SDK so."""
    root = Path(__file__).resolve().parents[2]
    with SdkProcess(sys.executable, "tests.unit._testing_fns:functions", cwd=root) as process:
        assert sorted(process.typenames) == sorted(functions.typenames())
        h = FunctionHarness(remote=process, types=TYPES)
        h.send("test/reminder", "r", {"days": 2}, typename="test/Reminder")
        assert len(h.advance(timedelta(days=3)).egress("test/mail")) == 2
        with pytest.raises(FunctionFailedError, match="KeyError"):
            h.send("test/fails", "z", "boom")
    with pytest.raises(RuntimeError, match="ended"):
        SdkProcess(sys.executable, f"{tmp_path / 'missing.py'}:functions")
