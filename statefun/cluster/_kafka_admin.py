"""kafka-python's admin client for a clustered job's cluster, or one line saying it is not
reachable."""

from __future__ import annotations

from typing import Any

from statefun._exceptions import UnavailableError
from statefun._kafka import import_kafka
from statefun.cluster._config import ClusterConfig

__all__ = ["open_admin"]


def open_admin(config: ClusterConfig, client_id: str) -> Any:
    """A ``KafkaAdminClient`` (blocking; close it), or ``UnavailableError`` naming the servers."""
    kafka = import_kafka()
    try:
        return kafka.KafkaAdminClient(
            bootstrap_servers=config.bootstrap_servers, client_id=client_id
        )
    except kafka.errors.KafkaError as exc:
        raise UnavailableError(
            f"cluster: cannot reach Kafka at {config.bootstrap_servers}: {exc}"
        ) from exc
