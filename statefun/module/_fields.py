"""Reading one module.yaml document: where it is (``Doc``), its fields one by one (``Fields``).

The loader (``_loader.py``) and every connector kind's parser (``statefun.connectors``) read
their ``spec`` through ``Fields``: a field that is missing or of the wrong type is a
``ModuleError`` of one line naming the file, the document, its kind and the field; a field
nobody asked for is an error in a strict (``io.pystatefun.*``) kind and a warning in one of
StateFun's, which ignores unknown fields too.
"""

from __future__ import annotations

import difflib
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from statefun._exceptions import ModuleError
from statefun.module._durations import DURATION_EXAMPLE, parse_duration

__all__ = [
    "MISSING",
    "TYPENAME",
    "Doc",
    "Fields",
    "check_typename",
    "delivery_semantic",
    "file_path",
    "one_line",
    "show",
]

_log = logging.getLogger("statefun.module._loader")  # (the loader's warnings, one logger)

MISSING: Any = object()
TYPENAME = "a typename 'namespace/name'"

_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def one_line(text: str) -> str:
    """``text`` with control characters (a newline in a key or a file name) escaped."""
    return text.translate(_CONTROL)


def show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class Doc:
    """One document of one file: where errors happened, and what relative paths start from."""

    def __init__(self, file: str, number: int, base_dir: Path, kind: str | None = None) -> None:
        self.file, self.number, self.base_dir, self.kind = file, number, base_dir, kind

    @property
    def source(self) -> str:
        where = f"{self.file}, document {self.number}"
        return f"{where} ({self.kind})" if self.kind else where

    def error(self, path: str, message: str) -> ModuleError:
        return ModuleError(
            one_line(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")
        )


class Fields:
    """A YAML mapping read field by field; ``done()`` reports the fields nobody asked for."""

    def __init__(self, doc: Doc, value: object, path: str, *, strict: bool) -> None:
        if not isinstance(value, dict):
            raise doc.error(path, f"expected a mapping, got {show(value)}")
        self.doc, self.path, self.strict = doc, path, strict
        self.data = {str(k): v for k, v in value.items()}
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> ModuleError:
        return self.doc.error(self.at(key), message)

    def raw(self, key: str, expected: str, default: Any = MISSING) -> Any:
        self.seen.add(key)
        value = self.data.get(key)
        if value is None:
            if default is MISSING:
                close = difflib.get_close_matches(key, [k for k in self.data if k not in self.seen])
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(key, f"missing; expected {expected}{hint}")
            return default
        return value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, expected: str = "a string", default: Any = MISSING) -> Any:
        value = self.raw(key, expected, default)
        if value is default:
            return value
        if not self.strict and isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # StateFun reads a number's text where it wants a string
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected {expected}, got {show(value)}")
        return value

    def integer(
        self, key: str, default: Any = MISSING, *, low: int = 1, high: int = 2**31 - 1
    ) -> Any:
        expected = f"an integer from {low} to {high}"
        value = self.raw(key, expected, default)
        if value is default:
            return value
        if not self.strict and isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(key, f"expected {expected}, got {show(value)}")
        return value

    def duration(self, key: str, default: Any = MISSING, *, positive: bool = True) -> Any:
        value = self.raw(key, DURATION_EXAMPLE, default)
        if value is default:
            return value
        try:
            duration = parse_duration(value)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        if positive and not duration:
            raise self.fail(key, f"expected a duration longer than 0, got {value!r}")
        return duration

    def typename(self, key: str, default: Any = MISSING) -> Any:
        value = self.string(key, TYPENAME, default)
        return value if value is default else check_typename(self.doc, self.at(key), value)

    def mapping(self, key: str, default: Any = MISSING) -> Any:
        value = self.raw(key, "a mapping", default)
        return (
            value if value is default else Fields(self.doc, value, self.at(key), strict=self.strict)
        )

    def sequence(self, key: str, expected: str, default: Any = MISSING) -> Any:
        value = self.raw(key, expected, default)
        if value is not default and not isinstance(value, list):
            raise self.fail(key, f"expected {expected}, got {show(value)}")
        return value

    def done(self) -> None:
        for key in sorted(set(self.data) - self.seen):
            if self.strict:
                known = ", ".join(sorted(self.seen))
                raise self.fail(key, f"unknown field; expected one of: {known}")
            _log.warning(
                "%s: %s: field ignored (StateFun ignores it too)", self.doc.source, self.at(key)
            )


def check_typename(doc: Doc, path: str, text: str, *, wildcard: bool = False) -> str:
    """Check StateFun's typename rule: exactly one '/', text on both sides."""
    namespace, sep, name = text.partition("/")
    bad_star = "*" in namespace or ("*" in name and (name != "*" or not wildcard))
    if not sep or not namespace or not name or "/" in name or bad_star:
        expected = f"{TYPENAME} or 'namespace/*'" if wildcard else TYPENAME
        raise doc.error(path, f"expected {expected}, got {text!r}")
    return text


def delivery_semantic(
    spec: Fields, semantics: tuple[str, ...], default: str, *, needs_timeout: bool
) -> tuple[str, timedelta | None]:
    """``deliverySemantic`` as a string (``exactly-once``) or as StateFun's mapping
    (``{type: exactly-once, transactionTimeout: 15min}``): the semantic and the transaction
    timeout, if one was given (with ``needs_timeout``, exactly-once in a mapping needs one)."""
    expected = "one of " + ", ".join(semantics)
    if not isinstance(spec.data.get("deliverySemantic"), dict):
        semantic = spec.string("deliverySemantic", f"{expected} or a mapping with type", default)
        if semantic not in semantics:
            raise spec.fail("deliverySemantic", f"expected {expected}; got {semantic!r}")
        return semantic, None
    delivery = spec.mapping("deliverySemantic")
    semantic = delivery.string("type", expected)
    if semantic not in semantics:
        raise delivery.fail("type", f"expected {expected}; got {semantic!r}")
    timeout = None
    # The old millisecond field wins, as in StateFun.
    key = "transactionTimeoutMillis" if delivery.has("transactionTimeoutMillis") else None
    key = key or ("transactionTimeout" if delivery.has("transactionTimeout") else None)
    if semantic == "exactly-once" and (key or needs_timeout):
        timeout = delivery.duration(key or "transactionTimeout")
    delivery.seen.update(("transactionTimeout", "transactionTimeoutMillis"))
    delivery.done()
    return semantic, timeout


def file_path(spec: Fields) -> Path:
    """``spec.path``, relative to the folder of the module file."""
    return spec.doc.base_dir / Path(spec.string("path", "a file path")).expanduser()
