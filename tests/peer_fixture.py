"""Session fixtures: python executables of virtualenvs holding peer StateFun SDKs.

Built once (and cached across sessions) by ``statefun._testing.peers``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statefun._testing.peers import ensure_peer_venv


@pytest.fixture(scope="session")
def official_sdk_python() -> Path:
    """Python of a virtualenv with the official ``apache-flink-statefun==3.3.0``."""
    return ensure_peer_venv("statefun-3.3.0")


@pytest.fixture(scope="session")
def fork_sdk_python() -> Path:
    """Python of a virtualenv with ``flink-statefun==3.5.0`` (a fork on current protobuf)."""
    return ensure_peer_venv("flink-statefun-3.5.0")
