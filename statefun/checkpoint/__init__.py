"""Checkpoints, recovery and savepoints (see coordinator.py for the protocol)."""

from statefun.checkpoint.coordinator import CheckpointCoordinator, SimulatedCrash, restore
from statefun.checkpoint.storage import CheckpointStorage, CompletedCheckpoint, read_checkpoint

__all__ = [
    "CheckpointCoordinator",
    "CheckpointStorage",
    "CompletedCheckpoint",
    "SimulatedCrash",
    "read_checkpoint",
    "restore",
]
