"""Shared fixtures. Real services (Kafka broker, peer SDK virtualenvs) start once per session
(once per worker of a parallel run)."""

from __future__ import annotations

from typing import Any

import pytest

import tests._fuzz  # noqa: F401  (registers the Hypothesis profiles)
from tests.kafka_fixture import bootstrap, kafka_broker
from tests.peer_fixture import fork_sdk_python, official_sdk_python

__all__ = ["bootstrap", "fork_sdk_python", "kafka_broker", "official_sdk_python"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``pytest -n N`` (``--dist load``, xdist's default): see ``tests._parallel``."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # another distribution asked for by name
    from tests._parallel import OneWorkerModules

    return OneWorkerModules(config, log)
