"""Checkpoints, recovery and savepoints (see coordinator.py for the protocol, recovery.py for
restoring, verify.py for checking them).

The names below are imported on first use, so that ``statefun checkpoint verify`` does not load
the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statefun.checkpoint.coordinator import CheckpointCoordinator, SimulatedCrash
    from statefun.checkpoint.recovery import restore, restore_latest
    from statefun.checkpoint.storage import (
        CheckpointStorage,
        CompletedCheckpoint,
        read_checkpoint,
    )

__all__ = [
    "CheckpointCoordinator",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "SimulatedCrash",
    "read_checkpoint",
    "restore",
    "restore_latest",
]

_MODULES = {
    "CheckpointCoordinator": "coordinator",
    "SimulatedCrash": "coordinator",
    "restore": "recovery",
    "restore_latest": "recovery",
    "CheckpointStorage": "storage",
    "CompletedCheckpoint": "storage",
    "read_checkpoint": "storage",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
