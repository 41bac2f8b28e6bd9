"""The kafka-python range of pyproject.toml is the one the Kafka fast paths are written for.

The fast paths (the ingress's batch reader, the egress's bulk appends) use private parts of
kafka-python 3.0.x and turn themselves off on any other version; their fallbacks are run
against a real broker in tests/integration/test_kafka_fetch.py and test_kafka_append.py.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from statefun._kafka import import_kafka, internals_unsupported

ROOT = Path(__file__).resolve().parents[2]
kafka = import_kafka()


def pinned() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(
        Requirement(d) for d in project["dependencies"] if Requirement(d).name == "kafka-python"
    )


def test_the_installed_kafka_python_is_in_the_range_and_its_internals_are_there() -> None:
    assert importlib.metadata.version("kafka-python") in pinned().specifier
    assert (
        internals_unsupported("the fast paths", [("KafkaProducer.", kafka.KafkaProducer, ())])
        is None
    )


def test_the_range_ends_where_the_fast_paths_stop() -> None:
    specifier = pinned().specifier
    assert "3.0.99" in specifier
    assert "3.1.0" not in specifier


def test_another_version_turns_the_fast_paths_off(monkeypatch: Any) -> None:
    monkeypatch.setattr(kafka, "__version__", "3.1.0")
    assert internals_unsupported("bulk appends", []) == (
        "kafka-python 3.1.0 (bulk appends is written for 3.0)"
    )


def test_a_missing_internal_turns_them_off() -> None:
    assert internals_unsupported("x", [("KafkaProducer.", kafka.KafkaProducer, ["_nope"])]) == (
        "kafka-python has no KafkaProducer._nope"
    )
