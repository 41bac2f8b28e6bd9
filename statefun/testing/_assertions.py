"""Assertions with readable differences: what was expected, what was there, line by line.

They work with any test runner (an ``AssertionError`` with the differences as its message);
under pytest the plugin also explains a failed ``assert outcome == expected`` the same way.
"""

from __future__ import annotations

import pprint
from dataclasses import fields
from typing import Any

from statefun.testing._harness import FunctionHarness
from statefun.testing._outcome import Outcome

__all__ = ["assert_outcome", "assert_state", "explain_difference"]

_MISSING = object()


def _show(value: Any) -> str:
    return "(absent)" if value is _MISSING else pprint.pformat(value, width=88, sort_dicts=True)


def _dict_lines(expected: dict[Any, Any], actual: dict[Any, Any], what: str) -> list[str]:
    lines: list[str] = []
    for key in sorted(set(expected) | set(actual), key=repr):
        want, got = expected.get(key, _MISSING), actual.get(key, _MISSING)
        if want != got:
            lines.append(f"{what}[{key!r}]: expected {_show(want)}, got {_show(got)}")
    return lines


def _list_lines(expected: list[Any], actual: list[Any], what: str) -> list[str]:
    lines: list[str] = []
    for index in range(max(len(expected), len(actual))):
        want = expected[index] if index < len(expected) else _MISSING
        got = actual[index] if index < len(actual) else _MISSING
        if want != got:
            lines.append(f"{what}[{index}]: expected {_show(want)}, got {_show(got)}")
    if len(expected) != len(actual):
        lines.append(f"{what}: expected {len(expected)} item(s), got {len(actual)}")
    return lines


def explain_difference(expected: Any, actual: Any, what: str = "") -> list[str]:
    """The differences between two outcomes, dicts or lists, one line each ([] if equal)."""
    if isinstance(expected, Outcome) and isinstance(actual, Outcome):
        lines: list[str] = []
        for f in fields(Outcome):
            lines.extend(
                explain_difference(getattr(expected, f.name), getattr(actual, f.name), f.name)
            )
        return lines
    if isinstance(expected, dict) and isinstance(actual, dict):
        return _dict_lines(expected, actual, what or "state")
    if isinstance(expected, list) and isinstance(actual, list):
        return _list_lines(expected, actual, what or "list")
    if expected != actual:
        return [f"{what or 'value'}: expected {_show(expected)}, got {_show(actual)}"]
    return []


def assert_outcome(actual: Outcome, **expected: Any) -> None:
    """Check the named parts of ``actual`` (``messages=[...]``, ``egress_records=[...]``,
    ``states={...}``, ``reply=...``, ...); the ones not named are not checked."""
    lines: list[str] = []
    for name, want in expected.items():
        if not hasattr(actual, name):
            raise TypeError(f"an Outcome has no {name!r}")
        lines.extend(explain_difference(want, getattr(actual, name), name))
    if lines:
        raise AssertionError("the outcome differs:\n  " + "\n  ".join(lines))


def assert_state(
    harness: FunctionHarness, typename: str, id: str, expected: dict[str, Any]
) -> None:
    """Check that ``typename``/``id`` holds exactly ``expected`` now."""
    lines = explain_difference(expected, harness.state(typename, id), "state")
    if lines:
        raise AssertionError(f"the state of {typename}/{id} differs:\n  " + "\n  ".join(lines))
