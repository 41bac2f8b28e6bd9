"""The Kafka ingress of a clustered job: its partitions assigned by the job's group.

The worker's one consumer (``_membership.py``) subscribes to the ingress topics beside the
exchange, so Kafka's group assigns input partitions to workers as it assigns key groups. The
records of an input partition come to ``ClusteredKafkaSource`` and are routed exactly as the
single-process Kafka ingress routes them (``KafkaSource._route_all``: runs through
``emit_many``, invalid records to the dead letters, each partition's position moved in the step
that emits its record); the positions commit in the worker's transaction with the rest of the
checkpoint, to the job's group (the ingress's own ``consumerGroupId`` is not used).
"""

from __future__ import annotations

import asyncio
from typing import Any

from statefun.ingress.base import IngressContext
from statefun.ingress.kafka import KafkaSource
from statefun.module._specs import KafkaIngressSpec

__all__ = ["ClusteredKafkaSource"]

#: polls of input records the loop may hold before the consumer thread waits
_QUEUED_POLLS = 2


class ClusteredKafkaSource(KafkaSource):
    """A Kafka ingress fed by the worker's group member instead of a consumer of its own."""

    def __init__(self, spec: KafkaIngressSpec) -> None:
        super().__init__(
            spec.id,
            spec.address,
            spec.topics,
            auto_offset_reset=spec.auto_offset_reset,
            properties=spec.properties,
        )
        self.queue: asyncio.Queue[list[Any]] = asyncio.Queue(_QUEUED_POLLS)

    async def start(self) -> None:
        pass

    async def run(self, context: IngressContext) -> None:
        routes = self._routes(context)
        while True:
            await self._route_all(await self.queue.get(), routes, context)

    def start_at(self, positions: dict[tuple[str, int], int]) -> None:
        """Where this epoch's input partitions start (until a record is routed)."""
        self._positions.update((k, o) for k, o in positions.items() if k[0] in self.topics)

    def positions(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset after the last record routed."""
        return dict(self._positions)

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass  # the offsets committed with the worker's transaction
