"""Fuzzing the module loader: any text, any YAML, valid module files with parts changed.

Whatever the input, ``load_module_text`` returns a module or raises a ConfigurationError
(ModuleError) whose message is one line; never another exception. Bounded by the ``ci``
profile (tests/_fuzz.py); docs/fuzzing.md has the longer run.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from statefun._exceptions import ConfigurationError
from statefun.module import load_module_text

ROOT = Path(__file__).resolve().parents[2]
VALID_FILES = sorted(
    [*(ROOT / "tests/unit/data/modules").glob("*.yaml"), *(ROOT / "examples").glob("*/module.yaml")]
)
VALID_TEXTS = [path.read_text() for path in VALID_FILES]
VALID_DOCUMENTS = [
    document for text in VALID_TEXTS for document in yaml.safe_load_all(text) if document
]


def loads_or_fails_in_one_line(text: str) -> None:
    try:
        load_module_text(text, "fuzz.yaml", base_dir="/nonexistent")
    except ConfigurationError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)
        assert message.startswith("fuzz.yaml"), message


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(["10s", "0", "-1", "99999", "http://x:99999/f", "a/b", "a/*", "*/x", ""]),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.text(max_size=400))
@example("kind: [")
@example("\t")
@example("%YAML 9.9\n---\n")
@example("!!python/object:os.system ls")
@example("a: &x [*x]")
def test_any_text(text: str) -> None:
    loads_or_fails_in_one_line(text)


@given(st.lists(yaml_values, max_size=3))
def test_any_yaml_documents(documents: list[Any]) -> None:
    loads_or_fails_in_one_line(yaml.safe_dump_all(documents))


@given(st.lists(st.fixed_dictionaries({"kind": st.text(max_size=40), "spec": yaml_values})))
def test_any_component(documents: list[Any]) -> None:
    loads_or_fails_in_one_line(yaml.safe_dump_all(documents))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a YAML document (keys and list indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*prefix, index)))
    return found


@given(st.sampled_from(VALID_DOCUMENTS), st.data())
def test_valid_components_with_a_value_changed(document: Any, data: st.DataObject) -> None:
    """A valid document with values replaced, fields deleted or added, at any depth."""
    document = copy.deepcopy(document)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(document)
        path = data.draw(st.sampled_from(paths))
        if not path:
            document = data.draw(yaml_values)
            continue
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(yaml_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=12))] = data.draw(yaml_values)
        else:
            parent.append(data.draw(yaml_values))
        if not isinstance(document, dict | list):
            break
    loads_or_fails_in_one_line(yaml.safe_dump_all([document]))


@given(st.sampled_from(VALID_TEXTS), st.data())
def test_valid_files_with_text_changed(text: str, data: st.DataObject) -> None:
    """A valid file with characters or lines cut, repeated or changed."""
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["cut", "insert", "repeat-line", "drop-line"]))
        if action == "cut":
            text = text[:where] + text[where + data.draw(st.integers(1, 10)) :]
        elif action == "insert":
            text = text[:where] + data.draw(st.text(max_size=6)) + text[where:]
        else:
            lines = text.splitlines(keepends=True)
            if not lines:
                continue
            index = data.draw(st.integers(0, len(lines) - 1))
            lines[index : index + 1] = [lines[index]] * (2 if action == "repeat-line" else 0)
            text = "".join(lines)
    loads_or_fails_in_one_line(text)


# -- what the fuzzer found (each failed before the fix) -----------------------------------


def test_a_character_yaml_refuses_is_one_line_with_its_position() -> None:
    """Found by test_any_text: PyYAML's ReaderError spans two lines."""
    with pytest.raises(ConfigurationError) as caught:
        load_module_text("kind: a\nspec: \x1f", "fuzz.yaml")
    assert str(caught.value) == (
        "fuzz.yaml, line 2, column 7: invalid YAML: character U+001F is not allowed"
    )


def test_a_kind_with_a_newline_is_shown_escaped_on_one_line() -> None:
    """Found by test_any_component: the unknown kind went raw into the message's prefix."""
    with pytest.raises(ConfigurationError) as caught:
        load_module_text(yaml.safe_dump_all([{"kind": "\n", "spec": []}]), "fuzz.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("fuzz.yaml, document 1 (\\n): kind: unknown kind '\\n'")


def test_yaml_nested_too_deeply_is_one_line() -> None:
    """Found by probing past the fuzzer's sizes: PyYAML's composer recursed until Python's
    RecursionError, which went out as a traceback."""
    with pytest.raises(ConfigurationError) as caught:
        load_module_text("kind: " + "[" * 5000 + "]" * 5000, "deep.yaml")
    assert str(caught.value) == "deep.yaml: invalid YAML: nested too deeply"
