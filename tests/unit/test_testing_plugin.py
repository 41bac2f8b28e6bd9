"""The pytest plugin of statefun.testing, as a user's pytest loads it (its pytest11 entry
point), in a pytest process of its own; and the assertion helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from statefun.testing import FunctionHarness, Sent, assert_outcome, assert_state
from tests.unit._testing_fns import functions

ROOT = Path(__file__).resolve().parents[2]

USER_TEST = """
from statefun.testing import Outcome, Sent
from tests.unit._testing_fns import functions
from tests.unit.test_testing_job_harness import EMBEDDED


def test_fixture(statefun_harness):
    h = statefun_harness(functions)
    h.send("test/counter", "a", "x")
    assert h.state("test/counter", "a") == {"count": 1, "last": "x"}


def test_job_fixture(statefun_job, tmp_path):
    (tmp_path / "module.yaml").write_text(EMBEDDED)
    job = statefun_job(tmp_path / "module.yaml")
    job.send("test/counter", "a", "x")
    job.run_until_idle()
    assert job.state("test/counter", "a") == {"count": 1, "last": "x"}


def test_outcomes_differ(statefun_harness):
    h = statefun_harness(functions)
    out = h.send("test/ping", "k", 2)
    assert out == Outcome(messages=[Sent("test/pong", "k", 5)], invocations=1)
"""


def test_the_plugin_gives_the_fixture_and_explains_outcome_differences(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    out = done.stdout
    assert "1 failed, 2 passed" in out, out + done.stderr
    assert "the outcomes differ (expected: right side):" in out, out
    assert (
        "messages[0]: expected Sent(typename='test/pong', id='k', value=5), "
        "got Sent(typename='test/pong', id='k', value=1)" in out
    ), out
    assert "states[('test/ping', 'k')]: expected (absent), got {'hits': 1}" in out, out


def test_assert_state_lists_each_difference() -> None:
    h = FunctionHarness(functions)
    h.send("test/counter", "a", "x")
    assert_state(h, "test/counter", "a", {"count": 1, "last": "x"})
    with pytest.raises(AssertionError) as caught:
        assert_state(h, "test/counter", "a", {"count": 2, "extra": True})
    assert str(caught.value).splitlines() == [
        "the state of test/counter/a differs:",
        "  state['count']: expected 2, got 1",
        "  state['extra']: expected True, got (absent)",
        "  state['last']: expected (absent), got 'x'",
    ]


def test_assert_outcome_checks_the_named_parts_only() -> None:
    h = FunctionHarness(functions)
    out = h.send("test/ping", "k", 1)
    assert_outcome(out, messages=[Sent("test/pong", "k", 0)])
    with pytest.raises(AssertionError) as caught:
        assert_outcome(out, messages=[], reply=3)
    assert str(caught.value).splitlines() == [
        "the outcome differs:",
        "  messages[0]: expected (absent), got Sent(typename='test/pong', id='k', value=0)",
        "  messages: expected 0 item(s), got 1",
        "  reply: expected 3, got None",
    ]
    with pytest.raises(TypeError, match="no 'nothing'"):
        assert_outcome(out, nothing=1)
