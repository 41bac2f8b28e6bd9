"""A worker's checkpoint commits only as a member of its assignment's generation.

The broker fences a transaction's offsets by the group metadata they carry (KIP-447), but it
checks nothing when that metadata has no generation and no member id, which is what a
kafka-python consumer holds once the group dropped it. A checkpoint cut then would commit
output for partitions another worker already replays: the epoch refuses it before it cuts
anything. (The lost partitions themselves take another path: ``Membership`` on a real broker
in tests/integration/test_cluster_membership.py.)
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from statefun._kafka import import_kafka
from statefun.cluster._worker import Epoch
from tests.unit._cluster import small_config

kafka = import_kafka()


class _Untouched:
    """What the refused checkpoint must not reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the checkpoint went on to {name}")


def _epoch(generation: int, metadata: Any) -> Epoch:
    epoch = object.__new__(Epoch)  # the fields a checkpoint reads before its cut
    epoch.job = SimpleNamespace(failed=False)
    epoch.source = object()
    epoch._lock = asyncio.Lock()
    epoch.config = small_config()
    epoch.generation = generation
    epoch.membership = SimpleNamespace(group_metadata=lambda: metadata)
    epoch.transactions = _Untouched()
    epoch.state = _Untouched()
    epoch._forwarders = []
    epoch.outbound = _Untouched()  # (the first thing a cut touches: its exchange messages)
    return epoch


@pytest.mark.parametrize(
    "metadata",
    [
        kafka.ConsumerGroupMetadata("pystatefun.unit"),  # dropped: no generation, no member
        kafka.ConsumerGroupMetadata("pystatefun.unit", 8, "member-1"),  # a later generation
        kafka.ConsumerGroupMetadata("pystatefun.unit", 7, ""),  # the member id cleared
    ],
    ids=["dropped", "later-generation", "no-member-id"],
)
async def test_a_checkpoint_outside_the_assignments_generation_is_refused(metadata: Any) -> None:
    epoch = _epoch(7, metadata)
    with pytest.raises(kafka.errors.CommitFailedError, match="not at this assignment's 7"):
        await epoch.checkpoint()


async def test_a_checkpoint_in_the_assignments_generation_goes_on_to_its_cut() -> None:
    epoch = _epoch(7, kafka.ConsumerGroupMetadata("pystatefun.unit", 7, "member-1"))
    with pytest.raises(AssertionError, match="the checkpoint went on to flush"):
        await epoch.checkpoint()
